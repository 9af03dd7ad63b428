"""The sandbox provider: plays the cloud for the local Slurm sandbox (infra/slurm/sandbox.sh).

A replacement is a spare node (State=FUTURE in the sandbox's slurm.conf) whose slurmd it starts;
a GPU reset clears the sandbox's simulated fault; a reboot restarts the node's slurmd. With
Kubernetes on, it is also the node group: a replacement gets a kwok Node in the failed node's
pool, and a removed node's Node object is deleted.

It is never a default: the worker uses it only with GPUHEAL_PROVIDER=sandbox and both
GPUHEAL_SLURM_DIR and GPUHEAL_SANDBOX_SCRIPT set (the demo and the tests set them).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import re
import time
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuheal.clients import kube, proc
from gpuheal.clients.slurm import NodeOutOfService, SlurmBackend, SlurmError, UnknownNode
from gpuheal.core.errors import SettingsError
from gpuheal.core.models.base import ActionClass, check_node_name
from gpuheal.core.models.replacement import HealthCheckResult, RepairResult, ReplacementResult
from gpuheal.core.models.slurm import NodeInfo
from gpuheal.providers.base import Hold, NoSpareCapacity, ProviderContext

NOT_RESPONDING_GRACE_S = 10.0


def kwok_node(name: str, pool: str) -> client.V1Node:
    """A Node that kwok keeps Ready (the annotation is kwok's selector in infra/k8s/cluster.sh)."""
    return client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            labels={kube.POOL_LABEL: pool, "kubernetes.io/hostname": name, "type": "kwok"},
            annotations={"kwok.x-k8s.io/node": "fake"},
        )
    )


