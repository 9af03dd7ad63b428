"""Slurm's JSON into the project's models, one parser per schema family.

Slurm names its JSON schema in ``meta.plugin.data_parser`` (23.02 and later) or
``meta.plugin.type`` (22.05: ``openapi/v0.0.38``). Two families differ in shape:

- v0.0.38 (Slurm 22.05): ``sinfo`` lists ``nodes`` with ``state`` a string and ``state_flags``;
  ``squeue`` has ``job_state`` a string and ``node_count`` an integer.
- v0.0.40 to v0.0.45 (Slurm 23.11 to 26.05; tested on 24.11's v0.0.42 and 26.05's v0.0.45, from
  the CLI and from slurmrestd): node ``state`` a list (``["ALLOCATED", "DRAIN"]``), ``sinfo``
  groups under ``sinfo`` with the reason an object; ``job_state`` a list, ``node_count`` an
  object ``{set, infinite, number}``.

Any other version is refused with an error that names it, never guessed at.
The captured outputs these are tested on live in tests/data/slurm/<version>/.
"""

from __future__ import annotations

import re
from typing import Any

from gpuheal.clients.slurm.base import UnknownSchema
from gpuheal.clients.slurm.hostlist import expand
from gpuheal.core.models.slurm import JobSnapshot, NodeInfo
from gpuheal.core.progress import parse_progress

