"""Replacements and borrowing that cannot collide, on the real kube-apiserver (kwok Nodes) and the
Slurm sandbox, under the worker's own RBAC. The cloud's node group is played by the test, as in
test_kubernetes.py (Cluster API's Machines: test_cluster_api.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from temporalio import workflow
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from gpuheal.activities.borrowed import BorrowedNodes
from gpuheal.activities.borrowing import BORROWED_BY, BORROWED_FROM, BORROWED_RUN, INCIDENT_ANNOTATION, label_safe
from gpuheal.activities.kubernetes import TAINT_KEY, KubernetesActivities
from gpuheal.clients.kube import POOL_LABEL, REJECTED, REJECTED_ANNOTATION, REJECTED_LABEL, REPLACES_ANNOTATION
from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.core.models.incident import BorrowPolicy
from gpuheal.core.models.kubernetes import BorrowRequest, KubeNodeRef, RejectNodeRequest
from gpuheal.core.models.replacement import ReplacementResult
from gpuheal.core.settings import Settings
from gpuheal.providers.base import NoSpareCapacity
from gpuheal.providers.kubernetes import KubernetesProvider
from infra.sandbox import SLURM_SCRIPT
from infra.sandbox.kube import KubeSandbox
from infra.sandbox.stack import Sandbox

pytestmark = pytest.mark.integration


def provider(slurm: Sandbox, kube: KubeSandbox, timeout_s: float) -> KubernetesProvider:
    return KubernetesProvider(SlurmCli(str(slurm.slurm_conf)), kube.api(kube.worker_kubeconfig), timeout_s=timeout_s)


def gone(kube: KubeSandbox, *names: str) -> None:
    core: Any = kube.core()
    kube.wait(lambda: not {n.metadata.name for n in core.list_node().items} & set(names), f"{names} deleted")


def borrowing_for_gpu02(run_id: str | None = None) -> BorrowRequest:
    """gpu02's incident asks for a node of pool inference."""
    failed = KubeNodeRef(slurm_node="gpu02", kube_node="gpu02", incident_id="gpuheal-c-gpu02")
    return BorrowRequest(
        incident_id="gpuheal-c-gpu02", failed=failed, policy=BorrowPolicy(pool="inference"), run_id=run_id
    )


def bring(slurm: Sandbox, kube: KubeSandbox, name: str, pool: str = "h100") -> None:
    """The node group's new node: a Ready Node in `pool` whose slurmd joins Slurm."""
    kube.add_node(name, pool=pool)
    slurm.run(SLURM_SCRIPT, "start-node", name)


async def test_two_incidents_racing_for_one_new_node_get_one_each(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """gpu02 and gpu03 fail at once and one new node comes: one incident reserves it, the other
    says "no capacity" (not a timeout) and remembers its pool; on its next try, with its failed
    Node long gone, a fresh node of another pool is not taken for it, the next one of its own is."""
    a, b = provider(slurm, kube, 30), provider(slurm, kube, 30)
    race = [
        asyncio.create_task(a.replace("gpu02", "gpuheal-c-gpu02")),
        asyncio.create_task(b.replace("gpu03", "gpuheal-c-gpu03")),
    ]
    await asyncio.to_thread(gone, kube, "gpu02", "gpu03")
    await asyncio.to_thread(bring, slurm, kube, "gpu05")
    outcomes = await asyncio.gather(*race, return_exceptions=True)
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, NoSpareCapacity)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert won[0].new_node == "gpu05" and won[0].pool == "h100"
    core: Any = kube.core()
    holder = core.read_node("gpu05").metadata.annotations[REPLACES_ANNOTATION]
    assert holder == f"gpuheal-c-{won[0].failed_node}"
    searched = lost[0].searched
    assert searched is not None and searched.pool == "h100" and searched.since is not None

    loser = provider(slurm, kube, 60)
    failed = "gpu03" if won[0].failed_node == "gpu02" else "gpu02"
    again = asyncio.create_task(loser.replace(failed, f"gpuheal-c-{failed}", searched))
    await asyncio.to_thread(bring, slurm, kube, "gpu06", "l40s")  # fresh, Ready, in Slurm: wrong pool
    await asyncio.sleep(5)  # two of its polls
    assert not again.done()
    await asyncio.to_thread(bring, slurm, kube, "gpu04")
    result = await asyncio.wait_for(again, 60)
    assert (result.new_node, result.pool) == ("gpu04", "h100")


