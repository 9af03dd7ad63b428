"""A more severe report after the plan was set: never swallowed.

Until the plan is read for the last time (after protect_progress) a more severe report
escalates it in place. After that (`IncidentState.planned`) a report that asks for more
(an XID 79 while a restart_app incident verifies its job, or while an ignored XID 63 closes) is
the follow-up's. The run stops waiting for its jobs' answers at once and closes `followed_up`
without returning the node to service: a node it never drained stays in service, one it drained
stays drained (counted, taken over by the follow-up's grant). A report that comes while it
returns the node is acted on once that ends, unless that return replaced the node already. As
it closes the run continues as new, in the same incident, with the severe report first: the follow-up run
triages, is admitted and acts on it like any start. Its holdings stay the incident's (its chain
from the first run id, as the coordinator's reaper reads it; the run before released its own);
its notices are its own.
"""

from __future__ import annotations

from temporalio import workflow

from gpuheal.workflows.incident.state import IncidentState

with workflow.unsafe.imports_passed_through():
    from gpuheal.core import policy
    from gpuheal.core import search_attributes as sa
    from gpuheal.core.models.base import Stage
    from gpuheal.core.models.incident import RemediationInput

# Runs before this release recorded such a report and did nothing with it.
LATE_SEVERE_FOLLOWS = "a-more-severe-report-after-the-plan-starts-a-follow-up-run"


def notice_key(inp: RemediationInput, info: workflow.Info) -> str:
    """The run part of its notices' keys: the first run's id, and a follow-up's own beside it
    (its "remediating" is news to a receiver that dedupes, not a repeat of the first run's)."""
    first = info.first_execution_run_id
    return first if inp.follows is None else f"{first}+{info.run_id}"


def outgrows(s: IncidentState) -> bool:
    """Whether the reports now ask for more than the plan this run set, too late to change it.
    Pure: the action of every report (the most severe wins) against the run's action."""
    if s.follow_up is not None or not s.planned or s.action is None or s.observing:
        return False
    return policy.asks_more(policy.triage_all(s.reports).action, s.action)


def due(s: IncidentState) -> bool:
    """Whether a follow-up run is still wanted as this run closes: the report still asks for more
    than what this run ended doing (a failed health check may have replaced the node since)."""
    if s.follow_up is None:
        return False
    if s.replacement is not None and s.replacement.new_node is not None:
        return False  # the node is gone: a report for it is late, not news
    return policy.asks_more(policy.triage_all(s.reports).action, s.current_action())


def continue_as_follow_up(s: IncidentState) -> None:
    """Raise Temporal's continue-as-new: the same incident, a new run, the severe report first
    and every report after it. This run keeps only the alerts it acted on: a re-send of one it
    passed on is the follow-up's (gpuheal.core.dedupe)."""
    assert s.follow_up is not None
    cut = s.reports.index(s.follow_up)
    late = s.reports[cut:]
    workflow.upsert_search_attributes([sa.ALERT_KEYS.value_set(sa.alert_keys(s.reports[:cut]))])
    workflow.continue_as_new(
        RemediationInput(report=late[0], also=tuple(late[1:]), follows=workflow.info().run_id),
        search_attributes=sa.of_incident(late, Stage.TRIAGE.value),
    )
