"""A thin async client for Slurm's command-line tools (Slurm 22.05 here).

Why the CLI and not pyslurm or slurmrestd: pyslurm does not build against Debian 12's Slurm 22.05,
and slurmrestd's v0.0.38 API has no node update (shared/REFERENCE.md). Reads use `--json` where
22.05 has it (sinfo, squeue; both ignore their filters in JSON mode, so we filter here).

Every argument goes to the program as its own argv element (no shell), and node names are
validated before they get here (gpuheal.models.NodeName).
"""

from __future__ import annotations

import json
import os
from typing import Any

from clients import proc
from gpuheal.models import LIVE_JOB_STATES, JobSnapshot, NodeInfo, check_node_name
from gpuheal.progress import parse_progress


class SlurmError(RuntimeError):
    """A Slurm command failed; retrying may help (slurmctld busy or restarting)."""


class UnknownNode(LookupError):
    """Slurm has no node of that name."""


class NodeOutOfService(LookupError):
    """The node is defined but not in service (State=FUTURE: a spare, or already replaced)."""


class SlurmClient:
    def __init__(self, slurm_conf: str | None = None, timeout_s: float = 20.0) -> None:
        self._env = dict(os.environ)
        if slurm_conf:
            self._env["SLURM_CONF"] = slurm_conf
        self._timeout = timeout_s

    async def run(self, *argv: str, check: bool = True) -> tuple[int, str, str]:
        try:
            done = await proc.run(list(argv), timeout_s=self._timeout, env=self._env, check=False)
        except proc.CommandTimedOut as err:
            raise SlurmError(str(err)) from err
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:3])} failed (exit {done.returncode}): {done.stderr}")
        return done.returncode, done.stdout, done.stderr

    async def _json(self, *argv: str) -> dict[str, Any]:
        _, out, _ = await self.run(*argv)
        data: dict[str, Any] = json.loads(out)
        return data

    # --- nodes -----------------------------------------------------------------------------

    async def nodes(self) -> dict[str, NodeInfo]:
        """Nodes in service (sinfo hides FUTURE nodes)."""
        return parse_sinfo(await self._json("sinfo", "--json"))

    async def node(self, node: str) -> NodeInfo:
        """One node in service; raises UnknownNode / NodeOutOfService with a message naming it."""
        check_node_name(node)
        info = (await self.nodes()).get(node)
        if info is not None:
            return info
        rc, out, err = await self.run("scontrol", "-o", "show", "node", node, check=False)
        if rc != 0 and "not found" in (out + err):
            raise UnknownNode(f"Slurm has no node named {node!r}")
        if "State=FUTURE" in out:
            raise NodeOutOfService(f"node {node!r} is not in service (State=FUTURE)")
        if rc != 0:
            raise SlurmError(f"scontrol show node {node} failed: {err}")
        raise SlurmError(f"node {node!r} is defined but sinfo does not list it: {out.strip()}")

    async def update_node(self, node: str, **fields: str) -> None:
        check_node_name(node)
        await self.run("scontrol", "update", f"nodename={node}", *(f"{k}={v}" for k, v in fields.items()))

    # --- jobs ------------------------------------------------------------------------------

    async def hostnames(self, hostlist: str) -> list[str]:
        if not hostlist:
            return []
        if "[" not in hostlist and "," not in hostlist:
            return [hostlist]
        _, out, _ = await self.run("scontrol", "show", "hostnames", hostlist)
        return out.split()

    async def jobs(self) -> list[JobSnapshot]:
        return parse_squeue(await self._json("squeue", "--json"))

    async def jobs_on_node(self, node: str) -> list[JobSnapshot]:
        found = []
        for job in await self.jobs():
            if job.state in LIVE_JOB_STATES and node in (await self.hostnames(job.nodes)):
                found.append(job)
        return found

    async def job(self, job_id: int) -> JobSnapshot | None:
        for job in await self.jobs():
            if job.job_id == job_id:
                return job
        return None

    async def update_job(self, job_id: int, **fields: str) -> None:
        await self.run("scontrol", "update", f"jobid={job_id}", *(f"{k}={v}" for k, v in fields.items()))

    async def requeue(self, job_id: int) -> None:
        await self.run("scontrol", "requeue", str(job_id))

    async def signal_batch(self, job_id: int, signal: str) -> None:
        await self.run("scancel", f"--signal={signal}", "--batch", str(job_id))


def parse_sinfo(data: dict[str, Any]) -> dict[str, NodeInfo]:
    """`sinfo --json` into the project's node model (the one reader of Slurm's node JSON)."""
    return {
        n["name"]: NodeInfo(
            name=n["name"],
            state=str(n.get("state", "")).lower(),
            flags=tuple(n.get("state_flags") or ()),
            reason=n.get("reason") or "",
        )
        for n in data.get("nodes", [])
    }


def parse_squeue(data: dict[str, Any]) -> list[JobSnapshot]:
    """`squeue --json` into the project's job model (the one reader of Slurm's job JSON)."""
    return [_job_snapshot(j) for j in data.get("jobs", [])]


def _job_snapshot(j: dict[str, Any]) -> JobSnapshot:
    return JobSnapshot(
        job_id=int(j["job_id"]),
        name=str(j.get("name", "")),
        state=str(j.get("job_state", "")),
        state_reason=str(j.get("state_reason") or ""),
        nodes=str(j.get("nodes", "")),
        node_count=int(j.get("node_count") or 1),
        requeueable=bool(j.get("requeue", False)),
        restart_count=int(j.get("restart_cnt") or 0),
        excluded_nodes=str(j.get("excluded_nodes") or ""),
        required_nodes=str(j.get("required_nodes") or ""),
        progress=parse_progress(j.get("comment")),
    )
