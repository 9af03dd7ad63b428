"""Fleet safety: the decisions the cluster's coordinator (gpuheal.workflows.fleet) takes, as pure
functions over its state, under the cluster's policy.

policy (the policy, declared once), policy_file (the policy as a file), models (messages and state),
budget, breaker and windows (the decisions), coordination (the handlers' state changes), steering
(what operators do), reaping (what ended runs still hold), view (what `gpuheal fleet` reads),
line (how often a held incident asks again).
"""
