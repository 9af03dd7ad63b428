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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, SecretStr

from gpuheal.models import ActionClass, ApprovalPolicy, RemediationSettings

REPO = Path(__file__).resolve().parents[1]


class Settings(BaseModel):
    temporal_address: str = "127.0.0.1:7233"
    namespace: str = "default"
    task_queue: str = "gpuheal"
    ui_url: str = "http://127.0.0.1:8233"
    cluster: str = "sandbox"
    slurm_conf: str | None = None
    sandbox_dir: Path = REPO / ".run" / "slurm"
    webhook_token: SecretStr | None = None
    notify_url: str | None = None
    remediation: RemediationSettings = RemediationSettings()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        def get(name: str, default: str) -> str:
            return env.get(name, "") or default

        required = [a.strip() for a in env.get("GPUHEAL_APPROVAL_REQUIRED", "").split(",") if a.strip()]
        approval = ApprovalPolicy(
            required_for=tuple(ActionClass(a) for a in required),
            timeout_s=float(get("GPUHEAL_APPROVAL_TIMEOUT_S", "900")),
            default_on_timeout=get("GPUHEAL_APPROVAL_DEFAULT", "abort"),
        )
        sandbox_dir = Path(get("GPUHEAL_SLURM_DIR", str(REPO / ".run" / "slurm"))).resolve()
        return cls(
            temporal_address=get("GPUHEAL_TEMPORAL_ADDRESS", "127.0.0.1:7233"),
            namespace=get("GPUHEAL_NAMESPACE", "default"),
            task_queue=get("GPUHEAL_TASK_QUEUE", "gpuheal"),
            ui_url=get("GPUHEAL_UI_URL", "http://127.0.0.1:8233"),
            cluster=get("GPUHEAL_CLUSTER", "sandbox"),
            slurm_conf=env.get("SLURM_CONF") or None,
            sandbox_dir=sandbox_dir,
            webhook_token=SecretStr(env["GPUHEAL_WEBHOOK_TOKEN"]) if env.get("GPUHEAL_WEBHOOK_TOKEN") else None,
            notify_url=env.get("GPUHEAL_NOTIFY_URL") or None,
            remediation=RemediationSettings(
                approval=approval,
                checkpoint_grace_s=float(get("GPUHEAL_CHECKPOINT_GRACE_S", "30")),
                verify_timeout_s=float(get("GPUHEAL_VERIFY_TIMEOUT_S", "1800")),
                gpus_per_node=int(get("GPUHEAL_GPUS_PER_NODE", "8")),
            ),
        )

    def incident_url(self, workflow_id: str) -> str:
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{workflow_id}"
