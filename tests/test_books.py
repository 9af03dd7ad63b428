"""The coordinator's books on the paths issue 32 found them wrong, one example each (the state
machine in tests/test_coordination.py explores their mixes): every node gpuheal drained is
counted exactly once until Slurm shows it back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuheal.core.fleet import coordination, reaping, steering
from gpuheal.core.fleet.models import (
    AdmitRequest,
    CapacityRequest,
    FleetState,
    NodeReturn,
    OpenIncident,
    OpenIncidents,
    Placement,
    RunRef,
)
from gpuheal.core.fleet.policy import BudgetPolicy, FleetPolicy, VersionedPolicy
from gpuheal.core.models.base import ActionClass, Stage

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def state(cluster: str = "2", containment: str = "1") -> FleetState:
    p = FleetPolicy(
        budget=BudgetPolicy(cluster=cluster, per_pool=None, node_cooldown_s=0), containment_limit=containment
    )
    return FleetState(cluster="c", policy=VersionedPolicy(version=1, policy=p, changed_by="t", reason="t", at=T0))


def where(node: str) -> Placement:
    return Placement(node=node, cluster_size=20, pool="train", pool_size=20, domains={})


def ask(s: FleetState, node: str, run: str) -> bool:
    """A new incident run of `node` is admitted and asks for capacity: granted?"""
    incident = f"gpuheal-c-{node}"
    admit = AdmitRequest(
        incident_id=incident,
        run_id=run,
        cluster="c",
        placement=where(node),
        action=ActionClass.REPLACE_NODE,
        what="XID 79",
        seed=s.policy.policy,
    )
    coordination.admit(s, admit, T0)
    return coordination.request(s, capacity(node, run), T0)[0].granted


def capacity(node: str, run: str) -> CapacityRequest:
    """The request of `node`'s incident run `run` (a replacement)."""
    return CapacityRequest(
        cluster="c", incident_id=f"gpuheal-c-{node}", run_id=run, placement=where(node), action=ActionClass.REPLACE_NODE
    )


def counted(s: FleetState) -> list[str]:
    return sorted([g.node for b in s.books() for g in b.values()] + list(s.left))


def test_a_release_while_a_look_runs_keeps_its_node_counted() -> None:
    """The look asked Slurm about the left nodes it knew; a node left while it ran was not asked,
    and must not be dropped as 'not shown drained'."""
    s = state()
    assert ask(s, "gpu01", "r1")
    asked = reaping.left_refs(s)  # the look's second activity starts: nothing left yet
    coordination.release(s, "gpuheal-c-gpu01", T0, "r1", left_drained=True)  # meanwhile
    coordination.reap(s, [], asked, [], T0)  # Slurm answered about what it was asked
    assert counted(s) == ["gpu01"], "a node left while the look ran was dropped"
    assert ask(s, "gpu02", "r2") and not ask(s, "gpu03", "r3"), "the budget of 2 must count gpu01"


def test_a_rebuild_counts_what_is_open_and_drained_even_before_the_earlier_run_shows() -> None:
    """Recreated within visibility's lag: no earlier run visible yet, but open incidents hold
    nodes and Slurm shows gpuheal's drains. It rebuilds them, in order of arrival, and trips."""
    s = state()
    found = OpenIncidents(
        incidents=(
            OpenIncident(incident_id="gpuheal-c-gpu01", run_id="a", placement=where("gpu01"), stage=Stage.REPAIR),
            OpenIncident(
                incident_id="gpuheal-c-gpu03",
                run_id="c",
                placement=where("gpu03"),
                stage=Stage.HELD,
                since=T0 + timedelta(seconds=5),
            ),
            OpenIncident(
                incident_id="gpuheal-c-gpu02",
                run_id="b",
                placement=where("gpu02"),
                stage=Stage.HELD,
                contained=True,
                since=T0,
            ),
        ),
        earlier_run="",
        left=(OpenIncident(incident_id="gpuheal-c-gpu09", run_id="", placement=where("gpu09"), stage=Stage.DONE),),
    )
    notes = reaping.rebuild(s, found, T0)
    assert s.breaker.tripped and notes and "not visible yet" in notes[0][2]
    assert set(s.grants) == {"gpuheal-c-gpu01"} and set(s.left) == {"gpu09"}
    assert [h.node for h in s.queue] == ["gpu02", "gpu03"], "the line is in order of arrival"
    assert set(s.containing) == {"gpuheal-c-gpu02"}, "held while contained: contained, not granted"


