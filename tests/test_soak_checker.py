"""The soak's checker (infra.soak): its parsers read slurmctld's real log, and its invariants find
exactly the violations put into a world that otherwise behaves (Hypothesis), the three the issue
names among them: a double drain, a grant leak, a breaker that resets itself.

The logs under tests/data/slurm/<release>/slurmctld-*.log are slurmctld's own, written by the
sandbox's daemons: an incident of the MTTR bench (22.05: drain, the job's checkpoint and requeue,
its restart elsewhere, the node replaced), the demo's (26.05), a test's reset of a GPU (22.05:
drained, then resumed) and a test's containment of nodes awaiting approval (22.05).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.activities.borrowed import GOES_BACK
from gpuheal.core.policy import GIVES_BACK, drain_reason
from infra.soak import collect, report
from infra.soak import invariants as inv
from infra.soak.records import (
    Bound,
    BreakerChange,
    Grant,
    JobEnd,
    LogEvent,
    NodeSample,
    Run,
    first_node,
    incident_workflow_id,
    parse_slurmctld,
    parse_spares,
)

DATA = Path(__file__).parent / "data" / "slurm"


def log(release: str, name: str, cluster: str) -> list[LogEvent]:
    return parse_slurmctld((DATA / release / f"slurmctld-{name}.log").read_text().splitlines(), cluster)


def kinds(events: list[LogEvent], node: str = "", job: int = 0) -> list[str]:
    return [e.kind for e in events if (node and e.node == node) or (job and e.job == job)]


@pytest.mark.parametrize(("release", "job"), [("22.05", 5000), ("26.05", 1)])
def test_an_incident_as_slurmctld_logs_it(release: str, job: int) -> None:
    events = log(release, "incident", "sandbox")
    drains = [e for e in events if e.kind == "drain"]
    assert [e.node for e in drains] == ["gpu01"]
    assert drains[0].text.startswith("gpuheal-sandbox-gpu01: ")
    assert kinds(events, node="gpu01") == ["allocate", "reason", "drain", "reason", "down", "down"]
    moves = [(e.kind, e.node) for e in events if e.job == job and e.kind in ("allocate", "requeue")]
    assert moves == [("allocate", "gpu01"), ("requeue", ""), ("allocate", "gpu02")]
    progress = [e for e in events if e.kind == "progress" and e.job == job]
    assert progress[0].restart == 0 and progress[-1].restart == 1
    assert [e.step for e in progress] == sorted(e.step for e in progress)  # a job's steps only go on


def test_a_drain_then_a_resume_and_nodes_contained_as_slurmctld_logs_them() -> None:
    reset = log("22.05", "reset", "t60899736")
    assert kinds(reset, node="gpu03") == ["reason", "drain", "resume"]
    contained = log("22.05", "contained", "t0972e85d")
    drains = [e for e in contained if e.kind == "drain"]
    assert len(drains) == 9 and all(e.text.endswith(": contained while awaiting approval") for e in drains)
    assert len([e for e in contained if e.kind == "down"]) == 18  # each replaced: DOWN, then FUTURE


def test_real_incidents_break_nothing_and_a_drain_asked_twice_is_caught() -> None:
    events = log("22.05", "incident", "sandbox")
    t = [e.at for e in events]
    run = Run("sandbox", incident_workflow_id("sandbox", "gpu01"), "r1", "gpu01", t[0], t[-1], "COMPLETED", "resolved")
    records = inv.Records(
        end=t[-1], events=events, samples=[], runs=[run], job_ends=[JobEnd("sandbox", 5000, "RUNNING")]
    )
    assert all(not v for v in inv.check(records).values())
    drain = next(i for i, e in enumerate(events) if e.kind == "drain")
    again = [*events[: drain + 1], replace(events[drain], at=events[drain].at + 0.1), *events[drain + 1 :]]
    twice = inv.check(replace(records, events=again))[inv.TWICE]
    assert [(v.subject, v.detail.split(":")[0]) for v in twice] == [(run.key, "gpu01 drained again")]


def test_the_spare_log_and_hostlists() -> None:
    """The provider's given.jsonl, as gpuheal.providers.sandbox writes it: a line per spare given."""
    lines = [
        {"at": 1.0, "key": "gpuheal-c-gpu01/r1", "spare": "gpu04", "instead_of": ""},
        {"at": 2.0, "key": "gpuheal-c-gpu02/r2", "spare": "gpu04", "instead_of": ""},
        {"at": 3.0, "key": "gpuheal-c-gpu01/r1", "spare": "gpu05", "instead_of": "gpu04"},  # gpu04 failed burn-in
        {"at": 4.0, "key": "gpuheal-c-gpu01/r1", "spare": "gpu06", "instead_of": ""},
    ]
    spares = parse_spares("".join(json.dumps(line) + "\n" for line in lines), "c")
    assert [(v.at, v.detail) for v in inv.spares_twice(spares)] == [
        (2.0, "spare gpu04 given to gpuheal-c-gpu01/r1 too"),
        (4.0, "a second spare gpu06 while gpu05 stood"),
    ]
    with pytest.raises(ValueError, match="not a spare given"):
        parse_spares('{"gpuheal-c-gpu01/r1": "gpu04"}', "c")  # the replacements record, not the log
    assert [first_node(n) for n in ("gpu01", "gpu[01-03,07]", "a1,b2")] == ["gpu01", "gpu01", "a1"]


