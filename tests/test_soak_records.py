"""The soak's checker is not fooled by its records: a log in another time zone, gaps in Slurm's
samples, a node that stops looking like gpuheal's drain, a chain of runs taken for several
incidents, a job whose fate gpuheal names but Slurm contradicts (design 015, "Known gaps")."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from infra.soak import collect, histories
from infra.soak import invariants as inv
from infra.soak.records import (
    Bound,
    JobEnd,
    LogEvent,
    NodeSample,
    Run,
    SpareGiven,
    incident_workflow_id,
    log_clock_skew,
    parse_audit,
    parse_jobcomp,
)

DATA = Path(__file__).parent / "data" / "slurm"
C = "c"


def run(node: str, run_id: str, started: float, closed: float | None, status: str = "COMPLETED", **kw: object) -> Run:
    return Run(C, incident_workflow_id(C, node), run_id, node, started, closed, status, **kw)  # type: ignore[arg-type]


def test_a_log_whose_clock_is_not_utc_is_refused(tmp_path: Path) -> None:
    real = (DATA / "22.05" / "slurmctld-incident.log").read_text()
    log = tmp_path / "slurmctld.log"
    log.write_text(real)
    last = collect.parse_slurmctld(real.splitlines(), C)[-1].at
    os.utime(log, (last, last + 0.5))
    assert abs(log_clock_skew(real.splitlines(), last + 0.5)) < 1
    assert collect.read_log(log, C, begun=0.0)
    os.utime(log, (last, last + 3600))  # written at 10:00 UTC, logged as 09:00: slurmctld in UTC-1
    with pytest.raises(collect.SoakError, match="not logging in UTC"):
        collect.read_log(log, C, begun=0.0)


def test_a_node_counts_against_the_bound_until_slurm_shows_it_back() -> None:
    ours, theirs = f"{incident_workflow_id(C, 'gpu01')}: XID 79", "operator: cable check"
    samples = [
        NodeSample(1.0, C, {"gpu01": ours, "gpu02": f"{incident_workflow_id(C, 'gpu02')}: XID 48"}),
        NodeSample(2.0, C, {"gpu01": theirs, "gpu02": ours}),  # an operator wrote over gpu01's reason
        NodeSample(3.0, C, {"gpu02": ours}, down={"gpu01": theirs}),  # then took it DOWN
        NodeSample(4.0, C, {"gpu02": ours}),  # gpu01 in service again (or FUTURE: out of the cluster)
        NodeSample(5.0, C, {"gpu02": ours, "gpu03": theirs}),  # someone else's drain never counts
    ]
    bound = [Bound(C, 0.0, 1)]
    assert [v.at for v in inv.over_the_bound(samples, bound)] == [1.0, 2.0, 3.0]
    assert inv.over_the_bound(samples, [Bound(C, 0.0, 2)]) == []


def test_missing_samples_are_caught_unless_the_soak_stopped_slurmctld() -> None:
    samples = [NodeSample(float(t), C, {}) for t in [*range(100, 130), *range(160, 200)]]
    gap = inv.unsampled(samples, [], [C], begun=100.0, end=200.0)
    assert [(v.invariant, v.at, v.detail) for v in gap] == [(inv.BOUND, 129.0, "no sample of Slurm for 31 s")]
    assert inv.unsampled(samples, [(C, 128.0, 158.0)], [C], begun=100.0, end=200.0) == []
    assert inv.unsampled(samples, [("other", 128.0, 158.0)], [C], begun=100.0, end=200.0) == gap
    late = inv.unsampled(samples, [(C, 128.0, 158.0)], [C], begun=60.0, end=200.0)
    assert [v.detail for v in late] == ["no sample of Slurm for 40 s"]  # none in its first 40 s
    assert len(inv.unsampled([], [], [C], begun=100.0, end=200.0)) == 1  # never sampled: caught


def test_a_chain_of_runs_is_one_incident_for_its_requeues_and_its_bound() -> None:
    chain = histories.chained(
        [
            run("gpu01", "r2", 50.0, 90.0, "CONTINUED_AS_NEW"),
            run("gpu01", "r1", 0.0, 50.0, "CONTINUED_AS_NEW"),
            run("gpu01", "r3", 90.0, 140.0, "COMPLETED", outcome="resolved", bound_s=100),
            run("gpu01", "r4", 200.0, 210.0, "COMPLETED", outcome="resolved", bound_s=100),  # a new incident
        ]
    )
    first = f"{incident_workflow_id(C, 'gpu01')}/r1"
    assert [(r.run_id, r.incident, r.chain_started) for r in chain] == [
        ("r1", first, 0.0),
        ("r2", first, 0.0),
        ("r3", first, 0.0),
        ("r4", f"{incident_workflow_id(C, 'gpu01')}/r4", 200.0),
    ]
    assert [v.detail for v in inv.endings(chain, end=300.0)] == ["open 140 s, past its 100 s"]
    placed = LogEvent(0.0, C, "allocate", node="gpu01", job=7)
    again = [placed, LogEvent(10.0, C, "requeue", job=7), LogEvent(60.0, C, "requeue", job=7)]
    assert [v.subject.split("/")[1] for v in inv.requeued_twice(again, chain)] == ["r2"]
    # Back on the node between (an application restart's requeue), a later failure's run requeues
    # a new stay: not twice (the hour's east gpu17).
    back = [placed, LogEvent(10.0, C, "requeue", job=7), LogEvent(20.0, C, "allocate", node="gpu01", job=7)]
    assert inv.requeued_twice([*back, LogEvent(60.0, C, "requeue", job=7)], chain) == []
    apart = [placed, LogEvent(10.0, C, "requeue", job=7), placed, LogEvent(205.0, C, "requeue", job=7)]
    assert inv.requeued_twice(apart, chain) == []  # one requeue in each of two incidents


@pytest.mark.parametrize(
    ("state", "fate", "by_soak", "ended_by_it", "caught"),
    [
        ("RUNNING", "", False, False, {}),
        ("COMPLETED", "", False, False, {}),
        ("FAILED", "ended", False, False, {}),  # named as not gone on: accounted for
        ("FAILED", "requeued", False, False, {inv.JOB_LOST: 1}),  # the result's claim, contradicted
        ("FAILED", "", False, False, {inv.JOB_LOST: 1}),
        ("CANCELLED", "", True, False, {}),  # the soak cancelled it
        ("CANCELLED", "ended", False, False, {inv.JOB_KILLED: 1}),
        ("FAILED", "ended", False, True, {inv.JOB_KILLED: 1}),  # gpuheal says it ended it
    ],
)
def test_a_job_is_accounted_for_by_slurm_first(
    state: str, fate: str, by_soak: bool, ended_by_it: bool, caught: dict[str, int]
) -> None:
    r = run(
        "gpu01",
        "r1",
        10.0,
        50.0,
        outcome="resolved",
        job_fates={7: fate} if fate else {},
        jobs_ended_by_it=frozenset({7} if ended_by_it else ()),
    )
    events = [LogEvent(0.0, C, "allocate", node="gpu01", job=7)]
    found = inv.jobs_lost_or_killed(events, [r], [JobEnd(C, 7, state, by_soak)])
    assert {k: sum(1 for v in found if v.invariant == k) for k in {v.invariant for v in found}} == caught


def test_a_node_drained_at_the_end_is_held_by_its_incident_or_said_left_drained() -> None:
    def at_end(drained: dict[str, str]) -> list[NodeSample]:
        return [NodeSample(100.0, C, drained)]

    reason = f"{incident_workflow_id(C, 'gpu01')}: XID 79"
    returned = run("gpu01", "r1", 10.0, 50.0, outcome="resolved", node_state="returned")
    left = run("gpu01", "r1", 10.0, 50.0, outcome="aborted", node_state="drained")
    still = run("gpu01", "r2", 60.0, None, "RUNNING")
    assert [v.detail for v in inv.drains_unowned(at_end({"gpu01": reason}), [returned])] == [
        "gpu01 drained by gpuheal at the end, its last run said returned"
    ]
    assert inv.drains_unowned(at_end({"gpu01": reason}), [left]) == []
    assert inv.drains_unowned(at_end({"gpu01": reason}), [returned, still]) == []
    assert len(inv.drains_unowned(at_end({"gpu01": reason}), [])) == 1
    assert inv.drains_unowned(at_end({"gpu01": "operator: cable check"}), []) == []  # not gpuheal's
    # A restart since (the hour's west gpu18) did nothing to the node: the run before answers for it.
    restarted = run("gpu01", "r2", 60.0, 70.0, outcome="resolved", node_state="untouched")
    assert inv.drains_unowned(at_end({"gpu01": reason}), [left, restarted]) == []
    assert len(inv.drains_unowned(at_end({"gpu01": reason}), [returned, restarted])) == 1


@pytest.mark.parametrize("release", ["22.05", "26.05"])
def test_slurms_job_completion_log_ends_each_stay(release: str) -> None:
    """tests/data/slurm/<release>/jobcomp.log: slurmctld's jobcomp/filetxt, for jobs 1 (requeued:
    its line says PENDING), 2 (cancelled), 3 (done) and 4 (exit 3)."""
    ends = parse_jobcomp((DATA / release / "jobcomp.log").read_text().splitlines(), C)
    assert sorted((e.job, e.text, e.node) for e in ends) == [
        (1, "PENDING", "gpu01"),
        (2, "CANCELLED", "gpu01"),
        (3, "COMPLETED", "gpu01"),
        (4, "FAILED", "gpu01"),
    ]
    # A job that ended on gpu01 before gpu01's incident began was not on it during the incident.
    failed = next(e for e in ends if e.job == 4)
    events = [LogEvent(failed.at - 1, C, "allocate", node="gpu01", job=4), failed]
    later = run("gpu01", "r1", failed.at + 5, failed.at + 50, outcome="resolved")
    assert inv.jobs_lost_or_killed(events, [later], [JobEnd(C, 4, "FAILED")]) == []
    assert len(inv.jobs_lost_or_killed(events[:1], [later], [JobEnd(C, 4, "FAILED")])) == 1  # no end: on it


def test_a_node_cordoned_twice_by_one_incident_and_a_borrowed_node_no_open_run_holds() -> None:
    incident = incident_workflow_id(C, "gpu01")
    cordon, uncordon = (
        LogEvent(1.0, C, "cordon", node="gpu01", text=incident),
        LogEvent(5.0, C, "uncordon", node="gpu01"),
    )
    again = LogEvent(3.0, C, "cordon", node="gpu01", text=incident)
    r = run("gpu01", "r1", 0.0, 10.0, outcome="resolved")
    assert inv.cordoned_twice([cordon, uncordon, replace(cordon, at=6.0)], [r]) == []  # cleared between
    assert [v.subject for v in inv.cordoned_twice([cordon, again, uncordon], [r])] == [r.key]
    other = LogEvent(3.0, C, "cordon", node="gpu01", text=incident_workflow_id(C, "gpu02"))
    assert inv.cordoned_twice([cordon, other], [r]) == []  # another incident's (a borrow, a domain)
    held, kept = run("gpu01", "r2", 20.0, None, "RUNNING"), run("gpu01", "r1", 0.0, 10.0, outcome="no_capacity")
    crashed = run("gpu01", "r1", 0.0, 10.0, "TERMINATED")
    assert inv.borrowed_unowned([(C, "inf01", "r2")], [kept, held], 30.0) == []
    assert inv.borrowed_unowned([(C, "inf01", "r1")], [kept], 30.0) == []  # completed: kept for a person
    assert inv.borrowed_unowned([(C, "inf01", "r1")], [crashed], 30.0) == []  # the coordinator's look to come
    assert [v.detail for v in inv.borrowed_unowned([(C, "inf01", "r1")], [crashed], 10.0 + 601)] == [
        "inf01 borrowed by run r1, which is closed"
    ]
    assert len(inv.borrowed_unowned([(C, "inf01", "r9")], [crashed], 30.0)) == 1  # no run of it at all


def test_the_apiservers_audit_log_gives_each_cordon_and_its_clearing() -> None:
    """tests/data/kube/audit.log: the sandbox apiserver's own audit log (infra/k8s/cluster.sh's
    policy: a ServiceAccount's requests on Nodes), from a soak's first incidents on `west`."""
    events = parse_audit((DATA.parent / "kube" / "audit.log").read_text().splitlines(), C)
    assert [(e.kind, e.node) for e in events] == [
        ("cordon", "gpu10"),
        ("uncordon", "gpu10"),
        ("cordon", "gpu05"),
        ("cordon", "gpu10"),
        ("uncordon", "gpu10"),
        ("cordon", "gpu09"),
        ("uncordon", "gpu09"),
        ("cordon", "gpu09"),
    ]
    assert events[0].text == "gpuheal-west-gpu10" and [e.at for e in events] == sorted(e.at for e in events)
    assert inv.cordoned_twice(events, []) == []
    doubled = [*events[:1], replace(events[0], at=events[0].at + 0.1), *events[1:]]
    assert [v.detail for v in inv.cordoned_twice(doubled, [])] == ["Node gpu10 cordoned again by gpuheal-west-gpu10"]


def test_the_same_drain_again_after_a_stopped_slurmctld_is_its_backlog_not_a_second_action() -> None:
    reason = f"{incident_workflow_id(C, 'gpu01')}: XID 79"
    first, again = (
        LogEvent(100.0, C, "drain", node="gpu01", text=reason),
        LogEvent(140.0, C, "drain", node="gpu01", text=reason),
    )
    assert len(inv.drained_twice([first, again], [])) == 1
    assert inv.drained_twice([first, again], [], quiet=[(C, 90.0, 125.0)]) == []  # within 30 s of its waking
    assert len(inv.drained_twice([first, again], [], quiet=[(C, 90.0, 105.0)])) == 1  # long after
    other = replace(again, text=f"{incident_workflow_id(C, 'gpu01')}: contained while held")
    assert len(inv.drained_twice([first, other], [], quiet=[(C, 90.0, 125.0)])) == 1  # not the same drain


def test_a_held_job_a_chains_later_fate_and_a_restart_on_the_same_node(tmp_path: Path) -> None:
    placed = [LogEvent(0.0, C, "allocate", node="gpu01", job=7)]
    r1 = run("gpu01", "r1", 10.0, 20.0, "CONTINUED_AS_NEW")
    r2 = run("gpu01", "r2", 20.0, 50.0, outcome="resolved", job_fates={7: "ended"})
    chain = histories.chained([r1, r2])
    ended = [LogEvent(15.0, C, "end", node="gpu01", job=7, text="FAILED")]  # during r1, named by r2
    assert inv.jobs_lost_or_killed(placed + ended, chain, [JobEnd(C, 7, "FAILED")]) == []
    assert inv.jobs_lost_or_killed(placed, chain, [JobEnd(C, 7, "REQUEUE_HOLD")]) == []  # held: waiting
    samples = [
        {"at": 1.0, "cluster": C, "drained": {}, "jobs": {"7": "gpu01"}},
        {"at": 2.0, "cluster": C, "drained": {}, "jobs": {}},
        {"at": 3.0, "cluster": C, "error": "slurm_load_jobs error: Socket timed out"},
        {"at": 4.0, "cluster": C, "drained": {}, "jobs": {"7": "gpu01"}},
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert [(e.at, e.node) for e in collect.starts_seen(path)] == [(1.0, "gpu01"), (4.0, "gpu01")]


def test_a_log_with_no_line_of_slurmctlds_format_is_refused_and_a_spares_retry_is_one_spare() -> None:
    with pytest.raises(ValueError, match="slurmctld's timestamp"):
        log_clock_skew(["Dec  6 13:00:01 host slurmctld[1]: update_node: node gpu01 state set to DRAINING"], 0.0)
    assert log_clock_skew([], 0.0) == 0.0
    given = SpareGiven(C, "w/r1", "gpu13", 1.0)
    assert inv.spares_twice([given, replace(given, at=2.0)]) == []  # the log's line again after a kill
