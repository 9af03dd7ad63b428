"""The Kubernetes half on a real kube-apiserver (built by infra/k8s/build.sh), with the real
kube-controller-manager (PodDisruptionBudget status) and kwok standing in for kubelets, together
with the Slurm sandbox and the Temporal dev server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from gpuheal.activities.kubernetes import INCIDENT_ANNOTATION, TAINT_KEY, KubernetesActivities
from gpuheal.clients.slurm.cli import SlurmCli
from gpuheal.core.models.base import Stage
from gpuheal.core.models.incident import BorrowPolicy
from gpuheal.core.models.kubernetes import CordonRequest, EvictRequest, KubeEvent, KubeNodeRef, MapNodeRequest
from gpuheal.core.models.slurm import NodeRef
from gpuheal.core.settings import Settings
from gpuheal.providers.kubernetes import KubernetesProvider
from gpuheal.triggers.start import start_or_join
from gpuheal.workers.main import make_worker
from gpuheal.workflows.remediation import GpuRemediationWorkflow
from infra.sandbox import K8S, SLURM_SCRIPT
from infra.sandbox.kube import KubeSandbox
from infra.sandbox.stack import Sandbox
from tests.integration.conftest import activity_attempts, nodes_in_service, report, stage_ended

pytestmark = pytest.mark.integration


@pytest.fixture
async def k8s_worker(client: Client, k8s_settings: Settings) -> AsyncIterator[None]:
    async with make_worker(client, k8s_settings):
        yield


async def wait_stage(handle: Any, stage: Stage, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await handle.query(GpuRemediationWorkflow.status)
        if status.stage == stage:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never reached {stage}")


def node(kube: KubeSandbox, name: str) -> Any:
    return kube.core().read_node(name)


def events_for(kube: KubeSandbox, name: str) -> list[str]:
    items: Any = kube.core().list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return [e.reason for e in items]


async def test_whole_loop_with_kubernetes(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client, k8s_worker: None
) -> None:
    job = slurm.submit_training("k8sloop")
    failed = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    other = next(n for n in ("gpu01", "gpu02", "gpu03") if n != failed)
    core: Any = kube.core()
    # What runs on the node: a DaemonSet pod (stays), a plain pod (evicted at once), and a pod of an
    # app whose PodDisruptionBudget (minAvailable 2 of 2) blocks its eviction until relaxed.
    apps: Any = k8s.AppsV1Api(kube.api())
    apps.create_namespaced_daemon_set(
        "default",
        k8s.V1DaemonSet(
            metadata=k8s.V1ObjectMeta(name="dcgm-exporter"),
            spec=k8s.V1DaemonSetSpec(
                selector=k8s.V1LabelSelector(match_labels={"app": "dcgm"}),
                template=k8s.V1PodTemplateSpec(
                    metadata=k8s.V1ObjectMeta(labels={"app": "dcgm"}),
                    spec=k8s.V1PodSpec(
                        containers=[k8s.V1Container(name="c", image="busybox")],
                        node_selector={"kubernetes.io/hostname": failed},
                    ),
                ),
            ),
        ),
    )
    # its pod: made by the DaemonSet controller, placed by kube-scheduler, run by kwok
    kube.wait(
        lambda: any(
            p.spec.node_name == failed and p.status.phase == "Running"
            for p in core.list_namespaced_pod("default", label_selector="app=dcgm").items
        ),
        f"the DaemonSet's pod Running on {failed}",
    )
    await asyncio.to_thread(kube.add_pod, f"slurmd-{failed}", failed, labels={"app": "slurmd"})
    for n in (failed, other):
        await asyncio.to_thread(kube.add_pod, f"web-{n}", n, labels={"app": "web"})
    policy_api: Any = k8s.PolicyV1Api(kube.api())
    policy_api.create_namespaced_pod_disruption_budget(
        "default",
        k8s.V1PodDisruptionBudget(
            metadata=k8s.V1ObjectMeta(name="web"),
            spec=k8s.V1PodDisruptionBudgetSpec(
                min_available=2, selector=k8s.V1LabelSelector(match_labels={"app": "web"})
            ),
        ),
    )
    kube.wait(
        lambda: (policy_api.read_namespaced_pod_disruption_budget("web", "default").status.current_healthy or 0) == 2,
        "PDB status from the disruption controller",
    )

    slurm.inject_gpu_fault(failed)
    handle = await start_or_join(client, k8s_settings, report(k8s_settings, failed, 79))
    await wait_stage(handle, Stage.EVICT)
    await asyncio.sleep(3)
    # blocked: the PDB protects web-<failed>; the plain pod went at once
    names = {
        p.metadata.name for p in core.list_namespaced_pod("default").items if p.metadata.deletion_timestamp is None
    }
    assert f"web-{failed}" in names and f"slurmd-{failed}" not in names
    policy_api.patch_namespaced_pod_disruption_budget("web", "default", {"spec": {"minAvailable": 1}})
    result = await asyncio.wait_for(handle.result(), 120)

    assert result.outcome == "resolved" and result.replacement_node is not None
    evict = next(s for s in result.stages if s.stage == Stage.EVICT)
    assert "evicted 2" in evict.outcome and "kept 1" in evict.outcome and "BLOCKED" not in evict.outcome
    retries = int(evict.outcome.split(", ")[-1].split()[0]) if "PDB retries" in evict.outcome else 0
    assert retries >= 1
    new = result.replacement_node
    assert any(c.type == "Ready" and c.status == "True" for c in node(kube, new).status.conditions)
    assert new in nodes_in_service(slurm) and failed not in nodes_in_service(slurm)
    with pytest.raises(ApiException) as gone:
        node(kube, failed)
    assert gone.value.status == 404
    assert {
        "GpuhealTriage",
        "GpuhealDrain",
        "GpuhealCordonAndTaint",
        "GpuhealEvictPods",
        "GpuhealRepairOrReplace",
        "GpuhealVerifyResume",
    } <= set(events_for(kube, failed))
    (resumed,) = result.jobs_resumed
    assert resumed.step > resumed.checkpoint_step and failed not in resumed.node


async def test_apiserver_outage_mid_remediation_is_ridden_out(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client
) -> None:
    # The job confirms gpuheal's checkpoint request only once the test opens its gate, after the
    # apiserver is down: the protect stage (before the requeue and the eviction; the drain and the
    # cordon go beside it) stays open exactly as long as that takes, however loaded the machine
    # (a grace of 8 s, then 20 s, was once too short).
    # The worker's settings rule (not the trigger's): a grace long enough never to end first, also
    # for a job whose progress reports lag on a loaded machine (the unconfirmed wait).
    grace = {"checkpoint_grace_s": 300, "checkpoint_unconfirmed_wait_s": 300}
    settings = k8s_settings.model_copy(update={"remediation": k8s_settings.remediation.model_copy(update=grace)})
    gate = slurm.slurm_dir / "jobs" / f"outage-{time.time_ns()}.may-checkpoint"
    # (no checkpoint of its own meanwhile: any newer than the request would confirm it)
    job = slurm.submit_training("outage", ckpt_every=1_000_000, env={"TRAIN_CHECKPOINT_WHEN": str(gate)})
    target = await asyncio.to_thread(slurm.wait_for_step, job, 3)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, target, 48, gpu=None))  # reset_gpu
        await stage_ended(handle, Stage.CORDON)  # beside the checkpoint wait, which the gate holds open
        await asyncio.to_thread(kube.stop_apiserver)
        try:
            status = await handle.query(GpuRemediationWorkflow.status)
            assert not any(r.stage == Stage.EVICT for r in status.stages), "the apiserver must be down first"
            gate.touch()  # the job checkpoints now; the requeue follows, then the eviction, which fails
            await wait_stage(handle, Stage.EVICT)  # the eviction now fails and is retried
            await asyncio.sleep(3)
            # Read the clock *before* the apiserver starts: the retried eviction may succeed while
            # start_apiserver() is still waiting for /readyz, so a reading after it could come later
            # than the eviction (the race this test once lost on a loaded machine).
            restart_at = datetime.now(UTC)
        finally:
            await asyncio.to_thread(kube.start_apiserver)  # whatever happened: the next tests need it
        result = await asyncio.wait_for(handle.result(), 180)
    assert result.outcome == "resolved"
    evict = next(s for s in result.stages if s.stage == Stage.EVICT)
    assert evict.ended_at is not None and evict.ended_at >= restart_at  # the Kubernetes steps waited it out
    assert await activity_attempts(handle, "evict_pods") >= 2  # it failed while the apiserver was down
    n = node(kube, target)
    assert not n.spec.unschedulable and not any(t.key == TAINT_KEY for t in (n.spec.taints or []))


async def test_node_cordoned_by_someone_else_stays_cordoned(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client, k8s_worker: None
) -> None:
    core: Any = kube.core()
    core.patch_node("gpu02", {"spec": {"unschedulable": True}})  # an operator's maintenance cordon
    handle = await start_or_join(client, k8s_settings, report(k8s_settings, "gpu02", 48))
    result = await asyncio.wait_for(handle.result(), 120)
    assert result.outcome == "resolved" and "left cordoned" in result.node_detail
    n = node(kube, "gpu02")
    assert n.spec.unschedulable is True
    assert not any(t.key == TAINT_KEY for t in (n.spec.taints or []))  # our taint is gone
    assert INCIDENT_ANNOTATION not in (n.metadata.annotations or {})
    cordon = next(s for s in result.stages if s.stage == Stage.CORDON)
    assert "already cordoned by someone else" in cordon.outcome


async def test_worker_rbac_allows_its_actions_and_nothing_else(kube: KubeSandbox, k8s_settings: Settings) -> None:
    worker_api = kube.api(kube.worker_kubeconfig)
    acts = KubernetesActivities(worker_api)
    env = ActivityEnvironment()
    kube.add_pod("victim", "gpu03", labels={"app": "x"})
    ref = NodeRef(cluster="c", node="gpu03", incident_id="gpuheal-c-gpu03")
    kref: KubeNodeRef = await env.run(acts.map_kube_node, MapNodeRequest(ref=ref))
    # NoSchedule only: a NoExecute taint would let the controller-manager's taint eviction race
    # evict_pods for the victim (it won once on a loaded machine); both are the same node patch.
    cordon = await env.run(acts.cordon_and_taint_node, CordonRequest(node=kref))
    assert not cordon.cordoned_by_others
    again = await env.run(acts.cordon_and_taint_node, CordonRequest(node=kref))
    assert again.already_done  # idempotent: read before act
    evicted = await env.run(acts.evict_pods, EvictRequest(node=kref, deadline_s=10))
    assert evicted.evicted == ("default/victim",)
    await env.run(acts.post_node_event, KubeEvent(node=kref, reason="GpuhealTest", message="rbac"))
    assert "uncordoned" in await env.run(acts.uncordon_node, kref)

    core: Any = k8s.CoreV1Api(worker_api)
    refused = [
        lambda: core.list_namespaced_secret("default"),
        lambda: core.delete_namespaced_pod("anything", "default"),
        lambda: core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name="rogue"))),
        lambda: core.read_namespaced_pod("anything", "default"),  # pods: list only
    ]
    for call in refused:
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403


def test_manifests_pass_server_side_dry_run(kube: KubeSandbox) -> None:
    dyn = dynamic.DynamicClient(kube.api())
    docs = [d for f in ("rbac.yaml", "rbac-force-delete.yaml") for d in yaml.safe_load_all((K8S / f).read_text()) if d]
    assert {d["kind"] for d in docs} >= {"ClusterRole", "ClusterRoleBinding", "ServiceAccount"}  # chart: test_helm
    for doc in docs:
        resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        ns = doc["metadata"].get("namespace")
        try:
            resource.create(body=doc, namespace=ns, query_params=[("dryRun", "All")])
        except ApiException as err:
            assert err.status == 409, f"{doc['kind']}/{doc['metadata']['name']}: {err.body}"  # exists (rbac.yaml)


async def test_kubernetes_native_replacement_waits_for_the_node_group(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings
) -> None:
    """KubernetesProvider deletes the Node and waits for the node group's new one to be Ready and
    in Slurm. The cloud's node group is played here by the test, with the worker's RBAC."""
    provider = KubernetesProvider(SlurmCli(str(slurm.slurm_conf)), kube.api(kube.worker_kubeconfig), timeout_s=90)

    def node_group() -> None:
        core: Any = kube.core()
        kube.wait(lambda: "gpu03" not in {n.metadata.name for n in core.list_node().items}, "gpu03 deleted")
        kube.add_node("gpu05")
        slurm.run(SLURM_SCRIPT, "start-node", "gpu05")

    group = asyncio.create_task(asyncio.to_thread(node_group))
    result = await asyncio.wait_for(provider.replace("gpu03", "gpuheal-c-gpu03"), 120)
    await group
    assert result.new_node == "gpu05"
    assert "gpu05" in nodes_in_service(slurm)
    health = await provider.check_health("gpu05")
    assert health.healthy


class NoSpareButInference(NamedTuple):
    job: int  # the training job, on `failed`, with nowhere else in Slurm to go
    failed: str
    ready: Callable[[], int]  # ready replicas of the inference Deployment (4, its PDB keeps 3)
    settings: Settings  # borrowing from pool "inference", spares out of stock


def no_spare_but_an_inference_pool(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, give_back_wait_s: float = 86400
) -> NoSpareButInference:
    """gpu01-03 busy (a training job and two fillers), no spare in stock, and four inference
    nodes (kwok, in Slurm's config as FUTURE) serving a Deployment whose PDB allows one down."""
    slurm.extra_env["GPUHEAL_SLURM_INFERENCE"] = "4"
    try:
        slurm.start_slurm(clean=True)  # gpu01-03, spares gpu04-06, inference inf01-04 (FUTURE)
    finally:
        slurm.extra_env.pop("GPUHEAL_SLURM_INFERENCE")
    slurm.spares_out_of_stock(True)
    ready = kube.serve_inference([f"inf{i:02d}" for i in range(1, 5)], min_available=3)
    job = slurm.submit_training("borrower")
    failed = slurm.wait_for_step(job, 3)
    for other in {"gpu01", "gpu02", "gpu03"} - {failed}:  # nowhere else for it to run
        slurm.submit_script(f"fill-{other}", "sleep 600", nodelist=other, exclusive=True)
    settings = k8s_settings.model_copy(
        update={
            "remediation": k8s_settings.remediation.model_copy(
                update={
                    "borrow": BorrowPolicy(pool="inference", floor=3, give_back_wait_s=give_back_wait_s),
                    "capacity_wait_s": 180,
                    "capacity_retry_s": 3,
                }
            )
        }
    )
    return NoSpareButInference(job, failed, ready, settings)


async def test_no_spare_borrows_an_inference_node_and_gives_it_back(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client
) -> None:
    """No spare left: an inference node is borrowed (its Deployment never under its PDB), the job
    resumes on it, and when a replacement appears the node goes back to the inference pool."""
    job, failed, ready, settings = no_spare_but_an_inference_pool(slurm, kube, k8s_settings)
    lowest = [4]
    sampling = True

    async def sample() -> None:
        while sampling:
            lowest[0] = min(lowest[0], await asyncio.to_thread(ready))
            await asyncio.sleep(0.3)

    sampler = asyncio.create_task(sample())
    slurm.inject_gpu_fault(failed)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, failed, 79, gpu=None))
        await wait_stage(handle, Stage.AWAITING_CAPACITY, timeout=120)
        borrowed_on = await asyncio.to_thread(slurm.wait_for_step, job, 20, 120)  # training on the borrowed node
        assert borrowed_on.startswith("inf")
        slurm.spares_out_of_stock(False)  # the cloud has a node again
        result = await asyncio.wait_for(handle.result(), 180)
    sampling = False
    await sampler

    assert result.outcome == "resolved" and result.borrowed_node == borrowed_on
    assert result.replacement_node == "gpu04"
    borrow = next(s for s in result.stages if s.stage == Stage.BORROW)
    assert f"borrowed {borrowed_on} from pool inference" in borrow.outcome
    give_back = next(s for s in result.stages if s.stage == Stage.GIVE_BACK)
    assert f"{borrowed_on} back in inference pool inference" in give_back.outcome
    (account,) = result.jobs
    assert account.resumed is not None and account.resumed.node == "gpu04"  # moved off before it went back
    back = node(kube, borrowed_on)
    assert back.metadata.labels["gpuheal.io/pool"] == "inference" and not back.spec.unschedulable
    kube.wait(lambda: ready() == 4, "4 inference replicas ready again")
    assert lowest[0] >= 3  # never below the PodDisruptionBudget's minimum
    assert borrowed_on not in nodes_in_service(slurm)