V0038 = "v0.0.38"
V004X = ("v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
KNOWN = (V0038, *V004X)


def schema_of(data: dict[str, Any]) -> str:
    """The schema version of a Slurm JSON reply, e.g. v0.0.42; UnknownSchema when unread."""
    plugin = (data.get("meta") or {}).get("plugin") or {}
    named = plugin.get("data_parser") or plugin.get("type") or ""
    version = named.rsplit("/", 1)[-1]
    if version not in KNOWN:
        raise UnknownSchema(
            f"Slurm {_release(data)} answered with JSON schema {named or '(none named)'!r}: gpuheal reads "
            f"{V0038} (Slurm 22.05) and {V004X[0]} to {V004X[-1]} (Slurm 23.11 to 26.05); "
            "upgrade gpuheal, or capture this version's output (tests/data/slurm/capture.sh) and add it"
        )
    return version


def _release(data: dict[str, Any]) -> str:
    meta = data.get("meta") or {}
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    return str(slurm.get("release") or "(release unknown)")


def _number(value: Any, default: int = 0) -> int:
    """An integer, or v0.0.4x's {set, infinite, number}."""
    if isinstance(value, dict):
        return int(value.get("number") or default) if value.get("set", True) else default
    return int(value) if value is not None else default


def _text(value: Any) -> str:
    """A string, or v0.0.4x sinfo's {description, time, user}."""
    if isinstance(value, dict):
        return str(value.get("description") or "")
    return str(value or "")


def _states(value: Any) -> list[str]:
    return [str(s) for s in value] if isinstance(value, list) else [str(value)] if value else []


# --- nodes -----------------------------------------------------------------------------------


def parse_nodes(data: dict[str, Any]) -> dict[str, NodeInfo]:
    """`sinfo --json`, `scontrol show nodes --json` or slurmrestd's nodes, any known schema."""
    version = schema_of(data)
    found: dict[str, NodeInfo] = {}
    if version == V0038:
        for n in data.get("nodes") or []:
            found[n["name"]] = NodeInfo(
                name=n["name"],
                state=str(n.get("state", "")).lower(),
                flags=tuple(n.get("state_flags") or ()),
                reason=_text(n.get("reason")),
                partitions=tuple(n.get("partitions") or ()),
            )
        return found
    if "sinfo" in data:  # sinfo groups nodes by state, partition, reason
        for group in data.get("sinfo") or []:
            states = _states((group.get("node") or {}).get("state"))
            partition = (group.get("partition") or {}).get("name") or ""
            for name in (group.get("nodes") or {}).get("nodes") or []:
                known = found[name].partitions if name in found else ()
                parts = known + ((partition,) if partition and partition not in known else ())
                found[name] = _node_4x(name, states, group.get("reason"), parts)
        return found
    for n in data.get("nodes") or []:
        found[n["name"]] = _node_4x(
            n["name"], _states(n.get("state")), n.get("reason"), tuple(n.get("partitions") or ())
        )
    return found


_STATE = re.compile(r"(?:^| )State=(\S+)")
_PARTITIONS = re.compile(r"(?:^| )Partitions=(\S*)")
_REASON = re.compile(r"(?:^| )Reason=(.*?)(?: \[[^\]]*\])?\s*$")


def parse_node_line(line: str) -> NodeInfo | None:
    """One node from `scontrol -o show node NAME` (22.05 has no JSON there): the same fields as
    its `sinfo --json` gives, read from one node instead of the whole cluster. Reason is last on
    the line (it may hold spaces), ending in `[user@time]`."""
    name = re.match(r"NodeName=(\S+)", line)
    state = _STATE.search(line)
    if name is None or state is None:
        return None
    base, *flags = state.group(1).split("+")
    parts = _PARTITIONS.search(line)
    reason = _REASON.search(line)
    return NodeInfo(
        name=name.group(1),
        state=base.rstrip("*").lower(),
        flags=tuple(flags),
        reason=reason.group(1) if reason else "",
        partitions=tuple(p for p in (parts.group(1) if parts else "").split(",") if p),
    )


def _node_4x(name: str, states: list[str], reason: Any, partitions: tuple[str, ...]) -> NodeInfo:
    base = states[0].lower() if states else ""
    return NodeInfo(name=name, state=base, flags=tuple(states[1:]), reason=_text(reason), partitions=partitions)


# --- jobs ------------------------------------------------------------------------------------


def parse_jobs(data: dict[str, Any]) -> list[JobSnapshot]:
    """`squeue --json`, `scontrol show job --json` or slurmrestd's jobs, any known schema."""
    schema_of(data)
    return [_job(j) for j in data.get("jobs") or []]


def _job(j: dict[str, Any]) -> JobSnapshot:
    states = _states(j.get("job_state"))
    nodes = str(j.get("nodes") or "")
    # The larger of Slurm's count and its node list: a count left out (or 0) must never make a
    # job on several nodes look like a one-node job (its recovery would not wait for the others).
    node_count = max(_number(j.get("node_count"), 1) or 1, len(expand(nodes)) if nodes else 1)
    return JobSnapshot(
        job_id=int(j["job_id"]),
        name=str(j.get("name", "")),
        state=states[0] if states else "",
        state_flags=tuple(states[1:]),
        state_reason=str(j.get("state_reason") or ""),
        nodes=nodes,
        node_count=node_count,
        requeueable=bool(j.get("requeue", False)),
        restart_count=_number(j.get("restart_cnt")),
        excluded_nodes=str(j.get("excluded_nodes") or ""),
        required_nodes=str(j.get("required_nodes") or ""),
        user=str(j.get("user_name") or ""),
        mail_user=str(j.get("mail_user") or ""),
        account=str(j.get("account") or ""),
        submit_time=_number(j.get("submit_time")),
        submit_line=str(j.get("submit_line") or ""),
        progress=parse_progress(j.get("comment")),
    )


def parse_topology(text: str) -> dict[str, dict[str, str]]:
    """`scontrol show topology` to each node's domains: its leaf switch (topology/tree: the
    switches of level 0) and its block (topology/block, 23.11+). Empty without a plugin."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "Nodes" not in fields or fields["Nodes"] in ("", "(null)"):
            continue
        if "SwitchName" in fields and fields.get("Level", "0") == "0":
            key, name = "switch", fields["SwitchName"]
        elif "BlockName" in fields:
            key, name = "block", fields["BlockName"]
        else:
            continue
        for node in expand(fields["Nodes"]):
            found.setdefault(node, {})[key] = name
    return found
