"""The Kubernetes sandbox (infra/k8s/cluster.sh) from Python: start/stop, kwok nodes, and a
kubeconfig for the worker's ServiceAccount (infra/k8s/rbac.yaml) so tests and the demo run the
worker with exactly the privileges a real deployment grants it."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, utils
from kubernetes.client.exceptions import ApiException

from gpuheal.clients.kube import node_ready
from gpuheal.providers.sandbox import kwok_node
from infra.sandbox import K8S


def binaries_built() -> bool:
    out = subprocess.run([str(K8S / "build.sh"), "--print-bin"], capture_output=True, text=True, check=True)
    bin_dir = Path(out.stdout.strip())
    return all((bin_dir / b).exists() for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"))


@dataclass
class KubeSandbox:
    root: Path
    port: int = 16443

    def _env(self) -> dict[str, str]:
        return {**os.environ, "GPUHEAL_K8S_DIR": str(self.root), "GPUHEAL_K8S_PORT": str(self.port)}

    def _script(self, *args: str, timeout: float = 3600) -> None:
        proc = subprocess.run(
            [str(K8S / "cluster.sh"), *args], env=self._env(), capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise RuntimeError(f"cluster.sh {' '.join(args)} failed:\n{proc.stderr[-3000:]}")

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def worker_kubeconfig(self) -> Path:
        return self.root / "worker.kubeconfig"

    def start(self) -> None:
        self._script("start")
        self.core().list_namespace()
        self._worker_identity()

    def stop(self) -> None:
        self._script("stop")

    def stop_apiserver(self) -> None:
        self._script("stop-apiserver")

    def start_apiserver(self) -> None:
        self._script("start-apiserver")

    def api(self, kubeconfig: Path | None = None) -> client.ApiClient:
        api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig or self.admin_kubeconfig))  # type: ignore[no-untyped-call]
        return api

    def core(self, kubeconfig: Path | None = None) -> client.CoreV1Api:
        return client.CoreV1Api(self.api(kubeconfig))

    def apply(self, path: Path) -> None:
        try:
            utils.create_from_yaml(self.api(), str(path))  # type: ignore[no-untyped-call]
        except utils.FailToCreateError as err:
            if any(e.status != 409 for e in err.api_exceptions):
                raise

    def _worker_identity(self) -> None:
        """A kubeconfig holding a TokenRequest token for ServiceAccount gpuheal/gpuheal-worker."""
        self.apply(K8S / "rbac.yaml")
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=["https://kubernetes.default.svc"], expiration_seconds=24 * 3600)
        )
        resp: Any = self.core().create_namespaced_service_account_token("gpuheal-worker", "gpuheal", request)
        token = resp.status.token
        kc = yaml.safe_load(self.admin_kubeconfig.read_text())
        kc["users"] = [{"name": "gpuheal-worker", "user": {"token": token}}]
        kc["contexts"][0]["context"]["user"] = "gpuheal-worker"
        self.worker_kubeconfig.write_text(yaml.safe_dump(kc))
        self.worker_kubeconfig.chmod(0o600)

    # --- nodes and pods for scenarios ----------------------------------------------------

    def add_node(self, name: str, pool: str = "h100") -> None:
        try:
            self.core().create_node(kwok_node(name, pool))
        except ApiException as err:
            if err.status != 409:
                raise
        self.wait(lambda: node_ready(self.core().read_node(name)), f"node {name} Ready")

    def reset_nodes(self, names: list[str]) -> None:
        """Fresh nodes for a test: delete every workload, PDB, node and pod, then add `names`."""
        core: Any = self.core()  # the typed client's Optionals do not help a test harness
        apps: Any = client.AppsV1Api(self.api())
        policy: Any = client.PolicyV1Api(self.api())
        # The garbage collector deletes a Deployment's ReplicaSets and Pods meanwhile: one already
        # gone between the list and the delete is what was wanted (404).
        for dep in apps.list_namespaced_deployment("default").items:
            _delete(apps.delete_namespaced_deployment, dep.metadata.name, "default")
        for rs in apps.list_namespaced_replica_set("default").items:  # no new Pod from it meanwhile
            _delete(apps.delete_namespaced_replica_set, rs.metadata.name, "default")
        for ds in apps.list_namespaced_daemon_set("default").items:
            _delete(apps.delete_namespaced_daemon_set, ds.metadata.name, "default")
        for pdb in policy.list_namespaced_pod_disruption_budget("default").items:
            _delete(policy.delete_namespaced_pod_disruption_budget, pdb.metadata.name, "default")
        for pod in core.list_pod_for_all_namespaces().items:
            _delete(core.delete_namespaced_pod, pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        for node in core.list_node().items:
            _delete(core.delete_node, node.metadata.name)
        self.wait(lambda: not core.list_node().items, "old nodes gone")
        for name in names:
            self.add_node(name)

    def add_pod(
        self, name: str, node: str, namespace: str = "default", labels: dict[str, str] | None = None, owner: Any = None
    ) -> None:
        meta = client.V1ObjectMeta(
            name=name, namespace=namespace, labels=labels or {}, owner_references=[owner] if owner else None
        )
        spec = client.V1PodSpec(
            node_name=node,
            containers=[client.V1Container(name="main", image="busybox")],
            tolerations=[client.V1Toleration(operator="Exists")] if owner else None,
        )
        self.core().create_namespaced_pod(namespace, client.V1Pod(metadata=meta, spec=spec))
        core: Any = self.core()
        self.wait(lambda: core.read_namespaced_pod(name, namespace).status.phase == "Running", f"pod {name} Running")

    def label(self, name: str, labels: dict[str, str]) -> None:
        """Labels on a Node (a rack, as a data center's inventory labels its machines)."""
        self.core().patch_node(name, {"metadata": {"labels": labels}})

    def serve_inference(self, nodes: list[str], min_available: int, pool: str = "inference") -> Callable[[], int]:
        """An inference service on `nodes` (kwok, labelled with `pool`): a Deployment of one replica
        per node, as GPU servers run, and a PodDisruptionBudget keeping `min_available`; ready and
        its budget settled when this returns. Gives back a reading of its ready replicas."""
        for name in nodes:
            self.add_node(name, pool=pool)
        apps: Any = client.AppsV1Api(self.api())
        labels = {"app": "llm-serve"}
        pod = client.V1PodSpec(
            containers=[client.V1Container(name="vllm", image="vllm")],
            node_selector={"gpuheal.io/pool": pool},
            tolerations=[client.V1Toleration(operator="Exists", effect="NoSchedule", key="kwok.x-k8s.io/node")],
            affinity=client.V1Affinity(  # one replica per node, as GPU servers are
                pod_anti_affinity=client.V1PodAntiAffinity(
                    required_during_scheduling_ignored_during_execution=[
                        client.V1PodAffinityTerm(
                            label_selector=client.V1LabelSelector(match_labels=labels),
                            topology_key="kubernetes.io/hostname",
                        )
                    ]
                )
            ),
        )
        spec = client.V1DeploymentSpec(
            replicas=len(nodes),
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod),
        )
        apps.create_namespaced_deployment(
            "default", client.V1Deployment(metadata=client.V1ObjectMeta(name="llm-serve"), spec=spec)
        )
        policy: Any = client.PolicyV1Api(self.api())
        budget = client.V1PodDisruptionBudgetSpec(
            min_available=min_available, selector=client.V1LabelSelector(match_labels=labels)
        )
        policy.create_namespaced_pod_disruption_budget(
            "default", client.V1PodDisruptionBudget(metadata=client.V1ObjectMeta(name="llm-serve"), spec=budget)
        )

        def ready() -> int:
            return int(apps.read_namespaced_deployment("llm-serve", "default").status.ready_replicas or 0)

        self.wait(lambda: ready() == len(nodes), f"{len(nodes)} inference replicas ready")
        allowed = len(nodes) - min_available
        self.wait(
            lambda: (
                policy.read_namespaced_pod_disruption_budget("llm-serve", "default").status.disruptions_allowed
                == allowed
            ),
            f"the PDB allows {allowed} disruption(s)",
        )
        return ready

    @staticmethod
    def wait(check: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.2)
        raise TimeoutError(f"timed out waiting for {what}")


def _delete(call: Any, *args: Any, **kw: Any) -> None:
    """Delete it, unless it is gone already."""
    try:
        call(*args, **kw)
    except ApiException as err:
        if err.status != 404:
            raise
