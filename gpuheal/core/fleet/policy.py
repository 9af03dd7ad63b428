"""The cluster's policy, declared once: mode, approval, disruption budget, breaker, escalation,
repeat offenders, containment while held; each field's default and environment variable on it
(gpuheal.core.envvars). The coordinator (workflows/fleet.py) holds one VersionedPolicy and changes
it only by a recorded update; its decisions are gpuheal.core.fleet."""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from gpuheal.core.envvars import setting
from gpuheal.core.models.base import Frozen, OperatorName
from gpuheal.core.models.incident import ApprovalPolicy

Mode = Literal["observe", "approve", "auto"]
_LIMIT = re.compile(r"^(\d+|\d+(\.\d+)?%)$")  # a whole count, or a share (which may have decimals)


def limit_of(spec: str, total: int) -> int:
    """ "3" is 3 nodes; "5%" is 5 % of `total`, rounded down, and at least 1 (a positive share of a
    small cluster must still let one node go); "0" or "0%" is none: every incident is held."""
    if spec.endswith("%"):
        share = float(spec[:-1])
        return max(1, math.floor(share / 100 * total)) if share > 0 else 0
    return int(spec)


class BudgetPolicy(Frozen):
    """How much capacity gpuheal may have out of service at once, and how fast it may take it."""

    # A budget of 3 in a YAML file (the chart's values) is a number: read it as the text "3".
    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)

    cluster: str = setting(
        "GPUHEAL_BUDGET",
        "10%",
        "nodes out of service because of gpuheal at once, a count (`3`) or a share (`5%`) of the cluster",
    )
    per_pool: str | None = setting(
        "GPUHEAL_BUDGET_PER_POOL",
        None,
        "the same per pool: the `gpuheal.io/pool` Node label, else the node's first Slurm partition",
    )
    per_domain: str | None = setting(
        "GPUHEAL_BUDGET_PER_DOMAIN",
        None,
        "the same per topology domain: the Node labels in `GPUHEAL_DOMAIN_LABELS` (rack, NVLink domain, switch)",
    )
    rate: int = setting("GPUHEAL_RATE", 20, "new remediations ...", ge=1)
    rate_window_s: float = setting("GPUHEAL_RATE_WINDOW_S", 3600.0, "... per this window", gt=0)
    node_cooldown_s: float = setting(
        "GPUHEAL_NODE_COOLDOWN_S", 1800.0, "a node's next remediation waits this long after gpuheal gave it back", ge=0
    )

    @field_validator("cluster", "per_pool", "per_domain")
    @classmethod
    def _limit(cls, v: str | None) -> str | None:
        return check_limit(v)


def check_limit(v: str | None) -> str | None:
    if v is not None and not _LIMIT.match(v):
        raise ValueError(f"{v!r} is not a count (3) or a share (5%)")
    return v


class BreakerPolicy(Frozen):
    """Trips when more than `max_incidents` new incidents arrive within `window_s`, or more than
    `domain_share` of one domain; never resets by itself."""

    max_incidents: int = setting(
        "GPUHEAL_BREAKER_MAX", 10, "more new incidents than this within the window trips the circuit breaker", ge=1
    )
    window_s: float = setting("GPUHEAL_BREAKER_WINDOW_S", 300.0, "... the breaker's window", gt=0)
    domain_share: float = setting(
        "GPUHEAL_BREAKER_DOMAIN_SHARE", 0.75, "... as does more than this share of one domain", gt=0, le=1
    )


class EscalationPolicy(Frozen):
    """At least `domain_share` of a domain's nodes reporting within `window_s` (and at least
    `min_nodes` of them) is one domain incident (switch, power, cooling), not N replacements."""

    domain_share: float = setting(
        "GPUHEAL_ESCALATION_SHARE",
        0.5,
        "this share of a domain reporting within the window opens one domain incident",
        gt=0,
        le=1,
    )
    window_s: float = setting("GPUHEAL_ESCALATION_WINDOW_S", 300.0, "... the escalation's window", gt=0)
    min_nodes: int = Field(default=2, ge=2)


