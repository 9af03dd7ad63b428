"""The cluster's policy as a file (gpuheal.core.fleet.policy_file) and a worker's configuration
offered at its start (gpuheal.core.fleet.steering.configure): what a user of `gpuheal policy` and of
the chart sees."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuheal.core.errors import SettingsError
from gpuheal.core.fleet import policy_file, steering
from gpuheal.core.fleet.models import FleetState
from gpuheal.core.fleet.policy import BudgetPolicy, ConfiguredPolicy, FleetPolicy, VersionedPolicy
from gpuheal.core.settings import Settings

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_a_file_may_say_part_of_the_policy_and_the_rest_stays(tmp_path: Path) -> None:
    current = FleetPolicy(mode="approve")
    new = policy_file.merged(current, policy_file.read(write(tmp_path, 'budget:\n  cluster: "5%"\n')))
    assert new.budget.cluster == "5%" and new.mode == "approve" and new.budget.rate == current.budget.rate
    assert policy_file.differences(current, new) == ["budget.cluster: '10%' -> '5%'"]
    assert policy_file.differences(new, new) == []


def test_a_count_written_as_a_yaml_number_is_a_count(tmp_path: Path) -> None:
    """`--set policy.budget.cluster=3` renders `cluster: 3`, a number: read as the count 3, not
    refused (a worker and a webhook crash-looping on a chart value)."""
    f = tmp_path / "p.yaml"
    f.write_text("budget:\n  cluster: 3\n  per_pool: 2\ncontainment_limit: 4\n")
    p = policy_file.merged(FleetPolicy(), policy_file.read(f))
    assert (p.budget.cluster, p.budget.per_pool, p.containment_limit) == ("3", "2", "4")


def test_the_whole_policy_rendered_is_taken_back_unchanged(tmp_path: Path) -> None:
    p = FleetPolicy(budget=BudgetPolicy(cluster="3", per_pool="25%"), containment_limit="2")
    back = policy_file.merged(FleetPolicy(), policy_file.read(write(tmp_path, policy_file.render(p))))
    assert back == p


def test_a_configurations_digest_is_what_it_sets_not_the_defaults_of_the_release(tmp_path: Path) -> None:
    """A release that adds a field or changes a default must not make an unchanged ConfigMap
    look changed (it would be applied again, undoing operators' changes)."""
    from_file = policy_file.merged(FleetPolicy(), policy_file.read(write(tmp_path, 'budget:\n  cluster: "5%"\n')))
    from_code = FleetPolicy(budget=BudgetPolicy(cluster="5%"))
    assert policy_file.digest(from_file) == policy_file.digest(from_code)
    assert policy_file.digest(from_file) != policy_file.digest(FleetPolicy())


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('budget:\n  cluster: "5.5"\n', "budget.cluster: Value error, '5.5' is not a count (3) or a share (5%)"),
        ("budgte:\n  cluster: 3\n", "budgte: Extra inputs are not permitted"),
        ("mode: yolo\n", "mode: Input should be 'observe', 'approve' or 'auto' (given: 'yolo')"),
        ("- a list\n", "a policy is a mapping of fields"),
        ("budget: [\n", "cannot read a policy"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field_and_nothing_changes(tmp_path: Path, text: str, said: str) -> None:
    current = FleetPolicy()
    with pytest.raises(policy_file.PolicyFileError) as err:
        policy_file.merged(current, policy_file.read(write(tmp_path, text)))
    assert said in str(err.value)
    assert current == FleetPolicy()


def test_a_worker_reads_its_policy_from_the_file_and_never_from_two_places(tmp_path: Path) -> None:
    path = write(tmp_path, 'budget:\n  cluster: "4"\ncontainment_limit: "1"\n')
    s = Settings.from_env({"GPUHEAL_POLICY_FILE": str(path)})
    assert s.fleet.budget.cluster == "4" and s.fleet.containment_limit == "1"
    with pytest.raises(SettingsError, match="GPUHEAL_POLICY_FILE is set, and so is GPUHEAL_BUDGET"):
        Settings.from_env({"GPUHEAL_POLICY_FILE": str(path), "GPUHEAL_BUDGET": "5"})
    with pytest.raises(SettingsError, match=r"GPUHEAL_POLICY_FILE: .*budget\.cluster"):
        Settings.from_env({"GPUHEAL_POLICY_FILE": str(write(tmp_path, 'budget: {cluster: "x"}\n'))})


def offered(p: FleetPolicy) -> ConfiguredPolicy:
    return ConfiguredPolicy(policy=p, digest=policy_file.digest(p), by="worker w1 pid 1")


def test_a_changed_configuration_applies_and_a_restart_never_undoes_an_operators_change() -> None:
    seed = FleetPolicy()
    s = FleetState(
        cluster="c",
        policy=VersionedPolicy(version=1, policy=seed, changed_by="gpuheal", reason="seed", at=T0),
        configured=policy_file.digest(seed),
    )
    said, _ = steering.configure(s, offered(seed), T0)  # a restarted worker, same configuration
    assert "unchanged" in said and s.policy.version == 1
    by_hand = seed.model_copy(update={"mode": "approve"})
    steering.set_policy(s, by_hand, "alice", "week 2", T0)
    said, _ = steering.configure(s, offered(seed), T0)  # restarted again: alice's change stands
    assert "unchanged" in said and s.policy.policy.mode == "approve" and s.policy.version == 2
    upgraded = seed.model_copy(update={"budget": BudgetPolicy(cluster="5%")})  # a Helm upgrade
    said, out = steering.configure(s, offered(upgraded), T0)
    assert said.startswith(f"configuration {policy_file.digest(upgraded)} applied as policy version 3")
    assert s.policy.policy == upgraded and s.policy.changed_by == "configuration (worker w1 pid 1)"
    assert [n[0] for n in out.notes] == ["policy_changed"]
    said, _ = steering.configure(s, offered(upgraded), T0)  # the second replica of the same rollout
    assert "unchanged" in said and s.policy.version == 3


def test_an_older_worker_restarting_mid_rollout_never_brings_back_its_configuration() -> None:
    """A, then B (a Helm upgrade), then A again (a stale pod of the old ReplicaSet restarting):
    B's policy stands, and B's own pods restarting change nothing either."""
    a = FleetPolicy()
    b = a.model_copy(update={"budget": BudgetPolicy(cluster="5%")})
    s = FleetState(
        cluster="c",
        policy=VersionedPolicy(version=1, policy=a, changed_by="gpuheal", reason="seed", at=T0),
        configured=policy_file.digest(a),
    )
    said, _ = steering.configure(s, offered(b), T0)
    assert "applied as policy version 2" in said and s.policy.policy == b
    said, out = steering.configure(s, offered(a), T0)  # the stale pod
    assert "was offered before" in said and "gpuheal policy apply" in said
    assert s.policy.policy == b and s.policy.version == 2 and out.notes == []
    assert s.configured == policy_file.digest(b) and s.configured_before == [policy_file.digest(a)]
    said, _ = steering.configure(s, offered(b), T0)  # a pod of the new rollout restarting
    assert "unchanged" in said and s.policy.version == 2
    # A coordinator's history from the release before replays as it answered then (it applied A again).
    said, _ = steering.configure(s, offered(a), T0, refuse_earlier=False)
    assert "applied as policy version 3" in said and s.policy.policy == a


def test_the_configurations_offered_before_are_kept_within_their_bound() -> None:
    policies = [FleetPolicy(budget=BudgetPolicy(cluster=str(n))) for n in range(1, steering.CONFIGURED_BEFORE_MOST + 5)]
    s = FleetState(
        cluster="c",
        policy=VersionedPolicy(version=1, policy=policies[0], changed_by="gpuheal", reason="seed", at=T0),
        configured=policy_file.digest(policies[0]),
    )
    for p in policies[1:]:
        steering.configure(s, offered(p), T0)
    digests = [policy_file.digest(p) for p in policies]
    assert s.configured == digests[-1]
    assert s.configured_before == digests[-1 - steering.CONFIGURED_BEFORE_MOST : -1]  # the newest, oldest first


def test_a_coordinators_state_from_before_the_record_of_earlier_configurations_loads() -> None:
    """Carried across continue-as-new as JSON by the release before: no configured_before."""
    s = FleetState(
        cluster="c",
        policy=VersionedPolicy(version=1, policy=FleetPolicy(), changed_by="gpuheal", reason="seed", at=T0),
        configured="abc",
    )
    old = s.model_dump(mode="json")
    del old["configured_before"]
    back = FleetState.model_validate_json(json.dumps(old))
    assert back.configured == "abc" and back.configured_before == []