# A world that behaves, drawn by Hypothesis: incidents one after another on each node, each
# draining its node once, requeueing its job once (the job starts again on a node of its own),
# then resuming the node or leaving it drained; a grant from start to close; the breaker tripped
# and resumed by an operator; Slurm sampled each second; a bound that holds.
CLUSTER = "c"
incident = st.tuples(
    st.integers(0, 3),  # the node
    st.integers(1, 30),  # seconds after the last incident began
    st.integers(3, 40),  # how long it is open
    st.booleans(),  # leaves its node drained (else resumes it)
)


def world(draws: list[tuple[int, int, int, bool]], trips: list[int]) -> inv.Records:
    events: list[LogEvent] = []
    runs: list[Run] = []
    grants: list[Grant] = []
    job_on = {n: 100 + n for n in range(4)}  # each node's job
    busy_until: dict[int, float] = {}
    left: set[int] = set()  # nodes an incident left drained
    t = 1000.0
    for n in range(4):
        events.append(LogEvent(t, CLUSTER, "allocate", node=f"gpu{n:02d}", job=job_on[n]))
    spare = 10
    for i, (n, gap, length, leave) in enumerate(draws):
        start = max(t + gap, busy_until.get(n, 0.0) + 1)
        t = start
        node, run_id = f"gpu{n:02d}", f"run-{i:04d}-aaaa-bbbb-{i:012d}"
        end = start + length
        busy_until[n] = end
        reason = f"{incident_workflow_id(CLUSTER, node)}: XID 79"
        if n not in left:  # one its incident left drained stays so: no run drains it again
            events += [
                LogEvent(start + 1, CLUSTER, "reason", node=node, text=reason),
                LogEvent(start + 1, CLUSTER, "drain", node=node, text=reason),
            ]
        job = job_on.get(n)
        fates: dict[int, str] = {}
        if job is not None:
            events += [
                LogEvent(start + 2, CLUSTER, "requeue", job=job),
                LogEvent(start + 3, CLUSTER, "allocate", node=f"gpu{spare:02d}", job=job),
            ]
            fates[job] = "requeued"
            job_on[spare], spare = job, spare + 1
            del job_on[n]
        if leave:
            left.add(n)
        else:
            left.discard(n)
            events.append(LogEvent(end - 1, CLUSTER, "resume", node=node))
        state = "drained" if leave else "returned"
        wid = incident_workflow_id(CLUSTER, node)
        runs.append(Run(CLUSTER, wid, run_id, node, start, end, "COMPLETED", "resolved", state, fates, bound_s=60))
        grants.append(Grant(CLUSTER, f"{wid}/{run_id}", start, end))
    events.sort(key=lambda e: e.at)
    horizon = max([e.at for e in events] + [t]) + 2
    samples, drained = [], {}
    for second in range(1000, int(horizon) + 1):
        for e in events:
            if second - 1 < e.at <= second:
                if e.kind == "drain":
                    drained[e.node] = e.text
                elif e.kind == "resume":
                    drained.pop(e.node, None)
        samples.append(NodeSample(float(second), CLUSTER, dict(drained)))
    most = max(len(s.drained) for s in samples)
    breaker: list[BreakerChange] = []
    for k, at in enumerate(sorted(trips)):
        breaker += [
            BreakerChange(CLUSTER, 1000.0 + 2 * at, True),
            BreakerChange(CLUSTER, 1001.0 + 2 * at, False, f"op{k}"),
        ]
    ends = [JobEnd(CLUSTER, j, "RUNNING") for j in job_on.values()]
    return inv.Records(
        end=horizon,
        events=events,
        samples=samples,
        runs=runs,
        grants=grants,
        breaker=breaker,
        bounds=[Bound(CLUSTER, 0.0, most)],
        job_ends=ends,
    )


