"""Settings, from the environment (12-factor, as a Kubernetes Deployment would set them).

| variable | default | meaning |
|---|---|---|
| GPUHEAL_TEMPORAL_ADDRESS | 127.0.0.1:7233 | Temporal frontend |
| GPUHEAL_NAMESPACE | default | Temporal namespace |
| GPUHEAL_TASK_QUEUE | gpuheal | task queue of the worker |
| GPUHEAL_UI_URL | http://127.0.0.1:8233 | Temporal Web UI, for links |
| GPUHEAL_CLUSTER | sandbox | cluster name in reports and workflow ids |
| SLURM_CONF | (Slurm's default) | slurm.conf the worker's Slurm commands use |
| GPUHEAL_SLURM_DIR | .run/slurm | the sandbox's directory (sandbox provider) |
| GPUHEAL_WEBHOOK_TOKEN | (none: webhook refuses to start) | bearer token the webhook demands |
| GPUHEAL_NOTIFY_URL | (none) | webhook that receives notifications |
| GPUHEAL_APPROVAL_REQUIRED | (none) | comma list of action classes that wait for a human |
| GPUHEAL_APPROVAL_TIMEOUT_S | 900 | how long to wait for approve / abort |
| GPUHEAL_APPROVAL_DEFAULT | abort | what silence means |
| GPUHEAL_CHECKPOINT_GRACE_S | 30 | time jobs get to checkpoint before the requeue |
| GPUHEAL_VERIFY_TIMEOUT_S | 1800 | how long a requeued job may take to make progress |
| GPUHEAL_GPUS_PER_NODE | 8 | for the GPU-time-lost figure |
| GPUHEAL_TEMPORAL_TLS_CA / _CERT / _KEY | (none) | PEM files for mTLS to Temporal |
| GPUHEAL_TEMPORAL_API_KEY | (none) | API key for Temporal (Temporal Cloud) |
| GPUHEAL_METRICS_HOST | 127.0.0.1 | where the worker serves metrics (0.0.0.0 in a pod) |
| GPUHEAL_PROVIDER | sandbox | how nodes are replaced: sandbox, kubernetes, exec |
| GPUHEAL_PROVIDER_HOOK | (none) | executable for GPUHEAL_PROVIDER=exec (cloud APIs) |
| GPUHEAL_KUBECONFIG | (none) | kubeconfig: turns on the Kubernetes half |
| GPUHEAL_SANDBOX_KUBECONFIG | (GPUHEAL_KUBECONFIG) | the sandbox provider's identity: it plays the cloud's node group |
| GPUHEAL_K8S_IN_CLUSTER | (unset) | 1: use the pod's ServiceAccount instead of a kubeconfig |
| GPUHEAL_K8S_NODE_LABEL | (none: same name) | Node label that holds the Slurm node name |
| GPUHEAL_K8S_NO_EXECUTE | (unset) | 1: also taint NoExecute |
| GPUHEAL_K8S_DRAIN_DEADLINE_S | 300 | how long PDB-blocked evictions are retried |
| GPUHEAL_K8S_ON_PDB_TIMEOUT | hold | then: hold (wait for approve/abort) or delete |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, SecretStr

from gpuheal.models import ActionClass, ApprovalPolicy, KubernetesPolicy, RemediationSettings

REPO = Path(__file__).resolve().parents[1]


class Settings(BaseModel):
    temporal_address: str = "127.0.0.1:7233"
    temporal_tls_ca: str | None = None
    temporal_tls_cert: str | None = None
    temporal_tls_key: str | None = None
    temporal_api_key: SecretStr | None = None
    metrics_host: str = "127.0.0.1"
    namespace: str = "default"
    task_queue: str = "gpuheal"
    ui_url: str = "http://127.0.0.1:8233"
    cluster: str = "sandbox"
    slurm_conf: str | None = None
    sandbox_dir: Path = REPO / ".run" / "slurm"
    webhook_token: SecretStr | None = None
    notify_url: str | None = None
    provider: Literal["sandbox", "kubernetes", "exec"] = "sandbox"
    provider_hook: str | None = None
    kubeconfig: str | None = None
    sandbox_kubeconfig: str | None = None
    k8s_in_cluster: bool = False
    remediation: RemediationSettings = RemediationSettings()

    @property
    def kubernetes_enabled(self) -> bool:
        return self.kubeconfig is not None or self.k8s_in_cluster

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        def get(name: str, default: str) -> str:
            return env.get(name, "") or default

        def secret(name: str) -> SecretStr | None:  # SecretStr: never printed in logs or reprs
            return SecretStr(env[name]) if env.get(name) else None

        required = [a.strip() for a in env.get("GPUHEAL_APPROVAL_REQUIRED", "").split(",") if a.strip()]
        approval = ApprovalPolicy(
            required_for=tuple(ActionClass(a) for a in required),
            timeout_s=float(get("GPUHEAL_APPROVAL_TIMEOUT_S", "900")),
            default_on_timeout=get("GPUHEAL_APPROVAL_DEFAULT", "abort"),
        )
        sandbox_dir = Path(get("GPUHEAL_SLURM_DIR", str(REPO / ".run" / "slurm"))).resolve()
        kubeconfig = env.get("GPUHEAL_KUBECONFIG") or None
        in_cluster = env.get("GPUHEAL_K8S_IN_CLUSTER") == "1"
        kubernetes = None
        if kubeconfig or in_cluster:
            kubernetes = KubernetesPolicy(
                node_label=env.get("GPUHEAL_K8S_NODE_LABEL") or None,
                no_execute=env.get("GPUHEAL_K8S_NO_EXECUTE") == "1",
                drain_deadline_s=float(get("GPUHEAL_K8S_DRAIN_DEADLINE_S", "300")),
                on_pdb_timeout=get("GPUHEAL_K8S_ON_PDB_TIMEOUT", "hold"),
            )
        return cls(
            temporal_address=get("GPUHEAL_TEMPORAL_ADDRESS", "127.0.0.1:7233"),
            temporal_tls_ca=env.get("GPUHEAL_TEMPORAL_TLS_CA") or None,
            temporal_tls_cert=env.get("GPUHEAL_TEMPORAL_TLS_CERT") or None,
            temporal_tls_key=env.get("GPUHEAL_TEMPORAL_TLS_KEY") or None,
            temporal_api_key=secret("GPUHEAL_TEMPORAL_API_KEY"),
            metrics_host=get("GPUHEAL_METRICS_HOST", "127.0.0.1"),
            namespace=get("GPUHEAL_NAMESPACE", "default"),
            task_queue=get("GPUHEAL_TASK_QUEUE", "gpuheal"),
            ui_url=get("GPUHEAL_UI_URL", "http://127.0.0.1:8233"),
            cluster=get("GPUHEAL_CLUSTER", "sandbox"),
            slurm_conf=env.get("SLURM_CONF") or None,
            sandbox_dir=sandbox_dir,
            webhook_token=secret("GPUHEAL_WEBHOOK_TOKEN"),
            notify_url=env.get("GPUHEAL_NOTIFY_URL") or None,
            provider=get("GPUHEAL_PROVIDER", "sandbox"),
            provider_hook=env.get("GPUHEAL_PROVIDER_HOOK") or None,
            kubeconfig=kubeconfig,
            sandbox_kubeconfig=env.get("GPUHEAL_SANDBOX_KUBECONFIG") or None,
            k8s_in_cluster=in_cluster,
            remediation=RemediationSettings(
                approval=approval,
                checkpoint_grace_s=float(get("GPUHEAL_CHECKPOINT_GRACE_S", "30")),
                verify_timeout_s=float(get("GPUHEAL_VERIFY_TIMEOUT_S", "1800")),
                gpus_per_node=int(get("GPUHEAL_GPUS_PER_NODE", "8")),
                kubernetes=kubernetes,
            ),
        )

    def incident_url(self, workflow_id: str) -> str:
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{workflow_id}"