class SandboxProvider:
    """Spare-node replacement and simulated GPU reset/reboot on the Slurm sandbox."""

    def __init__(
        self, slurm: SlurmBackend, sandbox_dir: Path, script: Path, root: Path | None = None, timeout_s: float = 120
    ) -> None:
        self._slurm = slurm
        self._dir = sandbox_dir
        self._script = script
        self._root = root
        self._timeout = timeout_s
        self._record = sandbox_dir / "provider" / "replacements.json"
        self._choosing = asyncio.Lock()  # this worker's incidents; a file lock for the other workers
        self.fault_dir = sandbox_dir / "faults"

    # --- sandbox process control ---------------------------------------------------------

    async def _sandbox(self, verb: str, node: str) -> None:
        where = [f"GPUHEAL_SLURM_DIR={self._dir}", f"GPUHEAL_SLURM_ROOT={self._root or ''}"]
        await proc.run(
            ["env", *where, str(self._script), verb, check_node_name(node)],
            timeout_s=self._timeout,
            what=f"sandbox.sh {verb} {node}",
        )

    async def _in_service(self, node: str) -> NodeInfo | None:
        """The node as Slurm shows it, None while it is not in service (FUTURE, or no such node).
        Asked of the one node: the whole fleet's listing (`sinfo --json`, 12 MB at 10,000 nodes,
        a third of a second of CPU) every quarter second of every replacement starved a storm."""
        try:
            return await self._slurm.node(node)
        except (UnknownNode, NodeOutOfService):
            return None

    async def _wait_serving(self, node: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = await self._in_service(node)
            if info and info.state in {"idle", "mixed", "allocated"} and "NOT_RESPONDING" not in info.flags:
                return
            proc.heartbeat(f"waiting for {node} to register with slurmctld")
            await asyncio.sleep(0.25)
        raise SlurmError(f"node {node} did not register with slurmctld within {timeout_s:.0f} s")

    def spares(self) -> list[str]:
        """FUTURE nodes of the sandbox's slurm.conf (not its inference nodes), less those its "cloud" has run out of
        (provider/out-of-stock, one name per line, `*` for all: how a test makes capacity run out)."""
        conf = (self._dir / "slurm.conf").read_text()
        defined = re.findall(r"^NodeName=(\S+) (?!.*Features=inference).*State=FUTURE", conf, flags=re.M)
        stock = self._dir / "provider" / "out-of-stock"
        gone = set(stock.read_text().split()) if stock.exists() else set()
        return [] if "*" in gone else [n for n in defined if n not in gone]

    def _load(self) -> dict[str, str]:
        loaded: dict[str, str] = json.loads(self._record.read_text()) if self._record.exists() else {}
        return loaded

    # --- NodeProvider --------------------------------------------------------------------

    async def repair(self, node: str, action: ActionClass) -> RepairResult:
        # The sandbox's "GPU" is healthy again once its fault marker is gone.
        (self.fault_dir / node).unlink(missing_ok=True)
        if action == ActionClass.REBOOT_NODE:
            await self._sandbox("stop-node", node)
            await self._sandbox("start-node", node)
            await self._wait_serving(node)
            return RepairResult(
                action=action, repaired=True, detail=f"rebooted {node} (slurmd restarted, GPU fault cleared)"
            )
        return RepairResult(action=action, repaired=True, detail=f"reset the GPUs of {node} (GPU fault cleared)")

    async def replace(
        self, node: str, key: str, earlier: ReplacementResult | None = None, hold: Hold | None = None
    ) -> ReplacementResult:
        new, already = await self._choose_spare(node, key, earlier)
        if hold is not None:
            await hold(new)  # before its slurmd registers: no job lands on it unvalidated
        await self._start_spare(new)
        return ReplacementResult(failed_node=node, new_node=new, already_done=already)

    async def _choose_spare(self, node: str, key: str, earlier: ReplacementResult | None) -> tuple[str, bool]:
        """The spare recorded for this incident run (unless its GPUs failed validation), or the
        first free one, recorded first. Several workers share the record: the choice is made
        under a lock on it (this process's, then the file's), so no spare goes to two incidents."""
        record = self._load()  # (a glance: the choice itself is made under the lock)
        if key not in record and not [s for s in self.spares() if s not in set(record.values()) and s != node]:
            # None left: said without listing the fleet (a storm's retries listed it, 12 MB at
            # 10,000 nodes, each time they found the spares gone).
            raise NoSpareCapacity(f"no spare node left to replace {node}")
        in_service = set(await self._slurm.nodes())  # asked first: nothing awaits under the lock
        async with self._choosing:
            return await asyncio.to_thread(self._choose_locked, node, key, earlier, in_service)

    def _choose_locked(
        self, node: str, key: str, earlier: ReplacementResult | None, in_service: set[str]
    ) -> tuple[str, bool]:
        self._record.parent.mkdir(parents=True, exist_ok=True)
        with open(self._record.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            record = self._load()
            new = record.get(key)
            rejected = ""
            if earlier is not None and new in earlier.rejected:
                rejected, new = new, None  # drained for the vendor: the run needs another
            already = new is not None
            if new is None:
                used = set(record.values())
                free = [s for s in self.spares() if s not in in_service and s not in used and s != node]
                if not free:
                    raise NoSpareCapacity(f"no spare node left to replace {node}")
                new = free[0]
                # A line each time a spare is given, first: the record below keeps a run's latest
                # spare only; an audit (the soak's checker) needs every one, and when. (Killed
                # between the two, the retry writes the same line again.)
                given = {"at": time.time(), "key": key, "spare": new, "instead_of": rejected}
                with open(self._record.with_name("given.jsonl"), "a") as log:
                    log.write(json.dumps(given) + "\n")
                # Record the choice before acting: a retry after a crash reuses this spare.
                record[key] = new
                tmp = self._record.with_suffix(".tmp")
                tmp.write_text(json.dumps(record, indent=1))
                tmp.replace(self._record)
            return new, already

    async def _start_spare(self, new: str) -> None:
        await self._sandbox("start-node", new)
        await self._wait_serving(new)

    async def adopt(self, node: str) -> str:
        await self._sandbox("start-node", node)
        await self._wait_serving(node)
        return f"{node} joined Slurm"

    async def release(self, node: str, reason: str) -> str:
        return await self._leave_slurm(node, reason)  # the Node stays: it goes back to inference

    async def decommission(self, node: str, reason: str) -> str:
        return await self._leave_slurm(node, reason)

    async def _leave_slurm(self, node: str, reason: str) -> str:
        await self._sandbox("stop-node", node)
        if await self._in_service(node) is None:
            return f"{node} already out of the cluster"
        # A node with jobs cannot go straight to FUTURE; DOWN ends what still runs there
        # (only jobs that could not be requeued, and those are in the incident's result).
        await self._slurm.update_node(node, "down", reason)
        await self._slurm.update_node(node, "future")
        return f"{node} left the cluster (State=FUTURE)"

    async def check_health(self, node: str) -> HealthCheckResult:
        info = await self._in_service(node)
        # slurmctld marks a node it has just been asked about (a resume, a drain right after one)
        # not responding until its ping comes back, a fraction of a second: wait that out.
        deadline = time.monotonic() + NOT_RESPONDING_GRACE_S
        while info is not None and "NOT_RESPONDING" in info.flags and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            info = await self._in_service(node)
        if info is None:
            return HealthCheckResult(node=node, healthy=False, detail="not in service")
        if "NOT_RESPONDING" in info.flags or info.state == "down":
            return HealthCheckResult(node=node, healthy=False, detail=f"slurmd state {info.state}")
        if (self.fault_dir / node).exists():
            return HealthCheckResult(node=node, healthy=False, detail="GPU fault still present")
        return HealthCheckResult(node=node, healthy=True, detail="slurmd responding, GPUs healthy")


class KubeSandboxProvider(SandboxProvider):
    """The sandbox provider with Kubernetes on: it also plays the node group (kwok Nodes)."""

    def __init__(
        self, slurm: SlurmBackend, sandbox_dir: Path, script: Path, root: Path | None, core: client.CoreV1Api
    ) -> None:
        super().__init__(slurm, sandbox_dir, script, root)
        self._core = core

    async def replace(
        self, node: str, key: str, earlier: ReplacementResult | None = None, hold: Hold | None = None
    ) -> ReplacementResult:
        new, already = await self._choose_spare(node, key, earlier)
        failed = await kube.call(self._core.read_node, node)
        pool = (failed.metadata.labels or {}).get(kube.POOL_LABEL, "default")
        try:
            await kube.call(self._core.create_node, kwok_node(new, pool))
        except ApiException as err:
            if err.status != 409:  # created by an earlier attempt
                raise
        await kube.wait_node_ready(self._core, new)
        if hold is not None:
            await hold(new)
        await self._start_spare(new)  # the new node's slurmd joins Slurm
        return ReplacementResult(failed_node=node, new_node=new, already_done=already)

    async def decommission(self, node: str, reason: str) -> str:
        msg = await super().decommission(node, reason)
        try:
            await kube.call(self._core.delete_node, node)
            return msg + f"; Kubernetes node {node} deleted"
        except ApiException as err:
            if err.status != 404:
                raise
            return msg + f"; Kubernetes node {node} already gone"


def build(ctx: ProviderContext) -> SandboxProvider:
    s = ctx.settings
    if s.sandbox_dir is None or s.sandbox_script is None:
        raise SettingsError(
            "GPUHEAL_PROVIDER=sandbox needs GPUHEAL_SLURM_DIR (the sandbox's directory) and "
            "GPUHEAL_SANDBOX_SCRIPT (infra/slurm/sandbox.sh): it drives the local sandbox only"
        )
    if ctx.kube is None:
        return SandboxProvider(ctx.slurm, s.sandbox_dir, s.sandbox_script, s.sandbox_root)
    # The sandbox's node group is the platform, not the worker: it may create Nodes.
    platform = kube.load_api(s.sandbox_kubeconfig) if s.sandbox_kubeconfig else ctx.kube
    return KubeSandboxProvider(ctx.slurm, s.sandbox_dir, s.sandbox_script, s.sandbox_root, client.CoreV1Api(platform))