class RepeatPolicy(Frozen):
    """A node (or a GPU, by its serial or UUID) with `incidents` incidents within `window_s` is
    replaced. Where the reports name the board's serial, the count follows the board."""

    incidents: int = setting(
        "GPUHEAL_REPEAT_INCIDENTS",
        3,
        "the Nth incident of a node (of a GPU, by serial where known, else UUID) within the window replaces it",
        ge=2,
    )
    window_s: float = setting("GPUHEAL_REPEAT_WINDOW_S", 7 * 24 * 3600.0, "... the repeat window", gt=0)


class FleetPolicy(Frozen):
    """The cluster's policy: every incident runs under it, whoever sent the report."""

    # A budget of 3 in a YAML file (the chart's values) is a number: read it as the text "3".
    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)

    mode: Mode = setting(
        "GPUHEAL_MODE",
        "auto",
        "`observe`: triage and plan, record the actions it would take, touch nothing. `approve`: every action "
        "class waits for a human. `auto`: approval only for `GPUHEAL_APPROVAL_REQUIRED`",
    )
    approval: ApprovalPolicy = ApprovalPolicy()
    budget: BudgetPolicy = BudgetPolicy()
    breaker: BreakerPolicy = BreakerPolicy()
    escalation: EscalationPolicy = EscalationPolicy()
    repeat: RepeatPolicy = RepeatPolicy()
    containment_while_held: Literal["drain", "none"] = setting(
        "GPUHEAL_HELD_CONTAINMENT",
        "drain",
        "while held: `drain` (nothing new lands on the node, nothing replaced; within "
        "`GPUHEAL_HELD_CONTAINMENT_LIMIT`, and never while the breaker is tripped) or `none` (touch nothing)",
    )
    containment_limit: str = setting(
        "GPUHEAL_HELD_CONTAINMENT_LIMIT",
        "10%",
        "held incidents' nodes drained as containment at once, a count or a share of the cluster, beside "
        "`GPUHEAL_BUDGET` (with its default, at most 20 % of the cluster out because of gpuheal)",
    )
    duplicate_window_s: float = setting(
        "GPUHEAL_DUPLICATE_WINDOW_S",
        600.0,
        "a report of the same failure (XID or signal, same GPU) while its node is still out of service from the "
        "incident that handled it, within this long of that close, starts nothing and names that incident (the same "
        "alert never starts one); applied by the webhook and CLI that receive it, not asked of the coordinator",
        ge=0,
    )
    max_hold_s: float = setting(
        "GPUHEAL_MAX_HOLD_S",
        6 * 3600.0,
        "a held incident ends `not_granted` (node left as it is, jobs accounted for) after this long",
        gt=0,
    )

    @field_validator("containment_limit")
    @classmethod
    def _containment(cls, v: str) -> str:
        check_limit(v)
        return v


class PolicyChange(Frozen):
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)
    policy: FleetPolicy
    # The version the change was made against (`gpuheal policy apply` reads, merges, sends): a
    # change made meanwhile by someone else is refused rather than silently overwritten.
    expected_version: int | None = None


class ModeChange(Frozen):
    operator: OperatorName
    reason: str = Field(min_length=1, max_length=500)
    mode: Mode


class ConfiguredPolicy(Frozen):
    """A worker's configured policy, offered to its cluster when it starts (see steering.configure)."""

    policy: FleetPolicy
    digest: str  # gpuheal.core.fleet.policy_file.digest(policy)
    by: str = Field(min_length=1, max_length=200)  # which worker: host and pid


class VersionedPolicy(Frozen):
    version: int
    policy: FleetPolicy
    changed_by: str
    reason: str
    at: datetime


def policy_key(p: VersionedPolicy) -> str:
    """Names one version of a coordinator's policy: its number and when it was set (a coordinator
    recreated from nothing counts its versions from 1 again, at another moment)."""
    return f"{p.version}@{p.at.isoformat()}"