def test_the_clusters_first_coordinator_changes_nothing() -> None:
    s = state()
    assert reaping.rebuild(s, OpenIncidents(), T0) == [] and not s.breaker.tripped


def test_a_release_the_books_do_not_know_still_counts_its_drained_node() -> None:
    s = state()
    answer, _ = coordination.release(s, "gpuheal-c-gpu04", T0, "r9", left_drained=True, placement=where("gpu04"))
    assert "not in the books" in answer and counted(s) == ["gpu04"]
    coordination.release(s, "gpuheal-c-gpu04", T0, "r9", left_drained=True, placement=where("gpu04"))
    assert counted(s) == ["gpu04"], "counted once, however often it says so"


def test_gpuheal_return_keeps_the_node_counted_until_slurm_shows_it_back() -> None:
    s = state(cluster="1")
    assert ask(s, "gpu01", "r1")
    coordination.release(s, "gpuheal-c-gpu01", T0, "r1", left_drained=True)
    assert reaping.left_check_due(s, T0) is None, "nothing held, nothing returned: no need to ask"
    assert not ask(s, "gpu02", "r2"), "held: gpu01 is still drained, and counted"
    reaping.start_left_check(s, T0)
    answer, out = steering.return_node(s, NodeReturn(node="gpu01", operator="olga", reason="checked"), T0)
    assert "counted until Slurm shows it back" in answer and "gpu01" in s.left and not out.signals
    soon = T0 + timedelta(seconds=reaping.RETURN_LOOK_S)
    assert reaping.left_check_due(s, T0) == soon, "asked seconds after the return, not at the next 30 s check"
    gpu01 = reaping.start_left_check(s, soon)
    out = coordination.reap(s, [], gpu01, [], soon)  # Slurm shows it resumed
    assert "gpu01" not in s.left and not s.returning
    assert [i for i, n in out.signals if n.granted] == ["gpuheal-c-gpu02"], "the next in line goes then"


def test_a_returned_node_whose_resume_failed_stays_counted() -> None:
    """The command's resume failed (slurmctld stopped): Slurm still shows it drained by its incident.
    The look 5 s after cannot tell a failed resume from a slow one; the one RETURN_GRACE_S after can."""
    s = state(cluster="1")
    assert ask(s, "gpu01", "r1")
    coordination.release(s, "gpuheal-c-gpu01", T0, "r1", left_drained=True)
    steering.return_node(s, NodeReturn(node="gpu01", operator="olga", reason="checked"), T0)
    soon = T0 + timedelta(seconds=reaping.RETURN_LOOK_S)
    gpu01 = reaping.start_left_check(s, soon)
    out = coordination.reap(s, [], gpu01, gpu01, soon)
    assert "gpu01" in s.left and not ask(s, "gpu02", "r2"), "still drained: counted, and the budget holds"
    assert not out.notes and "gpu01" in s.returning, "the resume may be on its way: still being returned"
    late = T0 + timedelta(seconds=reaping.RETURN_GRACE_S)
    assert reaping.left_check_due(s, soon) == min(late, soon + timedelta(seconds=reaping.LEFT_CHECK_EVERY_S))
    out = coordination.reap(s, [], reaping.start_left_check(s, late), gpu01, late)
    assert [n for n, _, text in out.notes if n == "return_not_seen" and "gpu01" in text], out.notes
    assert "gpu01" in s.left and not s.returning, "said once: from here a left node as any other"
    again = late + timedelta(seconds=reaping.LEFT_CHECK_EVERY_S)
    assert reaping.left_check_due(s, late) == again, "the held incident's checks go on, every 30 s"


