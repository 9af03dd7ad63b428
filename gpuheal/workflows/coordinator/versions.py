"""The coordinator's versions: each workflow.patched marker names a change, and coordinators
started before it keep the old way until they continue as new, so their histories replay
(tests/histories/). The ids are recorded in histories: never rename one."""

from __future__ import annotations

# Coordinators started before this release waited only for events (a held incident freed by time
# alone waited for the next one), awaited each notice in their loop (a notice receiver down failed
# them), served no one when a grant was taken back, and sent a grant notice to an incident that
# had its grant in the answer already. They keep doing so until they continue as new
# (workflow.patched: one id for all of it), so their histories replay.
COORDINATOR_2 = "coordinator-2-wakes-for-time-notices-beside-the-loop-serves-after-a-revoke"
# Coordinators started before this release never looked for closed runs (a run terminated while
# granted kept its grant); they keep so until they continue as new.
COORDINATOR_3 = "coordinator-3-reaps-closed-runs"
# Nor did they rebuild from the open incidents when started afresh (their own marker: a start
# is one moment, the reaping a way of running).
REBUILD = "coordinator-rebuilds-from-the-open-incidents"
# Nor did they keep their view in their memo (gpuheal.core.fleet.view): `gpuheal fleet` asks
# their query until they continue as new.
VIEW = "coordinator-keeps-its-view-in-its-memo"
# Nor did they count a node contained while held once its incident ended (it stays drained).
KEEP_CONTAINED = "coordinator-counts-a-contained-node-after-its-incident"
# Nor did they bound containment by everything out (grants, containments and left nodes against
# the budget plus the containment bound), nor keep a terminated run's node counted when its
# incident's next run asked.
COUNTS_LEFT = "coordinator-bounds-containment-by-all-out-and-keeps-a-dead-runs-node"
# Nor did they serve the line only when something frees (a request that freed nothing, in a
# storm, served a line of a thousand); they serve at every request until they continue as new.
SERVE_WHEN_FREED = "coordinator-serves-the-line-when-something-frees"
# Nor did they keep their books true on every path: they rebuilt only when an earlier run was
# visible and gave up after five attempts, dropped a left node a release added while a look
# ran, asked Slurm about left nodes only every REAP_EVERY_S while an incident was held, took
# releases while rebuilding, never freed a domain whose domain incident died undecided, and
# applied again a configuration an older worker offered (a stale pod in a rollout).
BOOKS = "coordinator-books-never-lie"
# Nor did they keep the repeat window's arrivals compact (a week was carried whole: past about
# 4,000 arrivals the continue-as-new input passed Temporal's 2 MiB and the run was terminated),
# nor carry their state compressed, nor continue as new before Temporal's 2,000 updates per run.
PACKED = "coordinator-carries-its-state-compact"
# A run started before PACKED packs what it carries when it continues as new (else a fleet's
# whole week, carried by the old way, could pass 2 MiB at the upgrade itself).
PACK_CARRIED = "coordinator-packs-what-it-carries"
# Nor did they publish what the operators' levers read (the policy, the open domain incidents) in
# their memo: `gpuheal policy` and `gpuheal domain` asked a query, refused in a storm.
PUBLISHES = "coordinator-publishes-its-policy-and-domains"
# Nor did they run their own activities on a queue of their own (gpuheal.core.ids.coordinator_queue):
# in a storm a fresh coordinator's rebuild waited for a slot behind the incidents' capacity
# requests, which waited for the rebuild, until REBUILD_WAIT_S tripped the breaker.
OWN_QUEUE = "coordinator-runs-its-activities-on-its-own-queue"
# Nor did they keep a grant within everything out (FleetState.grants_within_all_out): with more
# nodes contained than a lowered bound allows, or found drained by a rebuild, a grant within the
# budget alone put more out than the budget plus the containment bound.
GRANTS_WITHIN_ALL_OUT = "coordinator-grants-within-all-out"
# Nor did a rebuild that found open incidents (holding nothing: an application restart, a
# triage) look again when its earlier run was not visible yet: that run showed later, unseen, and
# the recreation was never said. They look again whenever the earlier run did not show.
LOOK_UNTIL_SEEN = "coordinator-looks-again-until-its-earlier-run-shows"
# Nor did they keep application faults (policy.is_application_fault: XID 13/31/43) apart: each
# counted as an arrival towards the breaker, a domain's escalation and the repeat-offender rule,
# so three crashes of one job in a week replaced a healthy node. From this marker an application
# fault moves none of them and is told no repeat verdict.
APP_FAULTS_APART = "coordinator-keeps-application-faults-apart"
# Nor did they give back a borrowed inference node whose incident run ended without returning
# it (terminated, crashed out): from this marker each look does (activities/borrowed.py).
BORROWED_GO_BACK = "coordinator-gives-back-borrowed-nodes-of-ended-runs"
# Nor did they send the grant notices of one pass together: each awaited the last, one workflow
# task apiece, so k slots freed at once (a release, a resume, a budget raised) took k task cycles
# (a second each in a storm). From this marker they go out in one task, one incident's in order.
NOTICES_TOGETHER = "coordinator-sends-its-grant-notices-together"
# Nor did they run their workflow tasks on their own queue (ids.coordinator_queue): behind a
# storm's incidents in the cluster's queue (and in a worker's sticky queue beside them) each task
# waited about a second, and every grant waits for one. From this marker a run on the cluster's
# queue continues as new onto its own at once, its state carried.
OWN_WORKFLOW_QUEUE = "coordinator-runs-on-its-own-queue"
# A run taken over from the release before replays without that marker (patched() answers False
# for the whole run): it moves when a worker of this release signals it (FLEET_MOVE). The
# handler's own marker: a signal an old worker took (and buffered, having no handler) replays as
# nothing.
MOVE_ON_SIGNAL = "coordinator-moves-to-its-own-queue-when-asked"
# Nor did they decide a held incident's containment with its request: each asked the contain
# update after its request was held (a storm's thousand held: about 950 updates more). From this
# marker a request asking contain_if_held hears both in one answer (gpuheal.core.fleet.containment).
CONTAIN_WITH_REQUEST = "coordinator-decides-containment-with-the-request"
# Nor did they pace their memo: the view was written anew after every workflow task that changed
# a figure (each write an event of up to 3 KB: tens a second from a busy coordinator on its own
# queue). From this marker it is written at most every MEMO_EVERY_S, a storm's changes drawn together.
MEMO_PACED = "coordinator-writes-its-memo-at-most-every-second"
MEMO_EVERY_S = 1.0
# Nor did their second look after a rebuild (VISIBILITY_LAG_S) know the incident runs they had
# admitted themselves since they started: a run granted and closed while the look listed the
# open incidents (a minute, in a storm) still showed open in its snapshot, holding a node no
# book knew, and a cluster's first coordinator tripped its breaker as "recreated" (issue 36's
# 10,000-report run, 85 s in). From this marker a run it admitted is its own, whatever the snapshot says.
REBUILD_KNOWS_ITS_OWN = "coordinator-rebuild-knows-the-runs-it-admitted"
# Nor did they ask about holders in pages: the look for closed runs sent every holder in one
# activity's input (1.0 MB at 9,400 held), beside a task's other commands, toward gRPC's 4 MB
# (a 10,000-report storm's coordinator was terminated by a 4.33 MB task). From this marker a look
# at more than LOOK_PAGE runs asks them LOOK_PAGE at a time, one activity after another.
LOOK_IN_PAGES = "coordinator-looks-in-pages"
# Nor did their rebuild read a packed listing: the open incidents came back as JSON, 3.1 MB at
# 10,000, past Temporal's 2 MiB for an activity's result, so a coordinator recreated in a fleet
# that size could never rebuild (and granted nothing). From this marker it asks
# find_open_incidents_packed (gpuheal.core.fleet.packing.pack_listing).
REBUILD_PACKED = "coordinator-rebuild-reads-a-packed-listing"
# Nor did they pack a big state beside their task: a continue-as-new compressed megabytes of JSON
# through bz2 in its workflow task, which a storm's load stretched past the SDK's 2 s bound on every
# attempt (a 10,000-report run decided nothing for 13 minutes). From this marker the state is
# packed by a local activity (CoordinatorState.pack_carried), whatever its size.
PACK_BESIDE = "coordinator-packs-a-big-state-beside-its-task"
PACK_TIMEOUT_S = 60.0  # the local activity's bound: past it, the run packs in its task, at its next
# Nor did they keep counting a node an operator returned: `gpuheal return` told them first and
# they freed its slot at once, then the command resumed it in Slurm; a resume that failed
# (slurmctld stopped) left it drained and counted nowhere (issue 37's hour: 6 out against 5 on
# `west`). From this marker it stays counted, as left, until Slurm shows it back (asked
# RETURN_LOOK_S after the return, then at each look).
RETURN_KEEPS_COUNT = "coordinator-counts-a-returned-node-until-slurm-shows-it-back"
HISTORY_LIMIT = 4000  # events: continue as new well before Temporal suggests it
# From PACKED on: each accepted update is two events, so 2,000 events is at most 1,000 updates,
# half Temporal's cap on one run (history.maxTotalUpdates, 2,000); and a history past 4 MB.
HISTORY_LIMIT_PACKED = 2000
HISTORY_BYTES_LIMIT = 4 * 1024 * 1024