worlds = st.builds(world, st.lists(incident, min_size=1, max_size=12), st.lists(st.integers(0, 200), max_size=3))


def caught(records: inv.Records) -> dict[str, int]:
    return {name: len(found) for name, found in inv.check(records).items() if found}


@settings(max_examples=150, deadline=None)
@given(worlds)
def test_a_world_that_behaves_breaks_no_invariant(records: inv.Records) -> None:
    assert caught(records) == {}


@settings(max_examples=150, deadline=None)
@given(worlds, st.data())
def test_a_double_drain_is_caught(records: inv.Records, data: st.DataObject) -> None:
    drains = [e for e in records.events if e.kind == "drain"]
    first = data.draw(st.sampled_from(drains))
    again = replace(first, at=first.at + 0.5)  # before anything resumes it (a second later at the soonest)
    events = sorted([*records.events, again], key=lambda e: e.at)
    assert caught(replace(records, events=events)) == {inv.TWICE: 1}


@settings(max_examples=150, deadline=None)
@given(worlds, st.data())
def test_a_grant_leak_is_caught(records: inv.Records, data: st.DataObject) -> None:
    leaked = data.draw(st.integers(0, len(records.grants) - 1))
    grants = [replace(g, released_at=None) if i == leaked else g for i, g in enumerate(records.grants)]
    found = inv.check(replace(records, grants=grants))[inv.LEAKS]
    assert [v.subject for v in found] == [records.grants[leaked].run_key]


@settings(max_examples=150, deadline=None)
@given(worlds, st.integers(0, 300))
def test_a_breaker_that_resets_itself_is_caught(records: inv.Records, at: int) -> None:
    trip, reset = BreakerChange(CLUSTER, 5000.0 + at, True), BreakerChange(CLUSTER, 5000.5 + at, False)
    assert caught(replace(records, breaker=[*records.breaker, trip, reset])) == {inv.BREAKER: 1}


@settings(max_examples=100, deadline=None)
@given(worlds)
def test_one_node_over_the_bound_and_a_lost_job_are_caught(records: inv.Records) -> None:
    most = records.bounds[0].most
    tighter = replace(records, bounds=[Bound(CLUSTER, 0.0, most - 1)])
    over = sum(1 for s in records.samples if len(s.drained) == most)
    assert caught(tighter) == {inv.BOUND: over}
    touched = {j for r in records.runs for j in r.job_fates}
    if touched:
        job = min(touched)
        runs = [replace(r, job_fates={k: v for k, v in r.job_fates.items() if k != job}) for r in records.runs]
        ends = [replace(e, state="FAILED") if e.job == job else e for e in records.job_ends]
        assert caught(replace(records, runs=runs, job_ends=ends)) == {inv.JOB_LOST: 1}


# gpuheal's give-back drains, as Slurm shows them: the incident's own, its release, the coordinator's
GIVE_BACKS = [f"{GIVES_BACK} to inference", GIVES_BACK, GOES_BACK]


@settings(max_examples=100, deadline=None)
@given(worlds, st.data())
def test_a_borrowed_node_given_back_is_left_out_of_the_bound_and_nothing_else(
    records: inv.Records, data: st.DataObject
) -> None:
    """A give-back drains an inference node in its incident's name until it leaves Slurm: it ends
    a loan, it takes no training capacity, and the budget grants nothing for it (the hour on
    4a75ec5 counted one, 6 against 5). Only that is left out: a give-back's words on a training
    node, or a failure's on an inference node, count."""
    most = records.bounds[0].most
    at = data.draw(st.sampled_from([i for i, s in enumerate(records.samples) if len(s.drained) == most]))
    by = incident_workflow_id(CLUSTER, f"gpu{data.draw(st.integers(0, 3)):02d}")

    def drained_too(node: str, why: str) -> inv.Records:
        s = records.samples[at]
        one = replace(s, drained={**s.drained, node: drain_reason(by, why)})
        samples = [*records.samples[:at], one, *records.samples[at + 1 :]]
        return replace(records, samples=samples, lendable=[(CLUSTER, "inf01"), ("other", "inf02")])

    give_back = data.draw(st.sampled_from(GIVE_BACKS))
    assert caught(drained_too("inf01", give_back)) == {}
    assert caught(drained_too("gpu09", give_back)) == {inv.BOUND: 1}
    assert caught(drained_too("inf02", give_back)) == {inv.BOUND: 1}  # another cluster's inference node
    assert caught(drained_too("inf01", "XID 79: row remapping failed")) == {inv.BOUND: 1}


