"""Node providers: how a cluster repairs a node or gets a new one.

The workflow only says *what* (repair this node, replace that one); a provider knows *how* on a
given platform. The sandbox provider drives the local Slurm sandbox (infra/slurm/sandbox.sh):
a replacement is a spare node (State=FUTURE) whose slurmd it starts. A cloud provider would call
its API here; a Kubernetes provider deletes the Node so the node group makes a new one.

Every method is idempotent: it reads the current state (and its own record of what it did for
this incident) before it acts, so a retried activity never takes a second spare.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Protocol

from activities.slurm import SlurmClient, SlurmError, check_node_name
from gpuheal.models import ActionClass, HealthCheckResult, ReplacementResult


class NodeProvider(Protocol):
    async def repair(self, node: str, action: ActionClass) -> str:
        """Reset the GPU or reboot the node; returns what was done."""
        ...

    async def replace(self, node: str, incident_id: str) -> ReplacementResult:
        """Bring a healthy node into the cluster in place of `node`; returns it once it serves."""
        ...

    async def decommission(self, node: str, reason: str) -> str:
        """Take `node` out of the cluster for good (it goes for repair or RMA)."""
        ...

    async def check_health(self, node: str) -> HealthCheckResult: ...


class NoSpareCapacity(RuntimeError):
    pass


class SandboxProvider:
    """Spare-node replacement and simulated GPU reset/reboot on the Slurm sandbox."""

    def __init__(self, slurm: SlurmClient, sandbox_dir: Path, script: Path) -> None:
        self._slurm = slurm
        self._dir = sandbox_dir
        self._script = script
        self._record = sandbox_dir / "provider" / "replacements.json"
        self.fault_dir = sandbox_dir / "faults"

    # --- sandbox process control ---------------------------------------------------------

    async def _sandbox(self, verb: str, node: str) -> None:
        await self._slurm.run("env", f"GPUHEAL_SLURM_DIR={self._dir}", str(self._script), verb, check_node_name(node))

    async def _wait_serving(self, node: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = (await self._slurm.nodes()).get(node)
            if info and info.state in {"idle", "mixed", "allocated"} and "NOT_RESPONDING" not in info.flags:
                return
            await asyncio.sleep(0.25)
        raise SlurmError(f"node {node} did not register with slurmctld within {timeout_s:.0f} s")

    def spares(self) -> list[str]:
        conf = (self._dir / "slurm.conf").read_text()
        return re.findall(r"^NodeName=(\S+) .*State=FUTURE", conf, flags=re.M)

    def _load(self) -> dict[str, str]:
        return json.loads(self._record.read_text()) if self._record.exists() else {}

    # --- NodeProvider --------------------------------------------------------------------

    async def repair(self, node: str, action: ActionClass) -> str:
        # The sandbox's "GPU" is healthy again once its fault marker is gone.
        (self.fault_dir / node).unlink(missing_ok=True)
        if action == ActionClass.REBOOT_NODE:
            await self._sandbox("stop-node", node)
            await self._sandbox("start-node", node)
            await self._wait_serving(node)
            return f"rebooted {node} (slurmd restarted, GPU fault cleared)"
        return f"reset the GPUs of {node} (GPU fault cleared)"

    async def replace(self, node: str, incident_id: str) -> ReplacementResult:
        new, already = await self._choose_spare(node, incident_id)
        await self._start_spare(new)
        return ReplacementResult(failed_node=node, new_node=new, already_done=already)

    async def _choose_spare(self, node: str, incident_id: str) -> tuple[str, bool]:
        record = self._load()
        new = record.get(incident_id)
        already = new is not None
        if new is None:
            in_service = await self._slurm.nodes()
            used = set(record.values())
            free = [s for s in self.spares() if s not in in_service and s not in used and s != node]
            if not free:
                raise NoSpareCapacity(f"no spare node left to replace {node}")
            new = free[0]
            # Record the choice before acting: a retry after a crash reuses this spare.
            record[incident_id] = new
            self._record.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._record.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1))
            tmp.replace(self._record)
        return new, already

    async def _start_spare(self, new: str) -> None:
        await self._sandbox("start-node", new)
        await self._wait_serving(new)

    async def decommission(self, node: str, reason: str) -> str:
        await self._sandbox("stop-node", node)
        if node not in await self._slurm.nodes():
            return f"{node} already out of the cluster"
        # A node with jobs cannot go straight to FUTURE; DOWN ends what still runs there
        # (only jobs that could not be requeued, and those are in the incident's result).
        await self._slurm.update_node(node, state="down", reason=reason)
        await self._slurm.update_node(node, state="future")
        return f"{node} left the cluster (State=FUTURE)"

    async def check_health(self, node: str) -> HealthCheckResult:
        info = (await self._slurm.nodes()).get(node)
        if info is None:
            return HealthCheckResult(node=node, healthy=False, detail="not in service")
        if "NOT_RESPONDING" in info.flags or info.state == "down":
            return HealthCheckResult(node=node, healthy=False, detail=f"slurmd state {info.state}")
        if (self.fault_dir / node).exists():
            return HealthCheckResult(node=node, healthy=False, detail="GPU fault still present")
        return HealthCheckResult(node=node, healthy=True, detail="slurmd responding, GPUs healthy")
