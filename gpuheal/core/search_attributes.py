"""Custom search attributes that make incidents findable in the Temporal UI and CLI, e.g.
``temporal workflow list --query 'NodeName="gpu01" AND Stage="approval"'``.

This is the one list: the dev server registers them at start from
``python -m gpuheal.core.search_attributes`` (infra/temporal/dev-server.sh), and the tests'
time-skipping server from ``ALL``. On a production namespace, register them once with
``temporal operator search-attribute create`` and the same names and types.
"""

from collections.abc import Sequence
from typing import Any

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from gpuheal.core.models.report import HealthReport

NODE = SearchAttributeKey.for_keyword("NodeName")
CLUSTER = SearchAttributeKey.for_keyword("Cluster")
XID = SearchAttributeKey.for_int("Xid")
STAGE = SearchAttributeKey.for_keyword("Stage")
ACTION = SearchAttributeKey.for_keyword("Action")
JOB_ID = SearchAttributeKey.for_int("JobId")  # on job recoveries: `JobId=12` finds a job's history
BORROWED = SearchAttributeKey.for_keyword("BorrowedNode")  # an incident's node borrowed from inference
ALERT_KEYS = SearchAttributeKey.for_keyword_list("AlertKeys")  # fingerprint@startsAt of its alerts
# The serials of the GPUs its reports named: a board's history across nodes, renames, re-images.
GPU_SERIALS = SearchAttributeKey.for_keyword_list("GpuSerials")

ALL = (NODE, CLUSTER, XID, STAGE, ACTION, JOB_ID, BORROWED, ALERT_KEYS, GPU_SERIALS)


def of_incident(reports: Sequence[HealthReport], stage: str) -> TypedSearchAttributes:
    """An incident's attributes as it starts: its node, what failed (the first report's XID), the
    alerts and GPU serials its reports name. A start and a follow-up run set the same ones."""
    first = reports[0]
    attrs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(NODE, first.node),
        SearchAttributePair(CLUSTER, first.cluster),
        SearchAttributePair(STAGE, stage),
    ]
    if first.xid is not None:
        attrs.append(SearchAttributePair(XID, first.xid))
    if keys := alert_keys(reports):
        attrs.append(SearchAttributePair(ALERT_KEYS, keys))
    if named := serials(reports):
        attrs.append(SearchAttributePair(GPU_SERIALS, named))
    return TypedSearchAttributes(attrs)


def alert_keys(reports: Sequence[HealthReport]) -> list[str]:
    """The alerts (fingerprint@startsAt) the reports carry, as ALERT_KEYS holds them."""
    return sorted({r.alert_key for r in reports if r.alert_key})


def serials(reports: Sequence[HealthReport]) -> list[str]:
    """The GPU serials the reports name, as GPU_SERIALS holds them."""
    return sorted({r.gpu_serial for r in reports if r.gpu_serial})


def type_name(key: SearchAttributeKey[Any]) -> str:
    """The type as the temporal CLI spells it (Keyword, Int, ...)."""
    return key.indexed_value_type.name.title().replace("_", "")


def cli_flags() -> list[str]:
    """`temporal server start-dev` flags that register every attribute."""
    flags = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}={type_name(key)}"]
    return flags


if __name__ == "__main__":
    print(" ".join(cli_flags()))
