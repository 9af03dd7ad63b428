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

from gpuheal.core.envvars import variables
from gpuheal.core.models.base import ActionClass
from gpuheal.core.settings import Settings
from infra.sandbox import REPO
from infra.sandbox.kube import KubeSandbox

pytestmark = pytest.mark.integration

CHART = REPO / "infra" / "helm" / "gpuheal"
CI_VALUES = CHART / "ci" / "mtls-values.yaml"  # a complete install: mTLS per component, munge
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
        "-f", str(CI_VALUES),
        "--set", "agent.enabled=true",
        "--set", "policy.mode=observe",
        "--set", "clusterApi.namespaces={default}",
        # No pods: the sandbox schedules onto its kwok nodes, and other tests count what runs there.
        "--set", "worker.replicas=0", "--set", "coordinatorWorker.replicas=0", "--set", "webhook.replicas=0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    yield kube
    helm(kube, "uninstall", RELEASE, "-n", NAMESPACE)


def test_helm_lint_passes() -> None:
    done = subprocess.run([helm_bin(), "lint", str(CHART), "-f", str(CI_VALUES)], capture_output=True, text=True)
    assert done.returncode == 0 and "0 chart(s) failed" in done.stdout, done.stdout + done.stderr


def render(*args: str) -> subprocess.CompletedProcess[str]:
    """`helm template` of the complete install (CI_VALUES) with `args` over it."""
    argv = [helm_bin(), "template", "r", str(CHART), "--kube-version", "1.36.0", "-f", str(CI_VALUES), *args]
    return subprocess.run(argv, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("values", "refused"),
    [
        ({"temporal.tls.secretName": "", "temporal.tls.webhookSecretName": ""}, "temporal.tls.plaintext=true if"),
        ({"temporal.tls.webhookSecretName": ""}, "the webhook needs a certificate of its own"),
        ({"temporal.tls.webhookSecretName": "temporal-tls-worker"}, "one identity per component"),
        ({"extraEnv.GPUHEAL_TEMPORAL_API_KEY": "k"}, "would land in a ConfigMap"),
        ({"extraEnv.GPUHEAL_SLURM_REST_TOKEN": "t"}, "would land in a ConfigMap"),
        ({"extraEnv.GPUHEAL_OWNER_NOTIFY_URL": "https://hooks.example/T0/B0/x"}, "would land in a ConfigMap"),
        ({"slurm.mungeKeySecret": ""}, "need munge with the cluster's key"),
        ({"extraEnv.GPUHEAL_SMTP_PASSWORD": "p"}, "would land in a ConfigMap"),
        ({"slurm.backend": "rest"}, "needs slurm.restUrl and slurm.restTokenSecret.name"),
        ({"coordinatorWorker.replicas": "0"}, "nothing else runs the cluster's coordinator"),
    ],
)
def test_the_chart_refuses_to_fail_open(values: dict[str, str], refused: str) -> None:
    """Security off by omission, a secret bound for a ConfigMap, a Slurm it could not talk to:
    refused at render time, saying what to set (not a release that runs open or not at all)."""
    done = render(*(a for k, v in values.items() for a in ("--set", f"{k}={v}")))
    assert done.returncode != 0 and refused in done.stderr, done.stderr


def test_every_declared_secret_variable_is_refused_in_extra_env() -> None:
    """The chart's pattern covers each variable the settings declare secret."""
    secret = [v.name for v in variables(Settings) if v.secret]
    assert secret, "no secret variables found: the declarations moved"
    for name in secret:
        done = render("--set", f"extraEnv.{name}=x")
        assert done.returncode != 0 and "would land in a ConfigMap" in done.stderr, name


