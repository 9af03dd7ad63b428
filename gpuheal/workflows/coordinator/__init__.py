"""The cluster coordinator's parts (the workflow itself, its loop and one handler per update, is
workflows/fleet.py). Everything here runs inside the workflow: deterministic, I/O only through
activities; every decision comes from gpuheal.core.fleet (pure).

  versions.py   the workflow.patched markers, each the change it guards, and the history limit
  state.py      the run's state, in one object: the cluster's FleetState and what the handlers
                queued for the loop (signals, notices, domain incidents); what continue-as-new
                carries; the fleet view in its memo and the UI's details, for `gpuheal fleet`
  reconcile.py  what it holds, checked against the incidents really open: the rebuild at a fresh
                start, the look for closed runs beside the loop
  sending.py    what the handlers decided, done by the loop: domain incidents, grant notices to
                held incidents, notices to the operators (beside the loop)
"""
