"""The Slurm backend over Slurm's own commands (sinfo, squeue, scontrol, scancel), 22.05 to 26.05.

For a worker where Slurm's commands and munge are at hand (a login or admin node). The commands
must be the cluster's own version (22.05's client cannot talk to a 24.11 controller): set
SLURM_CONF, and GPUHEAL_SLURM_CLI_WRAPPER when they run elsewhere (e.g. ``chroot ROOT env ...``
in the sandbox's newer-Slurm roots, or ``ssh login01``).

At scale: one command per question, never one per job. From the v0.0.4x family on (23.11+)
``squeue -w NODE`` and ``squeue -j IDS`` filter in JSON mode, so only the jobs asked about come
back; 22.05 ignores filters in JSON mode, so there a question costs one full ``squeue --json``.
Hostlists are expanded in Python (clients/slurm/hostlist.py).

Every argument goes to the program as its own argv element (no shell), and node names are
validated before they get here (gpuheal.core.models.NodeName, check_node_name). A wrapper that
hands its arguments to a remote shell (``ssh``, which joins them with spaces) gets the command
quoted as one word per argument, so a drain reason with spaces or parentheses arrives whole.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable
from typing import Any

from gpuheal.clients import proc
from gpuheal.clients.slurm.base import JobUpdate, NodeOutOfService, NodeState, SlurmError, UnknownNode
from gpuheal.clients.slurm.hostlist import expand
from gpuheal.clients.slurm.parsers import V0038, parse_jobs, parse_node_line, parse_nodes, parse_topology, schema_of
from gpuheal.core.models.base import LIVE_JOB_STATES, check_node_name
from gpuheal.core.models.slurm import JobSnapshot, NodeInfo

# Wrappers that join their arguments into a remote shell's command line.
REMOTE_SHELLS = frozenset({"ssh", "autossh", "rsh"})
NO_SUCH_NODE = "Invalid node name"  # what squeue -w says of a node not in service (22.05 to 26.05)


def wrapped(wrapper: list[str], argv: tuple[str, ...]) -> list[str]:
    """The command line that runs argv through the wrapper, quoted where a remote shell reads it:
    wherever ssh appears in the wrapper (`ssh login01`, `sudo ssh ...`, `timeout 30 ssh ...`,
    `gcloud compute ssh ...`), its command line is one shell-quoted word per argument."""
    if any(os.path.basename(word) in REMOTE_SHELLS for word in wrapper):
        return [*wrapper, shlex.join(argv)]
    return [*wrapper, *argv]


class SlurmCli:
    def __init__(
        self, slurm_conf: str | None = None, wrapper: list[str] | None = None, timeout_s: float = 20.0
    ) -> None:
        self._env = dict(os.environ)
        if slurm_conf:
            self._env["SLURM_CONF"] = slurm_conf
        self._wrapper = wrapper or []
        self._timeout = timeout_s
        self._schema: str | None = None  # learnt from the first JSON answer
        self.calls = 0

    # --- running commands ------------------------------------------------------------------

    async def run(self, *argv: str, check: bool = True) -> tuple[int, str, str]:
        self.calls += 1
        try:
            done = await proc.run(wrapped(self._wrapper, argv), timeout_s=self._timeout, env=self._env, check=False)
        except proc.CommandTimedOut as err:
            raise SlurmError(str(err)) from err
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:3])} failed (exit {done.returncode}): {done.stderr}")
        return done.returncode, done.stdout, done.stderr

    async def _json(self, *argv: str, check: bool = True) -> dict[str, Any] | None:
        rc, out, _ = await self.run(*argv, "--json", check=check)
        if rc != 0 or not out.strip():
            return None
        data: dict[str, Any] = json.loads(out)
        self._schema = schema_of(data)
        return data

    async def _filters(self) -> bool:
        """Whether squeue filters in JSON mode (not 22.05's v0.0.38)."""
        if self._schema is None:
            await self._json("sinfo")
        return self._schema != V0038

    async def version(self) -> str:
        _, out, _ = await self.run("sinfo", "--version")
        return out.split()[-1]

    # --- nodes -----------------------------------------------------------------------------

    async def nodes(self) -> dict[str, NodeInfo]:
        """Every node in service, each with its own state and drain reason. 24.11 on, `sinfo
        --json` groups nodes by state and gives a group one node's reason (four drained nodes
        read as drained by the first one's incident: the coordinator then freed the others' slots
        as back in service); `scontrol show nodes --json` gives each node its own. 22.05's sinfo
        (v0.0.38) lists each node with its reason, and its scontrol has no JSON."""
        if self._schema is None or self._schema == V0038:
            data = await self._json("sinfo")  # (learns the schema on its first call)
            if self._schema == V0038 or data is None:
                return parse_nodes(data or {})
        return parse_nodes(await self._json("scontrol", "show", "nodes") or {})

    async def node(self, name: str) -> NodeInfo:
        check_node_name(name)
        if not await self._filters():  # 22.05: scontrol has no --json; its one-line text then
            rc, out, err = await self.run("scontrol", "-o", "show", "node", name, check=False)
            if "State=FUTURE" in out:
                raise NodeOutOfService(f"node {name!r} is not in service (State=FUTURE)")
            if rc != 0 and "not found" in (out + err):
                raise UnknownNode(f"Slurm has no node named {name!r}")
            info = parse_node_line(out.strip())
            if rc != 0 or info is None or info.name != name:
                raise SlurmError(f"scontrol show node {name} gave no node: {(out + err).strip()[:200]}")
            return info
        found = parse_nodes(await self._json("scontrol", "show", "node", name) or {})
        if name in found:
            return found[name]
        # Not in service: a FUTURE node (a spare, or one already replaced) or no node at all.
        future = parse_nodes(await self._json("scontrol", "--future", "show", "node", name) or {})
        if name in future:
            raise NodeOutOfService(f"node {name!r} is not in service (State={future[name].state.upper()})")
        raise UnknownNode(f"Slurm has no node named {name!r}")

    async def topology(self) -> dict[str, dict[str, str]]:
        """Each node's topology domains from Slurm (its leaf switch, its block); {} where the
        cluster has no topology plugin."""
        try:
            rc, out, _ = await self.run("scontrol", "show", "topology", check=False)
        except (OSError, SlurmError):  # no Slurm commands here (a slurmrestd worker): no domains
            return {}
        return parse_topology(out) if rc == 0 else {}

    async def update_node(self, name: str, state: NodeState, reason: str | None = None) -> None:
        fields = [f"state={state}", *([f"reason={reason}"] if reason else [])]
        await self.run("scontrol", "update", f"nodename={check_node_name(name)}", *fields)

    # --- jobs ------------------------------------------------------------------------------

    async def jobs_on_node(self, node: str) -> list[JobSnapshot]:
        check_node_name(node)
        if await self._filters():
            rc, out, err = await self.run("squeue", "-w", node, "--json", check=False)
            # Exit 1 for a node not in service says none runs there; any other failure (the
            # controller unreachable) says nothing, and "none" would let a caller take the node
            # out of Slurm, and its jobs with it.
            if rc != 0 and NO_SUCH_NODE not in err:
                raise SlurmError(f"squeue -w {node} failed (exit {rc}): {err.strip()}")
            jobs = parse_jobs(json.loads(out)) if rc == 0 and out.strip() else []
        else:
            jobs = parse_jobs(await self._json("squeue") or {})
        return [j for j in jobs if j.state in LIVE_JOB_STATES and node in expand(j.nodes)]

    async def job(self, job_id: int) -> JobSnapshot | None:
        found = await self.jobs([job_id])
        return found[0] if found else None

    async def mail_user(self, job_id: int) -> str:
        rc, out, _ = await self.run("scontrol", "show", "job", "-o", str(int(job_id)), check=False)
        if rc != 0:
            return ""
        found = next((f.split("=", 1)[1] for f in out.split() if f.startswith("MailUser=")), "")
        return "" if found == "(null)" else found

    async def jobs(self, job_ids: Iterable[int]) -> list[JobSnapshot]:
        wanted = sorted(set(job_ids))
        if not wanted:
            return []
        if await self._filters():
            data = await self._json("squeue", "-j", ",".join(map(str, wanted)), check=False)
            if data is None and len(wanted) > 1:  # one unknown id fails the whole query
                return [j for i in wanted for j in await self.jobs([i])]
            jobs = parse_jobs(data) if data else []
        else:
            jobs = parse_jobs(await self._json("squeue") or {})
        return [j for j in jobs if j.job_id in wanted]

    async def update_job(self, job_id: int, update: JobUpdate) -> None:
        fields = []
        if update.start_now:
            fields.append("starttime=now")
        if update.excluded_nodes is not None:
            fields.append("excnodelist=" + ",".join(check_node_name(n) for n in update.excluded_nodes))
        if fields:
            await self.run("scontrol", "update", f"jobid={job_id}", *fields)

    async def requeue(self, job_id: int, failed_node: str, hold: bool = False) -> None:
        await self.run("scontrol", "requeuehold" if hold else "requeue", str(job_id))

    async def hold(self, job_id: int) -> None:
        await self.run("scontrol", "hold", str(job_id))

    async def signal_job(self, job_id: int, signal: str, batch_only: bool) -> None:
        # scancel signals the job's steps by default; --batch only its batch script.
        await self.run("scancel", f"--signal={signal}", *(["--batch"] if batch_only else []), str(job_id))
