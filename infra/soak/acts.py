"""What the soak does to the world: each failure sent as Alertmanager sends it, each fault carried
out and undone, and the operator's rounds. Each act is written to ROOT/acts.jsonl with when it
began and ended, so a violation can name the fault before it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from gpuheal.core import ids, queries
from gpuheal.core import search_attributes as sa
from gpuheal.core.messages import FLEET_VIEW, INCIDENT
from gpuheal.triggers.alertmanager import firing_payload
from infra.sandbox.processes import BIN
from infra.soak import faults as faulting
from infra.soak.load import HARDWARE_KINDS, Failure, relapse_failure
from infra.soak.world import POLICY, World, slurmctld_pid

OPERATOR = "soak-operator"
ROUND_S = 15.0  # the operator looks at each cluster this often
TRIPPED_FOR_S = 120.0  # and resumes a breaker tripped this long (after a look at why)
ABORTS_EVERY = 4  # of the incidents waiting for approval it aborts the first, then one in this many
# A node whose incident the operator aborted (left drained, not replaced) fails again, once per
# node: a new incident on a node gpuheal already drained, which must read the node and not drain
# it again (infra/soak/breaks/double-drain.patch is caught by it). Sent this soon after the
# aborted run has closed (an open run would take the report in; its close may wait on refused
# notices), waiting at most RELAPSE_WAIT_S for that; the operator returns the node only after.
RELAPSE_AFTER_S, RELAPSE_WAIT_S = 5.0, 300.0
STARTS_WITHIN_S = 120.0  # an alert's run starts this soon after it is sent, through a Temporal restart
RELAPSE_TOOK = "new run"  # what a relapse act says when a new run took it (infra.soak.breaking counts them)
FOLLOWS_THE_FLEET = frozenset({"hardware", "application", "informational", "repeat", "false_alarm"})
AGAIN = frozenset({"duplicate", "resend"})
KILL_WAIT_S = 30.0  # a worker is killed while it runs an activity, if one starts within this


class Acts:
    def __init__(self, world: World, client: Client, begun: float, seed: int) -> None:
        self.world, self.client, self.begun = world, client, begun
        self.rng = random.Random(seed ^ 0x5EED)
        self.path = world.root / "acts.jsonl"
        self.sent_to: dict[tuple[str, str, float], str] = {}  # (cluster, slot, first sent) -> the node
        self.approvals = 0  # incidents the operator has decided on, for ABORTS_EVERY
        self.relapsed: set[tuple[str, str]] = set()  # (cluster, node) failed again after an abort
        self.relapsing: dict[tuple[str, str], asyncio.Task[None]] = {}  # not yet sent: not returned
        self.sent: dict[tuple[str, str], list[tuple[float, int, int]]] = {}  # node -> (at, GPU, XID)
        self.struck: float | None = None  # when the fault being carried out acted, if not at its start

    def record(self, kind: str, **fields: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"at": time.time(), "kind": kind, **fields}) + "\n")

    async def until(self, at_s: float) -> None:
        await asyncio.sleep(max(0.0, self.begun + at_s - time.time()))

    def gpuheal(self, cluster: str, *argv: str) -> subprocess.CompletedProcess[str]:
        env = self.world.clusters[cluster].sb.env()
        return subprocess.run([str(BIN / "gpuheal"), *argv], env=env, capture_output=True, text=True, timeout=60)

    # --- the load ------------------------------------------------------------------------

    async def send(self, failures: list[Failure]) -> None:
        for f in failures:
            await self.until(f.at_s)
            await asyncio.to_thread(self._send_one, f)

    def _send_one(self, f: Failure) -> None:
        c = self.world.clusters[f.cluster]
        if f.kind in AGAIN:  # Alertmanager sends an alert again as it first sent it
            node = self.sent_to.get((f.cluster, f.node, f.first_s), f.node)
        else:
            node = self.in_service(f.cluster, f.node) if f.kind in FOLLOWS_THE_FLEET else f.node
            self.sent_to[(f.cluster, f.node, f.first_s)] = node
        if f.kind in HARDWARE_KINDS and f.at_s == f.first_s:
            c.sb.inject_gpu_fault(node)  # its jobs stop stepping, as on a GPU gone
        payload = firing_payload(
            node,
            xid=f.xid,
            gpu=str(f.gpu),
            cluster=f.cluster,
            summary=f"XID {f.xid} on {node} GPU {f.gpu}",
            starts_at=datetime.fromtimestamp(self.begun + f.first_s, UTC),
        )
        status = post(c.webhook_url, c.sb.webhook_token, payload)
        self.sent.setdefault((f.cluster, node), []).append((time.time(), f.gpu, f.xid))
        self.record(
            "failure", cluster=f.cluster, node=node, slot=f.node, xid=f.xid, gpu=f.gpu, load=f.kind, status=status
        )

    async def relapse(self, cluster: str, node: str, aborted: str, run_id: str, started: float) -> None:
        """The aborted incident's node fails again, with a failure never reported on it (a new
        failure, not a re-send: load.relapse_failure), before the operator has returned it; the
        act says whether a new run took it."""
        try:
            said = await self._relapse(cluster, node, aborted, run_id, started)
        except RPCError as err:  # Temporal restarting as it was sent: said, as a fault not carried out
            said = f"could not: {err}"
        finally:
            self.relapsing.pop((cluster, node), None)
        self.record("operator", cluster=cluster, act="relapse", node=node, said=said)

    async def _relapse(self, cluster: str, node: str, aborted: str, run_id: str, started: float) -> str:
        deadline = time.time() + RELAPSE_WAIT_S
        while await self._running(aborted, run_id):
            if time.time() > deadline:
                return f"not sent: the aborted run still open after {RELAPSE_WAIT_S:.0f} s"
            await asyncio.sleep(2)
        await asyncio.sleep(RELAPSE_AFTER_S)
        since = await self._chain_began(aborted, run_id, started) - STARTS_WITHIN_S
        try:
            gpu, xid = relapse_failure(self.sent.get((cluster, node), []), since=since)
        except ValueError as err:
            return f"not sent: {err}"
        now = time.time() - self.begun
        await asyncio.to_thread(self._send_one, Failure(now, cluster, node, gpu, xid, "relapse", now))
        await asyncio.sleep(RELAPSE_AFTER_S)
        latest = await self.client.get_workflow_handle(aborted).describe()
        took = latest.run_id != run_id and latest.status == WorkflowExecutionStatus.RUNNING
        return f"XID {xid} GPU {gpu}: " + (f"{RELAPSE_TOOK} {latest.run_id}" if took else "no new run")

    async def _chain_began(self, workflow_id: str, run_id: str, started: float) -> float:
        """When the aborted run's chain began (`started`: the run's own start): a follow-up run,
        continued as new, carries the report its first run was started with. Temporal restarting:
        the run's own start (the choice prefers, it does not refuse)."""
        try:
            described = await self.client.get_workflow_handle(workflow_id, run_id=run_id).describe()
            first = described.raw_description.workflow_execution_info.first_run_id
            if not first or first == run_id:
                return started
            return (await self.client.get_workflow_handle(workflow_id, run_id=first).describe()).start_time.timestamp()
        except RPCError:
            return started

    async def _running(self, workflow_id: str, run_id: str) -> bool:
        try:
            described = await self.client.get_workflow_handle(workflow_id, run_id=run_id).describe()
        except RPCError:
            return True  # no answer (Temporal restarting): asked again
        return described.status == WorkflowExecutionStatus.RUNNING

    def in_service(self, cluster: str, slot: str) -> str:
        """The node now in the place the load names: one the fleet replaced is followed to its
        replacement (the provider's record: "<incident id>/<run>" -> the spare), so failures and
        false alarms land on the fleet as it stands. A rack's burst stays on the rack's nodes."""
        record = self.world.clusters[cluster].sb.slurm_dir / "provider" / "replacements.json"
        given: dict[str, str] = json.loads(record.read_text()) if record.exists() else {}
        prefix = ids.incident_prefix(cluster)
        replaced = {key.split("/", 1)[0].removeprefix(prefix): spare for key, spare in given.items()}
        node, seen = slot, {slot}
        while node in replaced and replaced[node] not in seen:
            node = replaced[node]
            seen.add(node)
        return node

    # --- the faults ----------------------------------------------------------------------

    async def inflict(self, dealt: list[faulting.Fault]) -> None:
        for fault in dealt:
            await self.until(fault.at_s)
            began, self.struck = time.time(), None
            try:
                said = await getattr(self, f"_{fault.kind}")(fault)
            except Exception as err:  # a fault that could not be carried out is said, not hidden
                said = f"could not: {err}"
            # over: when it stopped acting on the world (a refusal of notices goes on after its act;
            # one skipped or failed did nothing)
            acted = not said.startswith(("could not", "skipped"))
            over = max(time.time(), began + fault.lasts_s) if acted else time.time()
            began = self.struck or began  # a fault that looks before it acts began when it acted
            self.record("fault", fault=fault.kind, cluster=fault.cluster, began=began, over=over, said=said)

    async def _kill_worker(self, f: faulting.Fault) -> str:
        """SIGKILL the worker running an incident's activity (the server's pending activities name
        the worker that started each), waiting up to KILL_WAIT_S for one; then one at random."""
        c = self.world.clusters[f.cluster]
        mine = {p.pid: i for i, p in enumerate(c.workers)}
        deadline = time.time() + KILL_WAIT_S
        chosen: tuple[int, str] | None = None
        while chosen is None and time.time() < deadline:
            running = await self.running_activities(f.cluster)
            chosen = next(((mine[pid], what) for pid, what in running if pid in mine), None)
            if chosen is None:
                await asyncio.sleep(1)
        i, during = chosen or (self.rng.randrange(len(c.workers)), f"no activity ran in {KILL_WAIT_S:.0f} s")
        self.struck = time.time()
        c.workers[i].send_signal(signal.SIGKILL)
        await asyncio.to_thread(c.workers[i].wait)
        await asyncio.sleep(2)
        c.start_worker(i)
        return f"SIGKILL {c.worker_name(i)} during {during} (pid {c.workers[i].pid} now)"

    async def running_activities(self, cluster: str) -> list[tuple[int, str]]:
        """(the worker's pid, "<activity> of <workflow id>") for each activity an open incident of
        the cluster has started and not finished, as the server describes the incident."""
        found = []
        async for w in self.client.list_workflows(open_incidents(cluster)):
            described = await self.client.get_workflow_handle(w.id, run_id=w.run_id).describe()
            for a in described.raw_description.pending_activities:
                pid, _, _ = a.last_worker_identity.partition("@")
                if a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED and pid.isdigit():
                    found.append((int(pid), f"{a.activity_type.name} of {w.id}"))
        return found

    async def _restart_temporal(self, f: faulting.Fault) -> str:
        sb = self.world.temporal
        if sb.temporal_kind == "cluster":
            await asyncio.to_thread(sb.restart_temporal_server)
            return "the server's services restarted"
        await asyncio.to_thread(sb.stop_temporal)
        await asyncio.to_thread(sb.start_temporal)
        return "the dev server restarted"

    async def _restart_postgres(self, f: faulting.Fault) -> str:
        sb = self.world.temporal
        if sb.temporal_kind != "cluster":
            return "skipped: the dev server has no PostgreSQL"
        await asyncio.to_thread(sb.restart_postgres)
        return "PostgreSQL restarted"

    async def _stop_slurmctld(self, f: faulting.Fault) -> str:
        pid = slurmctld_pid(self.world.clusters[f.cluster])
        if pid is None:
            return "could not: no slurmctld pid"
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(f.lasts_s)
        finally:
            os.kill(pid, signal.SIGCONT)
        return f"slurmctld stopped {f.lasts_s:.0f} s (SIGSTOP, then SIGCONT)"

    async def _apiserver_away(self, f: faulting.Fault) -> str:
        kube = self.world.clusters[f.cluster].kube
        if kube is None:
            return "skipped: no Kubernetes sandbox built"
        await asyncio.to_thread(kube.stop_apiserver)
        try:
            await asyncio.sleep(f.lasts_s)
        finally:
            await asyncio.to_thread(kube.start_apiserver)
        return f"the apiserver away {f.lasts_s:.0f} s"

    async def _notices_refused(self, f: faulting.Fault) -> str:
        self.world.notices.refuse_for(f.lasts_s)
        return f"notices refused (503) for {f.lasts_s:.0f} s"

    async def _terminate_coordinator(self, f: faulting.Fault) -> str:
        handle = self.client.get_workflow_handle(ids.coordinator_id(f.cluster))
        await handle.terminate(reason="soak: the coordinator terminated by hand")
        return "terminated"

    async def _pause_resume(self, f: faulting.Fault) -> str:
        paused = await asyncio.to_thread(self.gpuheal, f.cluster, "pause", "--operator", OPERATOR, "--reason", "soak")
        await asyncio.sleep(f.lasts_s)
        resumed = await asyncio.to_thread(self.gpuheal, f.cluster, "resume", "--operator", OPERATOR, "--reason", "soak")
        self.record("operator", cluster=f.cluster, act="resume", rc=resumed.returncode)
        return f"paused (rc {paused.returncode}) {f.lasts_s:.0f} s, resumed (rc {resumed.returncode})"

    async def _policy_change(self, f: faulting.Fault) -> str:
        # Not the budget or containment (the bound the checker holds each sample to): the breaker's window.
        window = self.rng.choice((60, 90))
        path = self.world.root / f"policy-change-{f.cluster}.yaml"
        path.write_text(yaml.safe_dump({**POLICY, "breaker": {**POLICY["breaker"], "window_s": window}}))  # type: ignore[dict-item]
        done = await asyncio.to_thread(
            self.gpuheal, f.cluster, "policy", "apply", str(path), "--operator", OPERATOR, "--reason", "soak"
        )
        return f"breaker window {window} s (rc {done.returncode})"

    async def _roll_workers(self, f: faulting.Fault) -> str:
        """Each worker stopped as Kubernetes stops a pod (SIGTERM: its running activities finish
        within the grace) and started again, one by one, as a rolling restart does. The same code
        comes back: a build of other code under Worker Versioning is tests/integration/production's
        test_upgrade, not the soak's."""
        c = self.world.clusters[f.cluster]
        for i, proc in enumerate(list(c.workers)):
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait)
            c.start_worker(i)
            await asyncio.sleep(5)
        return f"{len(c.workers)} workers replaced one by one (SIGTERM, then started again)"

    # --- the operator --------------------------------------------------------------------

    async def operate(self, until: float) -> None:
        """Rounds until `until` (epoch): a breaker tripped for a while is resumed; what waits for
        approval approved (or, the first and one in four after it, aborted, its node then failing
        again); a left node returned."""
        try:
            await self._rounds(until)
        except asyncio.CancelledError:  # the soak is over: no relapse is sent into a world stopping
            for task in list(self.relapsing.values()):
                task.cancel()
            raise

    async def _rounds(self, until: float) -> None:
        while time.time() < until:
            for name in self.world.clusters:
                try:
                    await self._round(name)
                except Exception as err:  # the operator's own look failed (Temporal restarting)
                    self.record("operator", cluster=name, act="look failed", said=str(err)[:200])
            await asyncio.sleep(ROUND_S)

    async def _round(self, cluster: str) -> None:
        try:
            view = await FLEET_VIEW.read(self.client.get_workflow_handle(ids.coordinator_id(cluster)))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return  # no coordinator yet: it starts with the cluster's first incident
            raise
        if view is None:
            return
        b = view.breaker
        if b.tripped and b.at is not None and time.time() - b.at.timestamp() > TRIPPED_FOR_S:
            done = await asyncio.to_thread(
                self.gpuheal, cluster, "resume", "--operator", OPERATOR, "--reason", "soak: looked, resumed"
            )
            self.record("operator", cluster=cluster, act="resume", rc=done.returncode)
        async for w in self.client.list_workflows(open_incidents(cluster, queries.eq(sa.STAGE, "approval"))):
            node = w.id[len(ids.incident_prefix(cluster)) :]
            verb = "abort" if self.approvals % ABORTS_EVERY == 0 else "approve"
            done = await asyncio.to_thread(
                self.gpuheal, cluster, verb, node, "--operator", OPERATOR, "--reason", f"soak: {verb}d after a look"
            )
            self.record("operator", cluster=cluster, act=verb, node=node, rc=done.returncode)
            self.approvals += done.returncode == 0  # one not done is decided again, as it was
            if verb == "abort" and done.returncode == 0 and (cluster, node) not in self.relapsed:
                self.relapsed.add((cluster, node))
                self.relapsing[(cluster, node)] = asyncio.create_task(
                    self.relapse(cluster, node, w.id, w.run_id, w.start_time.timestamp())
                )
        for line in view.left_nodes:
            if (cluster, line.node) in self.relapsing:
                continue  # its relapse first
            done = await asyncio.to_thread(
                self.gpuheal, cluster, "return", line.node, "--operator", OPERATOR, "--reason", "soak: repaired"
            )
            self.record("operator", cluster=cluster, act="return", node=line.node, rc=done.returncode)


def open_incidents(cluster: str, *more: queries.Term) -> str:
    """The visibility query for a cluster's running incidents (and whatever `more` narrows)."""
    return queries.where(queries.of_type(INCIDENT), queries.eq(sa.CLUSTER, cluster), queries.status("Running"), *more)


def post(url: str, token: str, payload: dict[str, Any]) -> int:
    """One POST as Alertmanager's webhook notifier sends it; the HTTP status (0: no answer)."""
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def acts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