def test_a_look_slurm_did_not_answer_frees_nothing_and_says_nothing() -> None:
    """(workflows/coordinator/reconcile.py asks nothing of the left nodes when Slurm failed the look)"""
    s = state(cluster="1")
    assert ask(s, "gpu01", "r1")
    coordination.release(s, "gpuheal-c-gpu01", T0, "r1", left_drained=True)
    steering.return_node(s, NodeReturn(node="gpu01", operator="olga", reason="checked"), T0)
    late = T0 + timedelta(seconds=reaping.RETURN_GRACE_S)
    reaping.start_left_check(s, late)
    out = coordination.reap(s, [], [], [], late)
    assert not out.notes and "gpu01" in s.left and "gpu01" in s.returning


def test_a_node_being_returned_is_not_contained_by_its_next_incident() -> None:
    """Between the update and the command's resume, the node's next incident (the same incident
    id: it is per node) is held by the cooldown; contained then, its drain would find its own
    reason and take it for its own, and the resume would undo it while the run thinks it drained."""
    s = state(cluster="1")
    assert ask(s, "gpu01", "r1")
    coordination.release(s, "gpuheal-c-gpu01", T0, "r1", left_drained=True)
    steering.return_node(s, NodeReturn(node="gpu01", operator="olga", reason="checked"), T0)
    assert not ask(s, "gpu01", "r2"), "held: its node is being returned (whatever the cooldown)"
    req = capacity("gpu01", "r2")
    decision, _ = coordination.contain(s, req, T0)
    assert not decision.granted and "an operator is returning its node" in decision.reason
    soon = T0 + timedelta(seconds=reaping.RETURN_LOOK_S)
    out = coordination.reap(s, [], reaping.start_left_check(s, soon), [], soon)  # Slurm shows it resumed
    assert [i for i, n in out.signals if n.granted] == ["gpuheal-c-gpu01"], "then decided: a node back in service"


def test_coordinators_before_the_marker_freed_a_returned_node_at_once() -> None:
    s = state(cluster="1")
    assert ask(s, "gpu01", "r1")
    coordination.release(s, "gpuheal-c-gpu01", T0, "r1", left_drained=True)
    assert not ask(s, "gpu02", "r2")
    r = NodeReturn(node="gpu01", operator="olga", reason="checked")
    answer, out = steering.return_node(s, r, T0, keep_counted=False)
    assert "no longer counted" in answer and "gpu01" not in s.left
    assert [i for i, n in out.signals if n.granted] == ["gpuheal-c-gpu02"]


def test_a_node_an_open_incident_holds_is_not_returned() -> None:
    s = state()
    assert ask(s, "gpu01", "r1")
    assert steering.holder_of(s, "gpu01") == "gpuheal-c-gpu01"  # the update's validator refuses it


def test_the_left_check_waits_between_asks_and_stops_when_nothing_is_held() -> None:
    s = state(cluster="1")
    assert ask(s, "gpu01", "r1")
    coordination.release(s, "gpuheal-c-gpu01", T0, "r1", left_drained=True)
    assert reaping.left_check_due(s, T0) is None, "nothing held: no need to ask"
    ask(s, "gpu02", "r2")
    assert reaping.start_left_check(s, T0) == [RunRef(incident_id="gpuheal-c-gpu01", run_id="r1", node="gpu01")]
    assert reaping.left_check_due(s, T0) == T0 + timedelta(seconds=reaping.LEFT_CHECK_EVERY_S)


def test_a_held_run_whose_node_an_earlier_run_left_drained_is_contained_counted_once() -> None:
    s = state(cluster="1")
    assert ask(s, "gpu01", "r1")
    coordination.release(s, "gpuheal-c-gpu01", T0, "r1", left_drained=True)
    s.policy = s.policy.model_copy(
        update={
            "policy": s.policy.policy.model_copy(update={"budget": BudgetPolicy(cluster="1", node_cooldown_s=1800)})
        }
    )
    assert not ask(s, "gpu01", "r2"), "held: the node cools down"
    req = capacity("gpu01", "r2")
    answer, _ = coordination.contain(s, req, T0)
    assert answer.granted and counted(s) == ["gpu01"], "the same node counted as left and as contained"
