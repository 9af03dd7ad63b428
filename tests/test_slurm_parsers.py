"""Slurm's JSON, as three releases really print it (tests/data/slurm/<version>/, captured by
tests/data/slurm/capture.sh from the real daemons), read into the project's models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clients.slurm.base import UnknownSchema
from clients.slurm.hostlist import expand
from clients.slurm.parsers import parse_jobs, parse_nodes, schema_of

DATA = Path(__file__).parent / "data" / "slurm"
VERSIONS = {"22.05": "v0.0.38", "24.11": "v0.0.42", "26.05": "v0.0.45"}


def load(version: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / version / f"{name}.json").read_text())
    return data


@pytest.mark.parametrize("version", VERSIONS)
def test_the_schema_is_named_by_each_release(version: str) -> None:
    assert schema_of(load(version, "squeue-jobs")) == VERSIONS[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_nodes_and_a_drain_with_its_reason(version: str) -> None:
    idle = parse_nodes(load(version, "sinfo-empty"))
    assert sorted(idle) == ["gpu01", "gpu02", "gpu03"]
    assert {n.state for n in idle.values()} == {"idle"} and not any(n.drained for n in idle.values())
    drained = parse_nodes(load(version, "sinfo-drain"))
    assert drained["gpu02"].drained and drained["gpu02"].reason == "gpuheal-c-gpu02: XID 79"
    assert drained["gpu02"].state == "allocated"  # draining: busy with DRAIN, not yet drained
    assert not drained["gpu01"].drained


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_scontrol_and_slurmrestd_nodes_read_alike(version: str) -> None:
    assert sorted(parse_nodes(load(version, "scontrol-nodes"))) == ["gpu01", "gpu02", "gpu03"]
    rest = parse_nodes(load(version, "rest-nodes"))
    assert rest["gpu02"].drained and rest["gpu02"].reason == "x: y"
    assert parse_nodes(load(version, "rest-node-nosuch")) == {}  # FUTURE or unknown: nodes null


@pytest.mark.parametrize("version", VERSIONS)
def test_jobs_with_their_progress_requeue_flag_and_nodes(version: str) -> None:
    jobs = {j.name: j for j in parse_jobs(load(version, "squeue-jobs"))}
    single, noreq, twonode, held = jobs["single"], jobs["noreq"], jobs["twonode"], jobs["held"]
    assert (single.state, single.nodes, single.node_count, single.requeueable) == ("RUNNING", "gpu01", 1, True)
    assert single.progress is not None and (single.progress.step, single.progress.checkpoint_step) == (3, 2)
    assert single.required_nodes == "gpu01" and single.user == "root"
    assert not noreq.requeueable and noreq.excluded_nodes == "gpu01"
    assert twonode.node_count == 2 and expand(twonode.nodes) == ["gpu01", "gpu02"]
    assert (held.state, held.state_reason) == ("PENDING", "JobHeldUser")
    if version != "22.05":  # 22.05 does not report --mail-user
        assert single.mail_user == "ops@example.com"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_requeued_job_waits_with_a_higher_restart_count(version: str) -> None:
    single = next(j for j in parse_jobs(load(version, "squeue-requeued")) if j.name == "single")
    assert (single.state, single.state_reason, single.restart_count) == ("PENDING", "BeginTime", 1)


def test_an_unknown_schema_is_refused_and_named() -> None:
    data = load("26.05", "squeue-jobs")
    data["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.46"
    with pytest.raises(UnknownSchema, match=r"Slurm 26\.05\.\d+ answered with JSON schema 'data_parser/v0.0.46'"):
        parse_jobs(data)
    with pytest.raises(UnknownSchema, match="none named"):
        parse_nodes({"nodes": []})


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b[1-2],a", ["a", "b1", "b2"]),
        ("", []),
    ],
)
def test_hostlists_expand_as_slurm_does(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize("bad", ["gpu[01-03", "gpu01]", "gpu[3-1]", "gpu[a-b]"])
def test_a_malformed_hostlist_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        expand(bad)