async def test_a_new_node_already_running_a_job_is_never_claimed(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """gpu05 joins and a job lands on it first (mixed): it took that job unvalidated, and a
    burn-in would wait behind it. Not taken; gpu04, idle, is."""
    core: Any = kube.core()
    core.delete_node("gpu03")  # the failed node is gone already: only the wait is left
    since = max(n.metadata.creation_timestamp for n in core.list_node().items)  # as its first try saw
    searched = ReplacementResult(failed_node="gpu03", new_node=None, pool="h100", since=since)
    await asyncio.sleep(1.1)  # (creation times are to the second: gpu05's is after `since`)
    await asyncio.to_thread(bring, slurm, kube, "gpu05")
    busy = slurm.slurm("sbatch", "--parsable", "--chdir=/tmp", "-w", "gpu05", "-n1", "--wrap", "sleep 300")
    mixed = lambda: "State=MIXED" in slurm.slurm("scontrol", "show", "node", "gpu05")  # noqa: E731
    await asyncio.to_thread(kube.wait, mixed, "gpu05 running a job")
    search = asyncio.create_task(provider(slurm, kube, 60).replace("gpu03", "gpuheal-c-gpu03/r1", searched))
    await asyncio.sleep(5)  # two of its polls
    assert not search.done()
    await asyncio.to_thread(bring, slurm, kube, "gpu04")
    result = await asyncio.wait_for(search, 60)
    assert result.new_node == "gpu04"
    assert REPLACES_ANNOTATION not in (core.read_node("gpu05").metadata.annotations or {})
    slurm.slurm("scancel", busy.strip().split(";")[0])


@workflow.defn(name="CompletesAtOnce")
class CompletesAtOnce:
    """An incident run that reached an ending of its own (its marks stand)."""

    @workflow.run
    async def run(self) -> None:
        return None


async def test_a_claim_of_a_run_that_crashed_out_is_taken_over_and_no_other(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client
) -> None:
    """gpu04 is claimed by a run that completed (its node went into service), gpu05 by a run
    still open, gpu06 by one terminated before it used its spare: gpu06 is no one's and is taken
    (under the same precondition); the other two claims stand."""
    core: Any = kube.core()
    core.delete_node("gpu03")
    since = max(n.metadata.creation_timestamp for n in core.list_node().items)
    searched = ReplacementResult(failed_node="gpu03", new_node=None, pool="h100", since=since)
    await asyncio.sleep(1.1)
    for name in ("gpu04", "gpu05", "gpu06"):
        await asyncio.to_thread(bring, slurm, kube, name)
    queue = f"q-{uuid.uuid4()}"  # (the others never run: only their status matters)
    async with Worker(
        client, task_queue=queue, workflows=[CompletesAtOnce], workflow_runner=UnsandboxedWorkflowRunner()
    ):
        completed = await client.start_workflow(CompletesAtOnce.run, id=f"gpuheal-c-{uuid.uuid4()}", task_queue=queue)
        await completed.result()
    open_run = await client.start_workflow("GpuRemediation", id=f"gpuheal-c-{uuid.uuid4()}", task_queue=queue)
    crashed = await client.start_workflow("GpuRemediation", id=f"gpuheal-c-{uuid.uuid4()}", task_queue=queue)
    await crashed.terminate("crashed out before it used its spare")
    claims = {
        node: f"{run.id}/{run.result_run_id}"
        for node, run in (("gpu04", completed), ("gpu05", open_run), ("gpu06", crashed))
    }
    for name, claim in claims.items():
        core.patch_node(name, {"metadata": {"annotations": {REPLACES_ANNOTATION: claim}}})
    try:
        env = ActivityEnvironment(client=client)
        env.info = dataclasses.replace(env.info, workflow_id=open_run.id)  # (the asker: found first)
        found = env.run(provider(slurm, kube, 30).replace, "gpu03", "gpuheal-c-gpu03/r1", searched)
        result = await asyncio.wait_for(found, 60)
    finally:
        await open_run.terminate("test done")
    assert result.new_node == "gpu06"
    assert core.read_node("gpu06").metadata.annotations[REPLACES_ANNOTATION] == "gpuheal-c-gpu03/r1"
    for node in ("gpu04", "gpu05"):
        assert core.read_node(node).metadata.annotations[REPLACES_ANNOTATION] == claims[node]


async def test_a_rejected_node_leaves_kubernetes_scheduling_and_no_provider_takes_it(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """gpu05's burn-in failed: under the worker's RBAC it is cordoned, tainted and labelled (once,
    however often asked), this run's claim on it cleared; the next search passes it by."""
    core: Any = kube.core()
    core.delete_node("gpu03")
    since = max(n.metadata.creation_timestamp for n in core.list_node().items)
    searched = ReplacementResult(failed_node="gpu03", new_node=None, pool="h100", since=since)
    await asyncio.sleep(1.1)
    await asyncio.to_thread(bring, slurm, kube, "gpu05")
    core.patch_node("gpu05", {"metadata": {"annotations": {REPLACES_ANNOTATION: "gpuheal-c-gpu03/r1"}}})
    acts = KubernetesActivities(kube.api(kube.worker_kubeconfig))
    ref = KubeNodeRef(slurm_node="gpu05", kube_node="gpu05", incident_id="gpuheal-c-gpu03")
    req = RejectNodeRequest(node=ref, detail="burn-in job 91 ended FAILED (exit 1:0)")
    assert "cordoned" in await acts.mark_rejected_node(req)
    assert "already" in await acts.mark_rejected_node(req)
    node = core.read_node("gpu05")
    assert node.spec.unschedulable and node.metadata.labels[REJECTED_LABEL] == REJECTED
    assert [t.effect for t in node.spec.taints if t.key == TAINT_KEY] == ["NoSchedule"]
    assert REPLACES_ANNOTATION not in node.metadata.annotations
    assert "ended FAILED" in node.metadata.annotations[REJECTED_ANNOTATION]
    with pytest.raises(NoSpareCapacity):  # Ready, idle in Slurm, new: still never a spare
        await provider(slurm, kube, 6).replace("gpu03", "gpuheal-c-gpu03/r2", searched)


async def test_two_incidents_borrowing_at_once_never_take_one_node(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """Both choose inf01, the only inference node, before either takes it: the resourceVersion
    precondition gives it to one; the other hears there is nothing to borrow."""
    kube.add_node("inf01", pool="inference")
    acts = KubernetesActivities(kube.api(kube.worker_kubeconfig))
    both_chose = asyncio.Barrier(2)
    choose = acts._borrowable
    first_choices = [2]

    async def choose_together(policy: BorrowPolicy) -> Any:
        chosen = await choose(policy)
        if first_choices[0] > 0:  # the race, made certain: both read before either writes
            first_choices[0] -= 1
            await both_chose.wait()
        return chosen

    acts._borrowable = choose_together  # type: ignore[method-assign]

    def request(node: str) -> BorrowRequest:
        failed = KubeNodeRef(slurm_node=node, kube_node=node, incident_id=f"gpuheal-c-{node}")
        return BorrowRequest(incident_id=f"gpuheal-c-{node}", failed=failed, policy=BorrowPolicy(pool="inference"))

    results = await asyncio.gather(
        acts.borrow_inference_node(request("gpu02")), acts.borrow_inference_node(request("gpu03"))
    )
    assert sorted(str(r.node) for r in results) == ["None", "inf01"], results
    core: Any = kube.core()
    labels = core.read_node("inf01").metadata.labels
    winner = next(r for r in results if r.node == "inf01")
    assert labels[POOL_LABEL] == "h100" and winner.evicted == ()


@pytest.mark.parametrize("fails_after", ["take", "evict", "relabel"])
async def test_a_borrow_interrupted_after_any_step_is_finished_by_its_retry(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, fails_after: str
) -> None:
    """The apiserver answers 500 once, right after a step was done (its effect stands, the answer
    is lost): the activity fails, and its retry goes on from that step. inf01 ends in the training
    pool, uncordoned, its pod evicted; `already_done` only where the last step was done."""
    kube.add_node("inf01", pool="inference")
    kube.add_pod("web-1", "inf01")
    acts = KubernetesActivities(kube.api(kube.worker_kubeconfig))
    step = {"take": ("patch_node", 1), "evict": ("create_namespaced_pod_eviction", 1), "relabel": ("patch_node", 2)}
    method, nth = step[fails_after]
    real, calls = getattr(acts.core, method), [0]

    def lost_answer(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        calls[0] += 1
        if calls[0] == nth:
            raise ApiException(status=500, reason="the apiserver lost its answer")
        return out

    setattr(acts.core, method, lost_answer)
    req = borrowing_for_gpu02()
    with pytest.raises(ApiException):
        await acts.borrow_inference_node(req)
    result = await acts.borrow_inference_node(req)  # the retry
    assert result.node == "inf01" and result.from_pool == "inference"
    assert result.already_done == (fails_after == "relabel")
    core: Any = kube.core()
    node = core.read_node("inf01")
    assert node.metadata.labels[POOL_LABEL] == "h100" and not node.spec.unschedulable
    assert not [p for p in core.list_namespaced_pod("default").items if p.spec.node_name == "inf01"]


async def test_a_borrowed_node_of_a_run_that_ended_goes_back_once_its_jobs_are_done(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client
) -> None:
    """gpu05 was borrowed by an incident run terminated before it gave it back; inf01 by one
    still open. The coordinator's look drains gpu05 in Slurm (no new job lands) and, while a job
    still runs there, leaves it (never killed); once the job is done, gpu05 goes back to its
    inference pool. inf01 is its open run's, untouched."""
    core: Any = kube.core()
    await asyncio.to_thread(bring, slurm, kube, "gpu05")
    kube.add_node("inf01", pool="h100")
    nowhere = f"no-worker-{uuid.uuid4()}"
    open_run = await client.start_workflow("GpuRemediation", id=f"gpuheal-c-{uuid.uuid4()}", task_queue=nowhere)
    ended = await client.start_workflow("GpuRemediation", id=f"gpuheal-c-{uuid.uuid4()}", task_queue=nowhere)
    await ended.terminate("crashed out before it gave its borrowed node back")
    for node, run in (("gpu05", ended), ("inf01", open_run)):
        marks = {INCIDENT_ANNOTATION: run.id, BORROWED_RUN: run.result_run_id, BORROWED_FROM: "inference"}
        core.patch_node(node, {"metadata": {"labels": {BORROWED_BY: label_safe(run.id)}, "annotations": marks}})
    busy = (
        slurm.slurm("sbatch", "--parsable", "--chdir=/tmp", "-w", "gpu05", "--wrap", "sleep 300").strip().split(";")[0]
    )
    await asyncio.to_thread(kube.wait, lambda: job_state(slurm, busy) == "RUNNING", "the job on gpu05 running")
    env = ActivityEnvironment(client=client)
    env.info = dataclasses.replace(env.info, workflow_id=open_run.id)  # (the asker: the coordinator)
    reaper = BorrowedNodes(SlurmCli(str(slurm.slurm_conf)), kube.api(kube.worker_kubeconfig))
    try:
        first = await env.run(reaper.give_back_borrowed_of_ended_runs, "c")
        assert (first.given_back, first.waiting) == ((), ("gpu05",))
        shown = slurm.slurm("scontrol", "show", "node", "gpu05")
        assert "DRAIN" in shown and f"Reason={ended.id}: borrowed node goes back" in shown
        assert job_state(slurm, busy) == "RUNNING"  # never killed
        assert core.read_node("gpu05").metadata.labels[BORROWED_BY] == label_safe(ended.id)
        slurm.slurm("scancel", busy)
        await asyncio.to_thread(
            kube.wait, lambda: not slurm.slurm("squeue", "-h", "-w", "gpu05").strip(), "gpu05 empty"
        )
        second = await env.run(reaper.give_back_borrowed_of_ended_runs, "c")
    finally:
        await open_run.terminate("test done")
    assert (second.given_back, second.waiting) == (("gpu05",), ())
    back = core.read_node("gpu05")
    assert back.metadata.labels[POOL_LABEL] == "inference" and BORROWED_BY not in back.metadata.labels
    assert not back.spec.unschedulable and BORROWED_RUN not in (back.metadata.annotations or {})
    assert core.read_node("inf01").metadata.labels[BORROWED_BY] == label_safe(open_run.id)


def job_state(slurm: Sandbox, job: str) -> str:
    return dict(f.split("=", 1) for f in slurm.slurm("scontrol", "show", "job", "-o", job).split() if "=" in f)[
        "JobState"
    ]


async def test_a_borrow_after_the_failed_node_is_gone_joins_the_pool_its_incident_names(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """The Kubernetes provider deleted the failed Node before the borrow: the pool comes from the
    incident (its replacement searched it). Without it, nothing is taken (the pool is unknown)."""
    kube.add_node("inf01", pool="inference")
    core: Any = kube.core()
    core.delete_node("gpu02")
    acts = KubernetesActivities(kube.api(kube.worker_kubeconfig))
    unknown = borrowing_for_gpu02()
    nothing = await acts.borrow_inference_node(unknown)
    assert nothing.node is None and "gpu02 is gone" in nothing.why
    assert not core.read_node("inf01").spec.unschedulable  # untouched
    got = await acts.borrow_inference_node(unknown.model_copy(update={"training_pool": "h100", "run_id": "r1"}))
    assert got.node == "inf01" and core.read_node("inf01").metadata.labels[POOL_LABEL] == "h100"


async def test_a_borrow_whose_tries_ran_out_part_way_gives_its_node_back(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """The take was done, then the apiserver failed every try: the incident asks what it took to
    go back. inf01 is in its inference pool again, uncordoned, our marks gone."""
    kube.add_node("inf01", pool="inference")
    acts = KubernetesActivities(kube.api(kube.worker_kubeconfig))
    req = borrowing_for_gpu02(run_id="r1")
    real, calls = acts.core.list_pod_for_all_namespaces, [0]

    def apiserver_down(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:  # the choice reads its pods; down from the eviction on
            return real(*args, **kw)
        raise ApiException(status=503, reason="the apiserver is down")

    acts.core.list_pod_for_all_namespaces = apiserver_down  # type: ignore[method-assign]
    with pytest.raises(ApiException):
        await acts.borrow_inference_node(req)  # (its last try)
    core: Any = kube.core()
    assert core.read_node("inf01").spec.unschedulable  # taken: cordoned, labelled, in neither pool
    acts.core.list_pod_for_all_namespaces = real  # type: ignore[method-assign]
    assert "inf01" in (await acts.return_unfinished_borrow(req)).why
    node = core.read_node("inf01")
    assert node.metadata.labels[POOL_LABEL] == "inference" and not node.spec.unschedulable
    assert BORROWED_BY not in node.metadata.labels and BORROWED_RUN not in (node.metadata.annotations or {})
    assert (await acts.return_unfinished_borrow(req)).why == "nothing was taken"


async def test_a_borrowed_node_cordoned_since_is_never_evicted_by_a_borrow_asked_again(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """inf01 was borrowed (relabelled into the training pool) and someone cordoned it since (its
    own GPU incident, a person's drain), a pod running there: the same incident asking again (a
    reset run) finds its borrow done. Nothing is evicted; nothing is uncordoned."""
    kube.add_node("inf01", pool="inference")
    acts = KubernetesActivities(kube.api(kube.worker_kubeconfig))
    req = borrowing_for_gpu02(run_id="r1")
    assert (await acts.borrow_inference_node(req)).node == "inf01"
    core: Any = kube.core()
    core.patch_node("inf01", {"spec": {"unschedulable": True}})  # someone's cordon
    kube.add_pod("slurmd-inf01", "inf01")  # (as a NodeSet's pod: not a DaemonSet's)
    again = await acts.borrow_inference_node(req)
    assert again.node == "inf01" and again.already_done and again.evicted == ()
    assert core.read_node("inf01").spec.unschedulable
    assert core.read_namespaced_pod("slurmd-inf01", "default").metadata.deletion_timestamp is None


async def test_a_borrow_that_relabelled_before_its_tries_ran_out_is_the_incidents_after_all(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """The relabel landed but every answer after it was lost: what the failed borrow took is not
    returned from under the training side; it is answered, and the incident adopts it."""
    kube.add_node("inf01", pool="inference")
    acts = KubernetesActivities(kube.api(kube.worker_kubeconfig))
    req = borrowing_for_gpu02(run_id="r1")
    assert (await acts.borrow_inference_node(req)).node == "inf01"
    taken = await acts.return_unfinished_borrow(req)
    assert taken.node == "inf01" and taken.from_pool == "inference"
    assert kube.core().read_node("inf01").metadata.labels[POOL_LABEL] == "h100"  # left on the training side
