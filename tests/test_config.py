from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuheal.core.errors import SettingsError
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import BorrowPolicy, KubernetesPolicy, RemediationSettings
from gpuheal.core.settings import Settings


def test_defaults_have_no_kubernetes_and_no_approval() -> None:
    s = Settings.from_env({})
    assert s.remediation.kubernetes is None and not s.kubernetes_enabled
    assert s.fleet.approval.required_for == ()
    assert s.webhook_token is None


def test_environment_is_parsed() -> None:
    s = Settings.from_env(
        {
            "GPUHEAL_APPROVAL_REQUIRED": "replace_node, reboot_node",
            "GPUHEAL_APPROVAL_DEFAULT": "approve",
            "GPUHEAL_KUBECONFIG": "/etc/kubeconfig",
            "GPUHEAL_K8S_NO_EXECUTE": "1",
            "GPUHEAL_K8S_ON_PDB_TIMEOUT": "delete",
            "GPUHEAL_WEBHOOK_TOKEN": "t0ken",
        }
    )
    assert s.fleet.approval.required_for == (ActionClass.REPLACE_NODE, ActionClass.REBOOT_NODE)
    assert s.fleet.approval.default_on_timeout == "approve"
    k8s = s.remediation.kubernetes
    assert k8s is not None and k8s.no_execute and k8s.on_pdb_timeout == "delete"
    assert "t0ken" not in repr(s)  # secrets stay out of logs


@pytest.mark.parametrize(
    "env",
    [{"GPUHEAL_APPROVAL_REQUIRED": "nuke_it"}, {"GPUHEAL_APPROVAL_DEFAULT": "maybe"}],
)
def test_bad_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises((ValidationError, ValueError)):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"GPUHEAL_BUDGET": "lots"}, "GPUHEAL_BUDGET='lots': 'lots' is not a count (3) or a share (5%)"),
        ({"GPUHEAL_RATE": "0"}, "GPUHEAL_RATE='0': Input should be greater than or equal to 1"),
        ({"GPUHEAL_APPROVAL_REQUIRED": "reset_gpu,nuke_it"}, "GPUHEAL_APPROVAL_REQUIRED='reset_gpu,nuke_it': Input"),
        ({"GPUHEAL_CAPACITY_WAIT_S": "soon\x1b[2J"}, r"GPUHEAL_CAPACITY_WAIT_S='soon\x1b[2J'"),  # escaped, not sent raw
        ({"GPUHEAL_K8S_IN_CLUSTER": "true"}, "GPUHEAL_K8S_IN_CLUSTER='true': set it to 1"),
        # Another cluster's coordinator's own queue (gpuheal-coordinator is that of queue gpuheal).
        ({"GPUHEAL_TASK_QUEUE": "gpuheal-coordinator"}, "'gpuheal-coordinator' ends in '-coordinator'"),
    ],
)
def test_a_bad_value_names_its_variable_and_quotes_it(env: dict[str, str], says: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert says in str(err.value)


def test_the_kubernetes_half_and_borrowing_exist_only_when_switched_on() -> None:
    assert (
        Settings.from_env({"GPUHEAL_K8S_NODE_LABEL": "x", "GPUHEAL_BORROW_FLOOR": "2"}).remediation.kubernetes is None
    )
    assert Settings.from_env({"GPUHEAL_K8S_IN_CLUSTER": "0"}).remediation.kubernetes is None
    s = Settings.from_env(
        {"GPUHEAL_K8S_IN_CLUSTER": "1", "GPUHEAL_BORROW_POOL": "inference", "GPUHEAL_BORROW_FLOOR": "2"}
    )
    assert s.kubernetes_enabled and s.remediation.kubernetes == KubernetesPolicy()
    assert s.remediation.borrow == BorrowPolicy(pool="inference", floor=2)


def test_irregular_names_shared_values_lists_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env(
        {
            "SLURM_CONF": "/etc/slurm/slurm.conf",
            "GPUHEAL_SLURM_DIR": "sandbox",  # the sandbox provider's directory, resolved
            "GPUHEAL_VERIFY_TIMEOUT_S": "120",
            "GPUHEAL_GPUS_PER_NODE": "4",
            "GPUHEAL_DOMAIN_LABELS": " rack , ,switch",
            "GPUHEAL_OWNER_NOTIFY_FORMAT": "slack",
            "GPUHEAL_BUDGET": "",  # empty is unset
        }
    )
    assert s.slurm.conf == "/etc/slurm/slurm.conf" and s.provider.sandbox_dir == tmp_path / "sandbox"
    assert s.remediation.verify_timeout_s == s.remediation.jobs.verify_timeout_s == 120
    assert s.remediation.gpus_per_node == s.remediation.jobs.gpus_per_node == 4
    assert s.domain_labels == ("rack", "switch") and s.owners.format == "slack" and s.fleet.budget.cluster == "10%"


def test_unset_is_the_models_own_defaults() -> None:
    s = Settings.from_env({})
    assert s.remediation == RemediationSettings() and s.fleet == FleetPolicy() and s == Settings()
