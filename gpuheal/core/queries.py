"""Visibility queries (`list_workflows`, `count_workflows`), built from typed keys, values quoted.

Every attribute comes from gpuheal.core.search_attributes (ours) or the system attributes below,
never spelled by hand, and every value goes through `literal`: a string is double-quoted with its
backslashes and quotes escaped, so no value (an alert key, a node name from a payload) can close
the string and add a clause of its own. Node names are also checked before they get this far
(check_node_name); this is the guard for every other value.

    where(of_type(INCIDENT), eq(sa.CLUSTER, "prod"), eq(sa.NODE, "gpu01"), status("Running"))
    -> 'WorkflowType="GpuRemediation" AND Cluster="prod" AND NodeName="gpu01" AND ExecutionStatus="Running"'
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, NewType, TypeVar

from temporalio.common import SearchAttributeKey

from gpuheal.core.messages import Workflow

# One condition; only the functions here make one, and `where` takes only these.
Term = NewType("Term", str)

# Temporal's own attributes (every workflow has them: never registered, not in search_attributes.ALL).
WORKFLOW_TYPE = SearchAttributeKey.for_keyword("WorkflowType")
WORKFLOW_ID = SearchAttributeKey.for_keyword("WorkflowId")
TASK_QUEUE = SearchAttributeKey.for_keyword("TaskQueue")
EXECUTION_STATUS = SearchAttributeKey.for_keyword("ExecutionStatus")
START_TIME = SearchAttributeKey.for_datetime("StartTime")
CLOSE_TIME = SearchAttributeKey.for_datetime("CloseTime")
# "DEPLOYMENT:BUILD" a versioned workflow runs on (pinned) or last ran on (auto-upgrade).
DEPLOYMENT_VERSION = SearchAttributeKey.for_keyword("TemporalWorkerDeploymentVersion")

# ExecutionStatus as visibility spells it.
Status = Literal["Running", "Completed", "Failed", "Canceled", "Terminated", "ContinuedAsNew", "TimedOut"]

T = TypeVar("T", str, int, datetime)


def literal(value: str | int | datetime) -> str:
    """A value as the query language reads it: numbers bare, strings and times double-quoted."""
    if isinstance(value, bool):  # an int to Python, not to Temporal
        raise TypeError("no boolean attributes are queried")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"a naive time is ambiguous in a query: {value.isoformat()}")
        value = value.isoformat()
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def eq(key: SearchAttributeKey[T], value: T) -> Term:
    return Term(f"{key.name}={literal(value)}")


def ne(key: SearchAttributeKey[T], value: T) -> Term:
    return Term(f"{key.name}!={literal(value)}")


def contains(key: SearchAttributeKey[Sequence[str]], value: str) -> Term:
    """A keyword list holding `value` (visibility's `=` on a list matches any element)."""
    return Term(f"{key.name}={literal(value)}")


def after(key: SearchAttributeKey[datetime], at: datetime) -> Term:
    return Term(f"{key.name} > {literal(at)}")


def of_type(workflow: Workflow[Any, Any]) -> Term:
    return eq(WORKFLOW_TYPE, workflow.name)


def status(s: Status) -> Term:
    return eq(EXECUTION_STATUS, s)


def not_status(s: Status) -> Term:
    return Term(f"{EXECUTION_STATUS.name}!={literal(s)}")


def any_of(*terms: Term) -> Term:
    """Any of them (OR, parenthesised so it narrows as one term): a board's several serials."""
    if not terms:
        raise ValueError("any_of needs at least one term")
    return Term("(" + " OR ".join(terms) + ")")


def where(*terms: Term) -> str:
    """All of them (AND); an OR is one term (any_of)."""
    if not terms:
        raise ValueError("a query needs at least one term")
    return " AND ".join(terms)