def test_an_inference_node_drained_for_a_failure_counts_until_slurm_shows_it_back() -> None:
    """A failure's drain on a borrowed node counts; a give-back's words written over it later (its
    release marks it DOWN so) do not take it out of the count, and it ends only once it is out."""
    by = incident_workflow_id(CLUSTER, "inf01")
    failed, back = drain_reason(by, "XID 79: GPU fell off the bus"), drain_reason(by, f"{GIVES_BACK} to inference")
    samples = [
        NodeSample(1.0, CLUSTER, {"inf01": failed}),
        NodeSample(2.0, CLUSTER, {"inf01": back}),
        NodeSample(3.0, CLUSTER, {}, down={"inf01": back}),
        NodeSample(4.0, CLUSTER, {}),
        NodeSample(5.0, CLUSTER, {"inf01": back}),
    ]
    found = inv.over_the_bound(samples, [Bound(CLUSTER, 0.0, 0)], [(CLUSTER, "inf01")])
    assert [v.at for v in found] == [1.0, 2.0, 3.0]


def test_a_run_that_failed_or_waits_for_nobody_is_caught() -> None:
    wid = incident_workflow_id(CLUSTER, "gpu01")
    runs = [
        Run(CLUSTER, wid, "r1", "gpu01", 0.0, 10.0, "FAILED"),
        Run(CLUSTER, wid, "r2", "gpu01", 11.0, 20.0, "CONTINUED_AS_NEW"),
        Run(CLUSTER, wid, "r3", "gpu01", 20.0, None, "RUNNING", waiting_for="approval"),
        Run(CLUSTER, incident_workflow_id(CLUSTER, "gpu02"), "r4", "gpu02", 0.0, None, "RUNNING"),
        Run(CLUSTER, incident_workflow_id(CLUSTER, "gpu04"), "r6", "gpu04", 0.0, None, "RUNNING", bound_s=300),
        Run(
            CLUSTER,
            incident_workflow_id(CLUSTER, "gpu03"),
            "r5",
            "gpu03",
            0.0,
            100.0,
            "COMPLETED",
            "resolved",
            bound_s=50,
        ),
    ]
    found = inv.endings(runs, end=200.0)
    assert [(v.subject.split("/")[1], v.detail) for v in found] == [
        ("r1", "ended FAILED"),
        ("r4", "still open past its bound, at ?"),
        ("r5", "open 100 s, past its 50 s"),
    ]


def test_time_to_training_again_read_from_slurmctlds_log() -> None:
    events = log("22.05", "incident", "sandbox")
    drain = next(e for e in events if e.kind == "drain")
    restarted = next(e for e in events if e.kind == "progress" and e.job == 5000 and e.restart == 1)
    failed_at = drain.at - 0.5
    failure = {"kind": "failure", "at": failed_at, "cluster": "sandbox", "node": "gpu01", "load": "hardware"}
    records = inv.Records(end=0.0, events=events, samples=[], runs=[])
    assert report.recoveries(records, [failure]) == [pytest.approx(restarted.at - failed_at)]
    elsewhere = {**failure, "node": "gpu03"}  # no job there: nothing to wait for
    assert report.recoveries(records, [elsewhere]) == []


def test_the_report_counts_the_training_a_fault_met_while_it_lasted() -> None:
    """A fault in the middle of a job's wait to train again costs the seconds of that wait it
    covered, from Slurm's log; a job that never trains again waits until the soak's end."""
    events = log("22.05", "incident", "sandbox")
    drain = next(e for e in events if e.kind == "drain")
    restarted = next(e for e in events if e.kind == "progress" and e.job == 5000 and e.restart == 1)
    failed_at = drain.at - 0.5
    failure = {
        "kind": "failure",
        "at": failed_at,
        "cluster": "sandbox",
        "node": "gpu01",
        "load": "hardware",
        "status": 200,
    }
    mid = (failed_at + restarted.at) / 2
    hit = {"kind": "fault", "fault": "restart_temporal", "cluster": "", "began": mid, "at": mid + 1.0, "said": "x"}
    records = inv.Records(end=restarted.at + 100, events=events, samples=[], runs=[], clusters=["sandbox"])
    text = report.markdown(
        3, 5, 5, failed_at - 10, records.end, records, {n: [] for n in inv.INVARIANTS}, [failure, hit]
    )
    assert "| restart_temporal | shared | " in text and "| 0 | 0 | 1 | 1 |" in text
    unfinished = [e for e in events if not (e.kind == "progress" and e.job == 5000 and e.restart >= 1)]
    waits = report.training_waits(replace(records, events=unfinished), [failure])
    assert waits == [("sandbox", failed_at, records.end, False)]
    assert "left out (1 jobs)" in report.markdown(
        3,
        5,
        5,
        failed_at - 10,
        records.end,
        replace(records, events=unfinished),
        {n: [] for n in inv.INVARIANTS},
        [failure],
    )


