"""Every workflow id gpuheal gives, built and recognised here: each format is written once.

The ids carry the design: one incident per node (a second report joins the running one), one
coordinator per cluster, one recovery per failure of a job (every incident that saw it joins the
same one), one domain incident per failing domain. Operators type them (`gpuheal status
gpuheal-prod-gpu01`), Slurm's drain reasons name them, and recorded histories hold them
(tests/histories replay them), so a format never changes.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpuheal.core.models.slurm import JobSnapshot

PREFIX = "gpuheal-"

Kind = Literal["coordinator", "domain_incident", "job_recovery", "incident"]

# What follows "gpuheal-{cluster}-" for each kind. Ids are not parsed back into their kinds: a
# node may be named "fleet" or "job-1-2-r0", and a cluster's name may hold dashes.
FORMATS: dict[Kind, str] = {
    "coordinator": "fleet",
    "domain_incident": "domain-{slug}-{at}",
    "job_recovery": "job-{job_id}-{submit_time}-r{restart_count}",
    "incident": "{node}",
}


def _build(kind: Kind, cluster: str, **fields: object) -> str:
    return f"{PREFIX}{cluster}-{FORMATS[kind].format(**fields)}"


def incident_id(cluster: str, node: str) -> str:
    """One workflow per failed node: a second report for the node joins the running one."""
    return _build("incident", cluster, node=node)


def incident_prefix(cluster: str) -> str:
    """What every incident id of the cluster starts with."""
    return incident_id(cluster, "")


def coordinator_id(cluster: str) -> str:
    return _build("coordinator", cluster)


def deployment_name(cluster: str) -> str:
    """The cluster's Temporal Worker Deployment: its workers' versions (GPUHEAL_BUILD_ID) roll
    within it, one cluster's rollout never another's. (Not a workflow id; Temporal forbids "."
    and ":" in it, and a cluster name has neither.)"""
    return f"{PREFIX}{cluster}"


COORDINATOR_QUEUE_SUFFIX = "-coordinator"


def coordinator_queue(task_queue: str) -> str:
    """The coordinator's own task queue, from the cluster's (or from itself): its workflow tasks
    and its own activities (its rebuild, its looks, its notices), with pollers and slots of their
    own. In a storm the incidents' capacity requests fill the incidents' queue's activity slots
    while they wait for the coordinator, which could then never get the rebuild they wait for;
    and its workflow tasks, behind a thousand incidents' in one queue, waited a second each
    (issue 36), which every incident's grant waits for. (Not a workflow id.)"""
    return f"{workflows_queue(task_queue)}{COORDINATOR_QUEUE_SUFFIX}"


def workflows_queue(activity_queue: str) -> str:
    """The cluster's task queue, where its workflows run, from the queue one of their activities
    runs on (the coordinator's own, or the cluster's itself): a workflow an activity starts goes
    there. (A cluster's queue never ends in the suffix: the settings refuse it.)"""
    return activity_queue.removesuffix(COORDINATOR_QUEUE_SUFFIX)


def recovery_id(cluster: str, job: JobSnapshot) -> str:
    """One recovery per failure of a job: every incident that saw this failure (same job, same
    submission, same restart count) lands in the same one; a later failure is a new one."""
    return _build(
        "job_recovery", cluster, job_id=job.job_id, submit_time=job.submit_time, restart_count=job.restart_count
    )


def domain_incident_id(cluster: str, domain: str, at: datetime) -> str:
    """A domain ("gpuheal.io/rack=r7") as a slug, and when it was opened (to the second)."""
    slug = "".join(c if c.isalnum() else "-" for c in domain).strip("-").lower()
    return _build("domain_incident", cluster, slug=slug, at=f"{at:%Y%m%d%H%M%S}")


# What every id gpuheal gives is made of (a cluster's and a node's names, digits, dashes): an id an
# operator types is checked against it before it reaches a query or a file name.
_ID = re.compile(rf"^{PREFIX}[A-Za-z0-9._-]{{1,240}}$")


def check_id(text: str) -> str:
    if not _ID.match(text):
        raise ValueError(f"invalid incident id {text!r}")
    return text


def is_gpuheal_id(text: str) -> bool:
    """Whether an operator's argument is an id rather than a node name (of any cluster)."""
    return text.startswith(PREFIX)


def rejected_spare_run(first_run_id: str, node: str) -> str:
    """The run key a rejected spare is counted under at its coordinator (an arrival of its own,
    beside its incident's run): one per incident run and node, so a retry counts it once. The run
    id comes last: the repeat window's compact books keep a key's tail (repeats.run_key), which
    must tell two runs that rejected one node apart."""
    return f"rejected-{node}-{first_run_id}"
