"""Errors that cross layers by name.

Temporal carries an activity's failure to the workflow as an ApplicationError with a *type*
string; the workflow's retry policies list the types that must not be retried. Both sides read
the names from here.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

# The node is not a node this cluster can remediate: retrying cannot help.
UNKNOWN_NODE = "UnknownNode"
# The node is in the cluster's configuration but not in service (Slurm's FUTURE: a spare, or a
# replacement still joining): a report from it is said and nothing touched, not a failed run.
NODE_NOT_IN_SERVICE = "NodeNotInService"

NON_RETRYABLE = (UNKNOWN_NODE, NODE_NOT_IN_SERVICE)


class SettingsError(ValueError):
    """A setting is missing or wrong; the message names the variable and what to set."""


def quote(value: Any, limit: int = 60) -> str:
    """A value a user sent, as it may be shown back: escaped (no control characters reach a
    terminal or a log) and cut to `limit` characters."""
    text = value if isinstance(value, str) else repr(value)
    shown = text.encode("unicode_escape").decode("ascii").replace("'", "\\'")
    return f"'{shown[:limit]}...'" if len(shown) > limit else f"'{shown}'"


def describe_error(err: Exception, what: str = "input") -> str:
    """One line per invalid field: where, what is wrong, and the offending value (quoted)."""
    if not isinstance(err, ValidationError):
        return str(err)
    parts = []
    for e in err.errors():
        where = ".".join(map(str, e["loc"])) or what
        given = f" (got {quote(e['input'])})" if "input" in e and not isinstance(e["input"], dict) else ""
        parts.append(f"{where}: {e['msg']}{given}")
    return "; ".join(parts)
