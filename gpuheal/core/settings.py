"""Settings, from the environment (12-factor, as a Kubernetes Deployment would set them).

No default points into the source tree or at the sandbox: a worker started on a real cluster
without GPUHEAL_PROVIDER refuses to start (it would otherwise run a sandbox script there), and
commands that name incidents need GPUHEAL_CLUSTER.

| variable | default | meaning |
|---|---|---|
| GPUHEAL_TEMPORAL_ADDRESS | 127.0.0.1:7233 | Temporal frontend |
| GPUHEAL_NAMESPACE | default | Temporal namespace |
| GPUHEAL_TASK_QUEUE | gpuheal | task queue of the worker |
| GPUHEAL_UI_URL | http://127.0.0.1:8233 | Temporal Web UI, for links |
| GPUHEAL_CLUSTER | (required) | cluster name in reports and workflow ids (Slurm's ClusterName) |
| GPUHEAL_SLURM_BACKEND | cli | how the worker talks to Slurm: cli (Slurm's commands) or rest (slurmrestd) |
| SLURM_CONF | (Slurm's default) | cli: slurm.conf the worker's Slurm commands use |
| GPUHEAL_SLURM_CLI_WRAPPER | (none) | cli: a command that runs Slurm's commands elsewhere (e.g. `ssh login01`) |
| GPUHEAL_SLURM_REST_URL | (none) | rest: slurmrestd's address, e.g. http://slurmrestd:6820 |
| GPUHEAL_SLURM_REST_USER | (none) | rest: the Slurm user the token belongs to |
| GPUHEAL_SLURM_REST_TOKEN_FILE | (none) | rest: file holding the JWT (re-read when refused; never logged) |
| GPUHEAL_SLURM_REST_TOKEN | (none) | rest: the JWT itself (prefer the file) |
| GPUHEAL_SLURM_REST_API | (newest served) | rest: pin the API version, e.g. v0.0.42 |
| GPUHEAL_PROVIDER | (required by the worker) | how nodes are repaired/replaced: sandbox, kubernetes, exec |
| GPUHEAL_PROVIDER_HOOK | (none) | executable for GPUHEAL_PROVIDER=exec (cloud APIs) |
| GPUHEAL_REPAIR_HOOK | (none) | executable for GPU resets and reboots where the provider has none |
| GPUHEAL_PROVIDER_TIMEOUT_S | 900 | how long a provider may take to repair or replace a node |
| GPUHEAL_SLURM_DIR | (none) | sandbox provider only: the sandbox's directory |
| GPUHEAL_SANDBOX_SCRIPT | (none) | sandbox provider only: infra/slurm/sandbox.sh |
| GPUHEAL_SLURM_ROOT | (none) | sandbox provider only: the Debian root of a newer Slurm (infra/slurm/roots.sh) |
| GPUHEAL_WEBHOOK_TOKEN | (none: webhook refuses to start) | bearer token the webhook demands |
| GPUHEAL_NOTIFY_URL | (none) | webhook that receives notifications |
| GPUHEAL_CHECKPOINT_GRACE_S | 30 | at most this long for each signalled job to confirm a checkpoint |
| GPUHEAL_CHECKPOINT_UNCONFIRMED_WAIT_S | 5 | a signalled job that publishes no progress is waited for this long |
| GPUHEAL_VERIFY_TIMEOUT_S | 1800 | how long a requeued job may take to train past its checkpoint |
| GPUHEAL_CAPACITY_WAIT_S | 1800 | no spare: how long to keep trying for a replacement |
| GPUHEAL_CAPACITY_RETRY_S | 60 | ... and how often |
| GPUHEAL_JOB_GATHER_S | 2 | a job recovery waits this long for incidents on the job's other nodes |
| GPUHEAL_JOB_RETRY_BUDGET | 3 | requeues by gpuheal of one job ... |
| GPUHEAL_JOB_RETRY_WINDOW_S | 86400 | ... within this window; one more failure holds the job |
| GPUHEAL_OWNER_ROUTES | (none) | owner notices: JSON (inline or a file) of Slurm user -> webhook URL, "*" the default |
| GPUHEAL_OWNER_NOTIFY_FORMAT | generic | owner notices' payload: generic (gpuheal's JSON) or slack |
| GPUHEAL_BORROW_POOL | (none) | no spare: borrow a node from the inference pool with this gpuheal.io/pool |
| GPUHEAL_BORROW_FLOOR | 1 | never take an inference Deployment below this many ready replicas |
| GPUHEAL_GPUS_PER_NODE | 8 | for the GPU-time-lost figure |
| GPUHEAL_TEMPORAL_TLS_CA / _CERT / _KEY | (none) | PEM files for mTLS to Temporal |
| GPUHEAL_TEMPORAL_API_KEY | (none) | API key for Temporal (Temporal Cloud) |
| GPUHEAL_METRICS_HOST | 127.0.0.1 | where the worker serves metrics (0.0.0.0 in a pod) |
| GPUHEAL_KUBECONFIG | (none) | kubeconfig: turns on the Kubernetes half |
| GPUHEAL_SANDBOX_KUBECONFIG | (GPUHEAL_KUBECONFIG) | the sandbox provider's identity: it plays the cloud's node group |
| GPUHEAL_K8S_IN_CLUSTER | (unset) | 1: use the pod's ServiceAccount instead of a kubeconfig |
| GPUHEAL_K8S_NODE_LABEL | (none: same name) | Node label that holds the Slurm node name |
| GPUHEAL_K8S_NO_EXECUTE | (unset) | 1: also taint NoExecute |
| GPUHEAL_K8S_DRAIN_DEADLINE_S | 300 | how long PDB-blocked evictions are retried |
| GPUHEAL_K8S_ON_PDB_TIMEOUT | hold | then: hold (wait for approve/abort) or delete |
| GPUHEAL_DOMAIN_LABELS | gpuheal.io/rack,gpuheal.io/nvlink-domain | Node labels that name topology domains |

The cluster's policy (gpuheal.core.fleet): the worker's configuration seeds the coordinator when the
cluster's first incident comes; from then on the coordinator's policy rules (change it with
`gpuheal mode` or the coordinator's `set_policy` update), whoever sends a report.

| variable | default | meaning |
|---|---|---|
| GPUHEAL_MODE | auto | observe (record, touch nothing), approve (every action waits for a human), auto |
| GPUHEAL_APPROVAL_REQUIRED | (none) | comma list of action classes that wait for a human |
| GPUHEAL_APPROVAL_TIMEOUT_S | 900 | how long to wait for approve / abort |
| GPUHEAL_APPROVAL_DEFAULT | abort | what silence means |
| GPUHEAL_BUDGET | 10% | nodes out of service because of gpuheal at once: a count (3) or a share (5%) |
| GPUHEAL_BUDGET_PER_POOL | (none) | the same per pool (gpuheal.io/pool label, or Slurm partition) |
| GPUHEAL_BUDGET_PER_DOMAIN | (none) | the same per topology domain (GPUHEAL_DOMAIN_LABELS) |
| GPUHEAL_RATE / GPUHEAL_RATE_WINDOW_S | 20 / 3600 | new remediations per window |
| GPUHEAL_NODE_COOLDOWN_S | 1800 | a node's next remediation waits this long after its last |
| GPUHEAL_BREAKER_MAX / _WINDOW_S | 10 / 300 | more new incidents than this within the window trips the breaker |
| GPUHEAL_BREAKER_DOMAIN_SHARE | 0.75 | ... or more than this share of one domain |
| GPUHEAL_ESCALATION_SHARE / _WINDOW_S | 0.5 / 300 | this share of a domain within the window is one domain incident |
| GPUHEAL_REPEAT_INCIDENTS / _WINDOW_S | 3 / 604800 | a node (or GPU) with this many incidents in it is replaced |
| GPUHEAL_HELD_CONTAINMENT | drain | while held: drain (nothing new lands on the node) or none (touch nothing) |
| GPUHEAL_DUPLICATE_WINDOW_S | 600 | a report for a node whose incident closed this recently starts nothing |
| GPUHEAL_MAX_HOLD_S | 21600 | a held incident waits at most this long, then ends not_granted |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, SecretStr

from gpuheal.core.errors import SettingsError
from gpuheal.core.fleet import BreakerPolicy, BudgetPolicy, EscalationPolicy, FleetPolicy, RepeatPolicy
from gpuheal.core.models import (
    ActionClass,
    ApprovalPolicy,
    BorrowPolicy,
    JobRecoverySettings,
    KubernetesPolicy,
    RemediationSettings,
)


class SlurmSettings(BaseModel):
    """How the worker reaches Slurm (gpuheal/clients/slurm)."""

    backend: Literal["cli", "rest"] = "cli"
    cli_wrapper: str | None = None
    rest_url: str | None = None
    rest_user: str | None = None
    rest_token: SecretStr | None = None
    rest_token_file: Path | None = None
    rest_api: str | None = None


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
    cluster: str | None = None
    slurm_conf: str | None = None
    slurm: SlurmSettings = SlurmSettings()
    provider: str | None = None  # a name registered in gpuheal/providers/ (checked when the worker builds it)
    provider_hook: str | None = None
    repair_hook: str | None = None
    sandbox_dir: Path | None = None
    sandbox_script: Path | None = None
    sandbox_root: Path | None = None
    webhook_token: SecretStr | None = None
    notify_url: str | None = None
    owner_routes: str | None = None
    owner_format: Literal["generic", "slack"] = "generic"
    kubeconfig: str | None = None
    sandbox_kubeconfig: str | None = None
    k8s_in_cluster: bool = False
    remediation: RemediationSettings = RemediationSettings()
    fleet: FleetPolicy = FleetPolicy()  # seeds the cluster's coordinator (its policy rules after)
    domain_labels: tuple[str, ...] = ("gpuheal.io/rack", "gpuheal.io/nvlink-domain")

    @property
    def kubernetes_enabled(self) -> bool:
        return self.kubeconfig is not None or self.k8s_in_cluster

    def require_cluster(self) -> str:
        """The cluster name, or a clear refusal: incidents are named after it."""
        if not self.cluster:
            raise SettingsError(
                "GPUHEAL_CLUSTER is not set: set it to this cluster's name (Slurm's ClusterName), or pass --cluster"
            )
        return self.cluster

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        def get(name: str, default: str) -> str:
            return env.get(name, "") or default

        def opt(name: str) -> str | None:
            return env.get(name) or None

        def secret(name: str) -> SecretStr | None:  # SecretStr: never printed in logs or reprs
            return SecretStr(env[name]) if env.get(name) else None

        def path(name: str) -> Path | None:
            return Path(env[name]).resolve() if env.get(name) else None

        required = [a.strip() for a in env.get("GPUHEAL_APPROVAL_REQUIRED", "").split(",") if a.strip()]
        approval = ApprovalPolicy(
            required_for=tuple(ActionClass(a) for a in required),
            timeout_s=float(get("GPUHEAL_APPROVAL_TIMEOUT_S", "900")),
            default_on_timeout=get("GPUHEAL_APPROVAL_DEFAULT", "abort"),
        )
        verify_timeout_s = float(get("GPUHEAL_VERIFY_TIMEOUT_S", "1800"))
        gpus_per_node = int(get("GPUHEAL_GPUS_PER_NODE", "8"))
        borrow = opt("GPUHEAL_BORROW_POOL")
        kubeconfig = opt("GPUHEAL_KUBECONFIG")
        in_cluster = env.get("GPUHEAL_K8S_IN_CLUSTER") == "1"
        kubernetes = None
        if kubeconfig or in_cluster:
            kubernetes = KubernetesPolicy(
                node_label=opt("GPUHEAL_K8S_NODE_LABEL"),
                no_execute=env.get("GPUHEAL_K8S_NO_EXECUTE") == "1",
                drain_deadline_s=float(get("GPUHEAL_K8S_DRAIN_DEADLINE_S", "300")),
                on_pdb_timeout=get("GPUHEAL_K8S_ON_PDB_TIMEOUT", "hold"),
            )
        return cls(
            temporal_address=get("GPUHEAL_TEMPORAL_ADDRESS", "127.0.0.1:7233"),
            temporal_tls_ca=opt("GPUHEAL_TEMPORAL_TLS_CA"),
            temporal_tls_cert=opt("GPUHEAL_TEMPORAL_TLS_CERT"),
            temporal_tls_key=opt("GPUHEAL_TEMPORAL_TLS_KEY"),
            temporal_api_key=secret("GPUHEAL_TEMPORAL_API_KEY"),
            metrics_host=get("GPUHEAL_METRICS_HOST", "127.0.0.1"),
            namespace=get("GPUHEAL_NAMESPACE", "default"),
            task_queue=get("GPUHEAL_TASK_QUEUE", "gpuheal"),
            ui_url=get("GPUHEAL_UI_URL", "http://127.0.0.1:8233"),
            cluster=opt("GPUHEAL_CLUSTER"),
            slurm_conf=opt("SLURM_CONF"),
            slurm=SlurmSettings(
                backend=get("GPUHEAL_SLURM_BACKEND", "cli"),
                cli_wrapper=opt("GPUHEAL_SLURM_CLI_WRAPPER"),
                rest_url=opt("GPUHEAL_SLURM_REST_URL"),
                rest_user=opt("GPUHEAL_SLURM_REST_USER"),
                rest_token=secret("GPUHEAL_SLURM_REST_TOKEN"),
                rest_token_file=path("GPUHEAL_SLURM_REST_TOKEN_FILE"),
                rest_api=opt("GPUHEAL_SLURM_REST_API"),
            ),
            provider=opt("GPUHEAL_PROVIDER"),
            provider_hook=opt("GPUHEAL_PROVIDER_HOOK"),
            repair_hook=opt("GPUHEAL_REPAIR_HOOK"),
            sandbox_dir=path("GPUHEAL_SLURM_DIR"),
            sandbox_script=path("GPUHEAL_SANDBOX_SCRIPT"),
            sandbox_root=path("GPUHEAL_SLURM_ROOT"),
            webhook_token=secret("GPUHEAL_WEBHOOK_TOKEN"),
            notify_url=opt("GPUHEAL_NOTIFY_URL"),
            owner_routes=opt("GPUHEAL_OWNER_ROUTES"),
            owner_format=get("GPUHEAL_OWNER_NOTIFY_FORMAT", "generic"),
            kubeconfig=kubeconfig,
            sandbox_kubeconfig=opt("GPUHEAL_SANDBOX_KUBECONFIG"),
            k8s_in_cluster=in_cluster,
            fleet=FleetPolicy(
                mode=get("GPUHEAL_MODE", "auto"),
                approval=approval,
                budget=BudgetPolicy(
                    cluster=get("GPUHEAL_BUDGET", "10%"),
                    per_pool=opt("GPUHEAL_BUDGET_PER_POOL"),
                    per_domain=opt("GPUHEAL_BUDGET_PER_DOMAIN"),
                    rate=int(get("GPUHEAL_RATE", "20")),
                    rate_window_s=float(get("GPUHEAL_RATE_WINDOW_S", "3600")),
                    node_cooldown_s=float(get("GPUHEAL_NODE_COOLDOWN_S", "1800")),
                ),
                breaker=BreakerPolicy(
                    max_incidents=int(get("GPUHEAL_BREAKER_MAX", "10")),
                    window_s=float(get("GPUHEAL_BREAKER_WINDOW_S", "300")),
                    domain_share=float(get("GPUHEAL_BREAKER_DOMAIN_SHARE", "0.75")),
                ),
                escalation=EscalationPolicy(
                    domain_share=float(get("GPUHEAL_ESCALATION_SHARE", "0.5")),
                    window_s=float(get("GPUHEAL_ESCALATION_WINDOW_S", "300")),
                ),
                repeat=RepeatPolicy(
                    incidents=int(get("GPUHEAL_REPEAT_INCIDENTS", "3")),
                    window_s=float(get("GPUHEAL_REPEAT_WINDOW_S", str(7 * 86400))),
                ),
                containment_while_held=get("GPUHEAL_HELD_CONTAINMENT", "drain"),
                duplicate_window_s=float(get("GPUHEAL_DUPLICATE_WINDOW_S", "600")),
                max_hold_s=float(get("GPUHEAL_MAX_HOLD_S", "21600")),
            ),
            domain_labels=tuple(
                x.strip()
                for x in get("GPUHEAL_DOMAIN_LABELS", "gpuheal.io/rack,gpuheal.io/nvlink-domain").split(",")
                if x.strip()
            ),
            remediation=RemediationSettings(
                checkpoint_grace_s=float(get("GPUHEAL_CHECKPOINT_GRACE_S", "30")),
                checkpoint_unconfirmed_wait_s=float(get("GPUHEAL_CHECKPOINT_UNCONFIRMED_WAIT_S", "5")),
                verify_timeout_s=verify_timeout_s,
                provider_timeout_s=float(get("GPUHEAL_PROVIDER_TIMEOUT_S", "900")),
                capacity_wait_s=float(get("GPUHEAL_CAPACITY_WAIT_S", "1800")),
                capacity_retry_s=float(get("GPUHEAL_CAPACITY_RETRY_S", "60")),
                gpus_per_node=gpus_per_node,
                kubernetes=kubernetes,
                borrow=BorrowPolicy(pool=borrow, floor=int(get("GPUHEAL_BORROW_FLOOR", "1"))) if borrow else None,
                jobs=JobRecoverySettings(
                    gather_s=float(get("GPUHEAL_JOB_GATHER_S", "2")),
                    verify_timeout_s=verify_timeout_s,
                    retry_budget=int(get("GPUHEAL_JOB_RETRY_BUDGET", "3")),
                    retry_window_s=float(get("GPUHEAL_JOB_RETRY_WINDOW_S", "86400")),
                    gpus_per_node=gpus_per_node,
                ),
            ),
        )

    def incident_url(self, workflow_id: str) -> str:
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{workflow_id}"
