from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuheal.core.models import ActionClass
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