def test_a_failure_on_a_node_its_job_was_requeued_from_is_not_that_jobs() -> None:
    """A job requeued off a node (or ended) is no longer on it: a later failure there is no wait
    of that job's (slurmctld logs the requeue; the job starts elsewhere, or waits)."""
    events = [
        LogEvent(1.0, "c", "allocate", node="gpu01", job=7),
        LogEvent(5.0, "c", "requeue", job=7),
        LogEvent(20.0, "c", "allocate", node="gpu02", job=7),
        LogEvent(30.0, "c", "progress", job=7, restart=1),
        LogEvent(2.0, "c", "allocate", node="gpu03", job=8),
        LogEvent(4.0, "c", "end", node="gpu03", job=8, text="COMPLETED"),
    ]
    failure = {"kind": "failure", "at": 10.0, "cluster": "c", "node": "gpu01", "load": "hardware", "status": 200}
    records = inv.Records(end=40.0, events=events, samples=[], runs=[])
    assert report.training_waits(records, [failure]) == []
    assert report.training_waits(records, [{**failure, "at": 6.0, "node": "gpu03"}]) == []  # job 8 ended
    on_it = {**failure, "at": 3.0}
    assert report.training_waits(records, [on_it]) == [("c", 3.0, 30.0, True)]


def test_a_job_started_by_the_backfill_is_placed_from_slurm_sampled(tmp_path: Path) -> None:
    """slurmctld logs a backfill start below its info level: the sampled squeue places the job, so
    its second requeue is the second node's incident's, not the first's twice."""
    lines = [
        {"at": 1.0, "cluster": CLUSTER, "drained": {}, "jobs": {"4": "gpu04"}},
        {"at": 2.0, "cluster": CLUSTER, "drained": {}, "jobs": {"4": "gpu04"}},
        {"at": 9.0, "cluster": CLUSTER, "drained": {}, "jobs": {"4": "gpu[02-03]"}},
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    starts = collect.starts_seen(path)
    assert [(e.at, e.node, e.job) for e in starts] == [(1.0, "gpu04", 4), (9.0, "gpu02", 4)]
    runs = [
        Run(CLUSTER, incident_workflow_id(CLUSTER, n), f"r{n}", n, 0.0, 20.0, "COMPLETED", "resolved")
        for n in ("gpu04", "gpu02")
    ]
    requeues = [LogEvent(5.0, CLUSTER, "requeue", job=4), LogEvent(12.0, CLUSTER, "requeue", job=4)]
    events = sorted([*starts, *requeues], key=lambda e: e.at)
    assert inv.requeued_twice(events, runs) == []
    assert len(inv.requeued_twice([e for e in events if e.node != "gpu02"], runs)) == 1  # placed by the log alone


def test_a_node_left_drained_must_be_drained_after_the_close_until_someone_resumes_it() -> None:
    wid = incident_workflow_id(CLUSTER, "gpu01")
    run = Run(CLUSTER, wid, "r1", "gpu01", 0.0, 10.0, "COMPLETED", "aborted", "drained")
    reason = f"{wid}: XID 79"
    drained, gone = NodeSample(11.0, CLUSTER, {"gpu01": reason}), NodeSample(11.0, CLUSTER, {})
    later = NodeSample(60.0, CLUSTER, {})  # an operator returned it since: not a leak
    assert inv.leaks([run], [], [drained, later], []) == []
    assert [v.detail for v in inv.leaks([run], [], [gone, later], [])] == ["gpu01 said drained, not drained"]
    resumed = [LogEvent(10.5, CLUSTER, "resume", node="gpu01")]  # returned at once, between close and sample
    assert inv.leaks([run], [], [gone, later], [], resumed) == []
