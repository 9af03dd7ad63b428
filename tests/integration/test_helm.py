"""The Helm chart (infra/helm/gpuheal): linted by Helm, installed server-side into the sandbox's
real kube-apiserver, and the RBAC it creates is the least-privilege one the worker is tested
under (infra/k8s/rbac.yaml): the same rules, and the API server's own authorizer agrees."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpuheal.core.models.base import ActionClass
from gpuheal.core.settings import Settings
from infra.sandbox import REPO
from infra.sandbox.kube import KubeSandbox

pytestmark = pytest.mark.integration

CHART = REPO / "infra" / "helm" / "gpuheal"
RELEASE, NAMESPACE = "gpuheal-chart", "gpuheal-chart"


def helm_bin() -> str:
    out = subprocess.run(["bash", str(REPO / "infra/k8s/build.sh"), "--print-bin"], capture_output=True, text=True)
    helm = Path(out.stdout.strip()) / "helm"
    if not helm.exists():
        pytest.fail(f"helm is missing at {helm}: run infra/k8s/build.sh (make test does)")
    return str(helm)


def helm(kube: KubeSandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_bin(), "--kubeconfig", str(kube.admin_kubeconfig), *args], capture_output=True, text=True, timeout=120
    )


def rules(items: list[Any]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples, whatever way the rules are grouped."""
    found = set()
    for r in items:
        r = r if isinstance(r, dict) else r.to_dict()
        groups, resources, verbs = r.get("apiGroups") or r.get("api_groups"), r["resources"], r["verbs"]
        found |= {(g, res, v) for g in groups for res in resources for v in verbs}
    return found


@pytest.fixture
def installed(kube: KubeSandbox) -> Iterator[KubeSandbox]:
    helm(kube, "uninstall", RELEASE, "-n", NAMESPACE)  # a leftover of an interrupted run
    done = helm(
        kube,
        "install", RELEASE, str(CHART),
        "-n", NAMESPACE, "--create-namespace",
        "--set", "cluster=sandbox",
        "--set", "agent.enabled=true",
        "--set", "temporal.tls.secretName=temporal-tls",
        "--set", "policy.mode=observe",
        # No pods: the sandbox schedules onto its kwok nodes, and other tests count what runs there.
        "--set", "worker.replicas=0", "--set", "webhook.replicas=0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    yield kube
    helm(kube, "uninstall", RELEASE, "-n", NAMESPACE)


def test_helm_lint_passes() -> None:
    done = subprocess.run([helm_bin(), "lint", str(CHART)], capture_output=True, text=True)
    assert done.returncode == 0 and "0 chart(s) failed" in done.stdout, done.stdout + done.stderr


def test_the_api_server_reports_its_real_version(kube: KubeSandbox) -> None:
    version = client.VersionApi(kube.api()).get_code()
    assert version.git_version == "v1.36.3"  # what the chart's kubeVersion constraint is checked against


def test_the_chart_installs_with_the_least_privilege_rbac(installed: KubeSandbox) -> None:
    api = installed.api()
    tested = next(
        d for d in yaml.safe_load_all((REPO / "infra/k8s/rbac.yaml").read_text()) if d["kind"] == "ClusterRole"
    )
    role = client.RbacAuthorizationV1Api(api).read_cluster_role(f"{RELEASE}-worker")
    assert rules(role.rules) == rules(tested["rules"])
    subject = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-worker"

    def allowed(verb: str, resource: str, subresource: str = "", group: str = "") -> bool:
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=subject,
                groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, subresource=subresource or None, group=group
                ),
            )
        )
        return bool(client.AuthorizationV1Api(api).create_subject_access_review(review).status.allowed)

    assert allowed("patch", "nodes") and allowed("create", "pods", "eviction") and allowed("create", "events")
    assert not allowed("get", "secrets") and not allowed("delete", "pods") and not allowed("create", "pods")
    assert not allowed("update", "deployments", group="apps")


def test_the_chart_carries_the_policy_and_keeps_the_token_in_a_secret(installed: KubeSandbox, tmp_path: Path) -> None:
    core, apps = client.CoreV1Api(installed.api()), client.AppsV1Api(installed.api())
    config = core.read_namespaced_config_map(RELEASE, NAMESPACE).data
    assert config["GPUHEAL_CLUSTER"] == "sandbox" and config["GPUHEAL_POLICY_FILE"] == "/etc/gpuheal/policy.yaml"
    # The policy as one file, as the worker reads it (the variables would be refused beside it).
    text = core.read_namespaced_config_map(f"{RELEASE}-policy", NAMESPACE).data["policy.yaml"]
    written = tmp_path / "policy.yaml"
    written.write_text(text)
    read = Settings.from_env({"GPUHEAL_POLICY_FILE": str(written)}).fleet
    assert read.mode == "observe" and read.approval.required_for == (ActionClass.REPLACE_NODE,)
    assert read.containment_limit == "10%" and read.budget.cluster == "10%"
    assert config["GPUHEAL_TEMPORAL_TLS_KEY"] == "/etc/temporal-tls/tls.key"
    assert not any("TOKEN" in key for key in config)  # secrets never in a ConfigMap
    webhook = apps.read_namespaced_deployment(f"{RELEASE}-webhook", NAMESPACE).spec.template.spec
    (token,) = [e for e in webhook.containers[0].env if e.name == "GPUHEAL_WEBHOOK_TOKEN"]
    assert token.value is None and token.value_from.secret_key_ref.name == "gpuheal-webhook"
    assert webhook.automount_service_account_token is False
    worker = apps.read_namespaced_deployment(f"{RELEASE}-worker", NAMESPACE).spec.template.spec
    assert worker.service_account_name == f"{RELEASE}-worker"
    for pod in (worker, webhook):  # both read the policy (the webhook its duplicate window)
        mounts = {m.name: m.mount_path for m in pod.containers[0].volume_mounts}
        volumes = {v.name: v.config_map.name for v in pod.volumes if v.config_map is not None}
        assert mounts["policy"] == "/etc/gpuheal" and volumes["policy"] == f"{RELEASE}-policy"
    agent = apps.read_namespaced_daemon_set(f"{RELEASE}-agent", NAMESPACE)
    assert agent.spec.template.spec.automount_service_account_token is False