@pytest.mark.parametrize(
    ("own", "serves"), [("true", {"worker": "incidents", "coordinator": "coordinator"}), ("false", {"worker": "all"})]
)
def test_the_coordinator_runs_in_worker_pods_of_its_own_unless_turned_off(own: str, serves: dict[str, str]) -> None:
    """Between them the Deployments serve both queues, each pod with the worker's Slurm, munge,
    policy, identity and ServiceAccount (the coordinator's activities read Slurm and the Nodes)."""
    done = render("--set", f"coordinatorWorker.enabled={own}")
    assert done.returncode == 0, done.stderr
    deployments = {
        d["metadata"]["name"].removeprefix("r-"): d["spec"]["template"]["spec"]
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] != "r-webhook"
    }
    assert {name: _env(pod)["GPUHEAL_WORKER_SERVES"] for name, pod in deployments.items()} == serves
    selectors = [
        d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "Deployment"
    ]
    assert len(selectors) == len(set(selectors)), selectors  # no Deployment adopts another's pods
    strategies = {
        d["spec"]["strategy"]["type"]
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] != "r-webhook"
    }
    assert strategies == {"Recreate"}  # no release's workers beside the one before
    for pod in deployments.values():
        assert pod["serviceAccountName"] == "r-worker"
        assert [c["name"] for c in pod["containers"]] == ["worker", "munged"]
        assert {v["name"] for v in pod["volumes"]} >= {"slurm-config", "munge", "munge-key", "policy", "temporal-tls"}


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["containers"][0].get("env") or []}


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

    def allowed(verb: str, resource: str, subresource: str = "", group: str = "", namespace: str = "") -> bool:
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=subject,
                groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb,
                    resource=resource,
                    subresource=subresource or None,
                    group=group,
                    namespace=namespace or None,
                ),
            )
        )
        return bool(client.AuthorizationV1Api(api).create_subject_access_review(review).status.allowed)

    assert allowed("patch", "nodes") and allowed("create", "pods", "eviction") and allowed("create", "events")
    assert not allowed("get", "secrets") and not allowed("delete", "pods") and not allowed("create", "pods")
    assert not allowed("update", "deployments", group="apps")
    # Cluster API's Machines: only in the namespaces configured, with the rules the tests run under.
    machines = next(d for d in yaml.safe_load_all((REPO / "infra/k8s/rbac.yaml").read_text()) if d["kind"] == "Role")
    role = client.RbacAuthorizationV1Api(api).read_namespaced_role(f"{RELEASE}-worker-machines", "default")
    assert rules(role.rules) == rules(machines["rules"])
    capi = "cluster.x-k8s.io"
    assert allowed("delete", "machines", group=capi, namespace="default")
    assert not allowed("delete", "machines", group=capi, namespace="kube-system")
    assert not allowed("delete", "machines", group=capi)  # never cluster-wide
    config = client.CoreV1Api(api).read_namespaced_config_map(RELEASE, NAMESPACE).data
    assert config["GPUHEAL_CAPI_NAMESPACES"] == "default"


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
    # One Temporal identity per component, each from its Secret; secrets only from Secrets.
    tls = {
        name: next(v.secret.secret_name for v in pod.volumes if v.name == "temporal-tls")
        for name, pod in (("worker", worker), ("webhook", webhook))
    }
    assert tls == {"worker": "temporal-tls-worker", "webhook": "temporal-tls-webhook"}
    (url,) = [e for e in worker.containers[0].env if e.name == "GPUHEAL_NOTIFY_URL"]
    assert url.value is None and url.value_from.secret_key_ref.name == "gpuheal-notify"
    assert {e.name for e in webhook.containers[0].env} == {"GPUHEAL_WEBHOOK_TOKEN"}  # nothing it does not use
    for cm in core.list_namespaced_config_map(NAMESPACE).items:
        text = " ".join(f"{k}={v}" for k, v in (cm.data or {}).items())
        assert not any(word in text for word in ("GPUHEAL_NOTIFY_URL", "TOKEN=", "API_KEY=", "munge.key=")), cm
    # The CLI backend's Slurm commands authenticate through munged beside the worker.
    munged = next(c for c in worker.containers if c.name == "munged")
    assert "--key-file=/etc/munge-key/munge.key" in munged.command
    assert next(v for v in worker.volumes if v.name == "munge-key").secret.secret_name == "slurm-munge-key"
    agent = apps.read_namespaced_daemon_set(f"{RELEASE}-agent", NAMESPACE)
    assert agent.spec.template.spec.automount_service_account_token is False
