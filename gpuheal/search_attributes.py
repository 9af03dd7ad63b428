"""Custom search attributes that make incidents findable in the Temporal UI and CLI, e.g.
``temporal workflow list --query 'NodeName="gpu01" AND Stage="approval"'``.
The dev server registers them at start (infra/temporal/dev-server.sh)."""

from temporalio.common import SearchAttributeKey

NODE = SearchAttributeKey.for_keyword("NodeName")
CLUSTER = SearchAttributeKey.for_keyword("Cluster")
XID = SearchAttributeKey.for_int("Xid")
STAGE = SearchAttributeKey.for_keyword("Stage")
ACTION = SearchAttributeKey.for_keyword("Action")

ALL = (NODE, CLUSTER, XID, STAGE, ACTION)