async def test_a_borrowed_node_a_job_still_runs_on_is_kept_not_given_back(
    slurm: Sandbox, kube: KubeSandbox, k8s_settings: Settings, client: Client
) -> None:
    """Give-back never takes a node from under a job: one Slurm may not requeue (--no-requeue)
    keeps the borrowed node in Slurm, drained, past the bound; the operators are told, and the
    node stays out of the inference pool until a person returns it."""
    job, failed, _, settings = no_spare_but_an_inference_pool(slurm, kube, k8s_settings, give_back_wait_s=6)
    slurm.inject_gpu_fault(failed)
    async with make_worker(client, settings):
        handle = await start_or_join(client, settings, report(settings, failed, 79, gpu=None))
        await wait_stage(handle, Stage.AWAITING_CAPACITY, timeout=120)
        borrowed_on = await asyncio.to_thread(slurm.wait_for_step, job, 20, 120)
        pinned = slurm.submit_script("pinned", "sleep 600", nodelist=borrowed_on, requeue=False)
        for _ in range(80):
            if (j := slurm.job(pinned)) is not None and j.state == "RUNNING":
                break
            await asyncio.sleep(0.25)
        assert j is not None and j.state == "RUNNING" and j.nodes == borrowed_on
        slurm.spares_out_of_stock(False)
        result = await asyncio.wait_for(handle.result(), 180)

    give_back = next(s for s in result.stages if s.stage == Stage.GIVE_BACK)
    assert f"{borrowed_on} kept in Slurm, drained: job(s) [" in give_back.outcome
    assert f"{pinned}" in give_back.outcome and "still on it after 6 s" in give_back.outcome
    assert "no job is killed" in give_back.outcome
    still = slurm.job(pinned)
    assert still is not None and still.state == "RUNNING"  # never killed
    assert "DRAIN" in slurm.slurm("scontrol", "show", "node", borrowed_on)
    labels = node(kube, borrowed_on).metadata.labels
    assert labels["gpuheal.io/pool"] != "inference" and "gpuheal.io/borrowed-by" in labels  # not handed back
    (account,) = [a for a in result.jobs if a.job_id == job]
    assert account.resumed is not None and account.resumed.node == "gpu04"  # the training moved off all the same
