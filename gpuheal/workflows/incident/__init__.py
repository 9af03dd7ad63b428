"""The incident workflow's parts (the workflow itself, `run` and one method per stage, is
workflows/remediation.py). Everything here runs inside the workflow: deterministic, I/O only
through activities.

  state.py      the incident's state, in one model: what handlers write and the close reports
  timeline.py   a record per stage, the Stage/Action search attributes, the UI's details, an
                Event per stage on the Kubernetes node, and notices to the operators
  capacity.py   admission, grant, confirmation and release with the cluster's coordinator; the
                wait for a replacement when there is no spare; asked again while held
  holding.py    the `held` stage, and the endings of an incident never granted or never answered
  approval.py   a human's decision: asked, waited for at the gate, the default when none comes
  jobs.py       the node's jobs: checkpoint, hand to their recoveries, collect the answers
  ledger.py     every job on the node and what became of it (pure bookkeeping)
  node.py       the node: drain and cordon, evict, repair or replace, back in service
  replacing.py  the repair_or_replace stage: a repair or a new node (validated), and a borrowed
                node as a bridge while none comes
  borrowing.py  a node borrowed from inference while no spare comes, and its give-back
  result.py     the result at the close
"""
