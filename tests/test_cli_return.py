"""`gpuheal return` (gpuheal/cli/returning.py): what it does in Slurm and what it tells the
operator on each path, Slurm's failures included (a resume that fails leaves the node drained,
and the coordinator counting it: the command must say so, never claim a return it did not make).
Slurm is a stand-in here for its answers and failures; tests/integration/test_fleet.py runs the
command against the real daemons."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest

from gpuheal.cli import returning
from gpuheal.clients.slurm import SlurmError
from gpuheal.core import policy
from gpuheal.core.models.slurm import NodeInfo
from gpuheal.core.settings import Settings

MINE = policy.drain_reason("gpuheal-c-gpu01", "XID 79")


class Slurm:
    """Answers `node` with `reason` (None: in service); each of `fail` is raised once, by the call
    it names ("read1", "read2": the first and second read; "resume")."""

    def __init__(self, reason: str | None, fail: dict[str, BaseException] | None = None, lands: bool = False) -> None:
        self.reason, self.fail, self.resumed = reason, dict(fail or {}), 0
        self.reads = 0
        self.lands = lands  # a failed resume that Slurm made all the same (its answer timed out)

    async def node(self, name: str) -> NodeInfo:
        self.reads += 1
        if (err := self.fail.pop(f"read{self.reads}", None)) is not None:
            raise err
        if self.reason is None:
            return NodeInfo(name=name, state="idle")
        return NodeInfo(name=name, state="drained", flags=("DRAIN",), reason=self.reason)

    async def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        assert state == "resume"
        if (err := self.fail.pop("resume", None)) is not None:
            if self.lands:
                self.reason = None
            raise err
        self.resumed += 1
        self.reason = None


def run(monkeypatch: pytest.MonkeyPatch, slurm: Slurm, incident_stage: str | None = None) -> tuple[int, list[str]]:
    """The command against `slurm`; the node's incident open at `incident_stage` (None: closed)."""
    told: list[str] = []

    async def stage(settings: Settings, incident: str) -> str | None:
        assert incident == "gpuheal-c-gpu01"
        return incident_stage

    async def update(settings: Settings, update: Any, arg: Any) -> int:
        told.append(arg.node)
        return 0

    monkeypatch.setattr(returning, "build_slurm", lambda _: slurm)
    monkeypatch.setattr(returning, "_update", update)
    monkeypatch.setattr(returning, "_open", stage)
    args = argparse.Namespace(node="gpu01", operator="olga", reason="checked", force=False)
    code = asyncio.run(returning.return_node(Settings.from_env({"GPUHEAL_CLUSTER": "c"}), args))
    return code, told


def test_a_node_left_drained_is_told_then_resumed(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    slurm = Slurm(MINE)
    assert run(monkeypatch, slurm) == (0, ["gpu01"]) and slurm.resumed == 1
    assert "gpu01 resumed in Slurm" in capsys.readouterr().out


def test_a_resume_slurm_refuses_is_said_and_fails(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    slurm = Slurm(MINE, {"resume": SlurmError("scontrol update failed (exit 1): Invalid node state")})
    assert run(monkeypatch, slurm) == (1, ["gpu01"]) and slurm.reason == MINE
    err = capsys.readouterr().err
    assert "gpu01 not resumed: scontrol update failed" in err and "run this again" in err


def test_a_resume_whose_answer_timed_out_is_read_again(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """The clients raise their timeouts as SlurmErrors; Slurm may have made the resume all the same."""
    timed_out = SlurmError("scontrol update nodename=gpu01 state=resume timed out after 20 s")
    slurm = Slurm(MINE, {"resume": timed_out}, lands=True)
    assert run(monkeypatch, slurm) == (0, ["gpu01"])
    assert "gpu01 resumed in Slurm (its answer was lost" in capsys.readouterr().out


def test_slurm_not_answering_after_the_update_is_said_as_unknown(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    timed_out = SlurmError("sinfo timed out after 20 s")
    slurm = Slurm(MINE, {"read2": timed_out, "read3": timed_out})
    assert run(monkeypatch, slurm) == (1, ["gpu01"]) and slurm.resumed == 0
    assert "Slurm did not answer" in capsys.readouterr().err


def test_slurm_not_answering_before_changes_nothing(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    slurm = Slurm(MINE, {"read1": SlurmError("Unable to contact slurm controller")})
    assert run(monkeypatch, slurm) == (1, []), "the coordinator is not told, Slurm not touched"
    assert "nothing done" in capsys.readouterr().err


def test_someone_elses_drain_is_refused_before_anything(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    slurm = Slurm("ops: fan swap")
    assert run(monkeypatch, slurm) == (1, []) and slurm.resumed == 0
    assert "drained by someone else" in capsys.readouterr().err


def test_a_drain_changed_meanwhile_is_not_resumed(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    slurm = Slurm(MINE)
    original = slurm.node

    async def changed(name: str) -> NodeInfo:
        found = await original(name)
        if slurm.reads == 2:
            return found.model_copy(update={"reason": "ops: taken for the vendor"})
        return found

    slurm.node = changed  # type: ignore[method-assign]
    assert run(monkeypatch, slurm) == (1, ["gpu01"]) and slurm.resumed == 0
    assert "drain changed meanwhile" in capsys.readouterr().err


def test_a_node_in_service_is_only_told(monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = Slurm(None)
    assert run(monkeypatch, slurm) == (0, ["gpu01"]) and slurm.resumed == 0


def test_a_node_whose_incident_is_open_is_refused_whatever_the_books(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A recreated coordinator's books may count an open incident's node as left (issue 37's hour
    returned two): the incident itself, read from Temporal, says it holds the node."""
    slurm = Slurm(MINE)
    assert run(monkeypatch, slurm, incident_stage="awaiting_capacity") == (1, []) and slurm.resumed == 0
    assert "its incident gpuheal-c-gpu01 is open (awaiting_capacity)" in capsys.readouterr().err
