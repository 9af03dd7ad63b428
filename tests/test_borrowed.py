"""The coordinator's give-back of borrowed nodes whose run crashed out (activities/borrowed.py),
against a Kubernetes and a Slurm as they answer: which Slurm node a Node is, drained before it
goes, never while a job runs there, never one whose Slurm name cannot be told. (On the real
apiserver and Slurm: tests/integration/test_replacements.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from gpuheal.activities import borrowed
from gpuheal.activities.borrowed import BorrowedNodes
from gpuheal.activities.borrowing import BORROWED_BY, BORROWED_FROM, BORROWED_RUN, INCIDENT_ANNOTATION
from gpuheal.clients.kube import POOL_LABEL
from gpuheal.core.models.slurm import NodeInfo

LABEL = "gpuheal.io/slurm-node"  # GPUHEAL_K8S_NODE_LABEL: on Slinky the Slurm name is not the Node's


def node(name: str, run: str, slurm_name: str | None) -> Any:
    labels = {BORROWED_BY: "gpuheal-c-gpu01", POOL_LABEL: "h100", **({LABEL: slurm_name} if slurm_name else {})}
    annotations = {INCIDENT_ANNOTATION: "gpuheal-c-gpu01", BORROWED_RUN: run, BORROWED_FROM: "inference"}
    return SimpleNamespace(metadata=SimpleNamespace(name=name, labels=labels, annotations=annotations))


class Core:
    def __init__(self, *nodes: Any) -> None:
        self.nodes, self.patched = list(nodes), list[str]()

    def list_node(self, label_selector: str, **_: Any) -> Any:
        return SimpleNamespace(items=self.nodes)

    def patch_node(self, name: str, body: Any, **_: Any) -> None:
        self.patched.append(name)


class Slurm:
    def __init__(self, jobs: dict[str, list[int]]) -> None:
        self.jobs, self.drained = jobs, list[str]()

    async def nodes(self) -> dict[str, NodeInfo]:
        return {n: NodeInfo(name=n, state="mixed" if j else "idle") for n, j in self.jobs.items()}

    async def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        self.drained.append(name)

    async def jobs_on_node(self, name: str) -> list[int]:
        return self.jobs[name]


@pytest.fixture(autouse=True)
def crashed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run_crashed_out(client: Any, incident: str, run: str | None, asker: str) -> bool:
        return run == "crashed"

    monkeypatch.setattr(borrowed.runs, "run_crashed_out", run_crashed_out)


async def give_back(core: Core, slurm: Slurm) -> Any:
    reaper = BorrowedNodes(slurm, None, LABEL)  # type: ignore[arg-type]
    reaper._core = core  # type: ignore[assignment]
    env = ActivityEnvironment(client=SimpleNamespace())  # type: ignore[arg-type]  (the fake run status needs none)
    return await env.run(reaper.give_back_borrowed_of_ended_runs, "c")


async def test_the_slurm_node_is_the_one_the_label_names_and_its_job_is_never_killed() -> None:
    core, slurm = Core(node("k8s-a", "crashed", "gpu05")), Slurm({"gpu05": [7], "k8s-a": []})
    first = await give_back(core, slurm)
    assert (first.given_back, first.waiting) == ((), ("k8s-a",))
    assert slurm.drained == ["gpu05"] and core.patched == []  # drained by its Slurm name; not relabelled
    slurm.jobs["gpu05"] = []
    second = await give_back(core, slurm)
    assert second.given_back == ("k8s-a",) and core.patched == ["k8s-a"]


async def test_a_node_whose_slurm_name_cannot_be_told_waits() -> None:
    """With the label configured but absent, "not in Slurm" could be a wrong name: never taken
    for "none runs there"."""
    core, slurm = Core(node("k8s-b", "crashed", None)), Slurm({})
    back = await give_back(core, slurm)
    assert (back.given_back, back.waiting) == ((), ("k8s-b",)) and core.patched == [] and slurm.drained == []


async def test_a_node_of_a_run_still_open_or_completed_is_left_alone() -> None:
    core, slurm = Core(node("k8s-c", "open", "gpu06")), Slurm({"gpu06": []})
    back = await give_back(core, slurm)
    assert (back.given_back, back.waiting) == ((), ()) and core.patched == [] and slurm.drained == []
