"""gpuheal: durable, audited remediation of GPU failures on Slurm (and Kubernetes) with Temporal.

The one import name the distribution installs. Its floors, lowest first (each imports only the
floors below it; `lint-imports` checks it in `make test`):

  core        models, pure decisions (policy, fleet, jobs), wording, settings: no I/O
  clients     Slurm, Kubernetes, Temporal, notices, subprocesses
  providers   how a platform repairs or replaces a node
  activities  one per external action, on the typed interface in activities/interface.py
  workflows   the durable incident, job recovery and fleet coordinator (deterministic, thin)
  triggers    node agent, Alertmanager webhook, health check, and the start path they share
  workers     the worker process
  cli         the `gpuheal` command

workflows, activities, triggers and workers live at the top of the checkout (the design card's
layout) and are part of this package through the links beside this file.

Importing this package loads nothing: the training job's progress helper (core.progress) runs
under a bare python3.
"""
