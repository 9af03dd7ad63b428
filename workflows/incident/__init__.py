"""The incident workflow's parts: its state in one model (state.py), the stage bookkeeping that
the UI and `kubectl describe node` show (timeline.py), the negotiation with the cluster's
coordinator (capacity.py), the ledger of the node's jobs (ledger.py) and borrowing a node from
inference (borrowing.py). The workflow itself, `run` and one method per stage, is
workflows/remediation.py. Everything here runs inside the workflow: deterministic, I/O only
through activities."""
