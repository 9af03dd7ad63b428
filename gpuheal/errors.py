"""Errors that cross layers by name.

Temporal carries an activity's failure to the workflow as an ApplicationError with a *type*
string; the workflow's retry policies list the types that must not be retried. Both sides read
the names from here.
"""

from __future__ import annotations

# The node is not a node this cluster can remediate: retrying cannot help.
UNKNOWN_NODE = "UnknownNode"
# A requeued job came back on the failed node: a wrong placement, not a transient error.
NOT_RESUMED = "TrainingNotResumed"

NON_RETRYABLE = (UNKNOWN_NODE, NOT_RESUMED)


class SettingsError(ValueError):
    """A setting is missing or wrong; the message names the variable and what to set."""
