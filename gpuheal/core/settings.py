"""Settings, from the environment (12-factor, as a Kubernetes Deployment would set them).

Each variable is declared once, on the field that holds it (gpuheal.core.envvars): its name, its
default and its meaning. The docs' Configuration page (docs/configuration.md) carries the tables,
generated from these declarations (`python -m gpuheal.core.settings --readme docs/configuration.md`)
and held to them by tests/test_settings_docs.py, as is the Helm chart's values.yaml.

No default points into the source tree or at the sandbox: a worker started on a real cluster
without GPUHEAL_PROVIDER refuses to start (it would otherwise run a sandbox script there), and
commands that name incidents need GPUHEAL_CLUSTER.

The cluster's policy (`fleet`, gpuheal.core.fleet) seeds the coordinator when the cluster's first
incident comes; from then on the coordinator's policy rules (change it with `gpuheal mode` or the
coordinator's `set_policy` update), whoever sends a report.

Each client is handed its own part: `temporal` (gpuheal.clients.temporal), `slurm`
(gpuheal.clients.slurm), `provider` (gpuheal.providers).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, SecretStr, StringConstraints, field_validator

from gpuheal.core import ids
from gpuheal.core.envvars import load, setting, table, variables
from gpuheal.core.errors import SettingsError
from gpuheal.core.fleet import policy_file
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.models.base import ClusterName
from gpuheal.core.models.incident import RemediationSettings

LOCAL_TEMPORAL_ADDRESS = "127.0.0.1:7233"  # Temporal's dev server, where nothing names another
DEFAULT_NAMESPACE = "default"  # the SDK's own default namespace
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a Kubernetes namespace (a DNS label)


class TemporalSettings(BaseModel):
    """gpuheal's overrides of the Temporal SDK's own client configuration: gpuheal.clients.temporal
    loads the SDK's profile (TEMPORAL_PROFILE from TEMPORAL_CONFIG_FILE or the SDK's default file,
    then the TEMPORAL_* variables) and sets over it each of these that is set. None: the profile's."""

    address: str | None = setting(
        "GPUHEAL_TEMPORAL_ADDRESS",
        None,
        "Temporal frontend",
        unset=f"`TEMPORAL_ADDRESS`, else `{LOCAL_TEMPORAL_ADDRESS}`",
    )
    namespace: str | None = setting(
        "GPUHEAL_NAMESPACE", None, "Temporal namespace", unset=f"`TEMPORAL_NAMESPACE`, else `{DEFAULT_NAMESPACE}`"
    )
    tls_ca: str | None = setting(
        "GPUHEAL_TEMPORAL_TLS_CA",
        None,
        "mTLS to Temporal: PEM file of the CA that signed the server's certificate",
        unset="`TEMPORAL_TLS_SERVER_CA_CERT_PATH`",
    )
    tls_cert: str | None = setting(
        "GPUHEAL_TEMPORAL_TLS_CERT",
        None,
        "mTLS to Temporal: PEM file of gpuheal's client certificate",
        unset="`TEMPORAL_TLS_CLIENT_CERT_PATH`",
    )
    tls_key: str | None = setting(
        "GPUHEAL_TEMPORAL_TLS_KEY",
        None,
        "mTLS to Temporal: PEM file of that certificate's key",
        unset="`TEMPORAL_TLS_CLIENT_KEY_PATH`",
    )
    api_key: SecretStr | None = setting(  # SecretStr: never printed in logs or reprs
        "GPUHEAL_TEMPORAL_API_KEY",
        None,
        "API key for Temporal (Temporal Cloud); never logged",
        unset="`TEMPORAL_API_KEY`",
    )


class SlurmSettings(BaseModel):
    """How the worker reaches Slurm (gpuheal/clients/slurm)."""

    backend: Literal["cli", "rest"] = setting(
        "GPUHEAL_SLURM_BACKEND", "cli", "how the worker talks to Slurm: `cli` (Slurm's commands) or `rest` (slurmrestd)"
    )
    conf: str | None = setting(
        "SLURM_CONF", None, "cli: the slurm.conf the worker's Slurm commands use", unset="Slurm's default"
    )
    cli_wrapper: str | None = setting(
        "GPUHEAL_SLURM_CLI_WRAPPER", None, "cli: a command that runs Slurm's commands elsewhere (e.g. `ssh login01`)"
    )
    rest_url: str | None = setting(
        "GPUHEAL_SLURM_REST_URL", None, "rest: slurmrestd's address, e.g. `http://slurmrestd:6820`"
    )
    rest_user: str | None = setting("GPUHEAL_SLURM_REST_USER", None, "rest: the Slurm user the token belongs to")
    rest_token_file: Path | None = setting(
        "GPUHEAL_SLURM_REST_TOKEN_FILE", None, "rest: file holding the JWT (re-read when refused; never logged)"
    )
    rest_token: SecretStr | None = setting("GPUHEAL_SLURM_REST_TOKEN", None, "rest: the JWT itself (prefer the file)")
    validate_user: str | None = setting(
        "GPUHEAL_VALIDATE_USER",
        None,
        "burn-in: the Slurm user its job runs as, the only one its reservation admits (through ssh: the remote one)",
        unset="the worker's own user",
    )
    validate_sbatch_args: str = setting(
        "GPUHEAL_VALIDATE_SBATCH_ARGS",
        "",
        "burn-in: more sbatch options, e.g. `--partition=gpu --gpus-per-node=8 --time=30`",
    )
    rest_api: str | None = setting(
        "GPUHEAL_SLURM_REST_API", None, "rest: pin the API version, e.g. `v0.0.42`", unset="the newest served"
    )


class ProviderSettings(BaseModel):
    """How nodes are repaired and replaced (gpuheal/providers); how long they may take is the
    incident's (RemediationSettings.provider_timeout_s), which the activities' timeouts share."""

    name: str | None = setting(  # a name registered in gpuheal/providers/ (checked when the worker builds it)
        "GPUHEAL_PROVIDER",
        None,
        "how nodes are repaired and replaced: `sandbox`, `kubernetes`, `exec`",
        unset="required by the worker",
    )
    hook: str | None = setting("GPUHEAL_PROVIDER_HOOK", None, "executable for `GPUHEAL_PROVIDER=exec` (cloud APIs)")
    repair_hook: str | None = setting(
        "GPUHEAL_REPAIR_HOOK", None, "executable for GPU resets and reboots where the provider has none"
    )
    sandbox_dir: Path | None = setting("GPUHEAL_SLURM_DIR", None, "sandbox provider only: the sandbox's directory")
    sandbox_script: Path | None = setting(
        "GPUHEAL_SANDBOX_SCRIPT", None, "sandbox provider only: `infra/slurm/sandbox.sh`"
    )
    sandbox_root: Path | None = setting(
        "GPUHEAL_SLURM_ROOT", None, "sandbox provider only: the Debian root of a newer Slurm (`infra/slurm/roots.sh`)"
    )
    sandbox_kubeconfig: str | None = setting(
        "GPUHEAL_SANDBOX_KUBECONFIG",
        None,
        "the sandbox provider's identity: it plays the cloud's node group",
        unset="`GPUHEAL_KUBECONFIG`'s",
    )
    capi_namespaces: str | None = setting(
        "GPUHEAL_CAPI_NAMESPACES",
        None,
        "kubernetes provider: comma-separated namespaces whose Cluster API Machines the worker may delete"
        " to replace a node (grant it get, list and delete on machines there, and nowhere else)",
        unset="a Cluster API node is never replaced: its incident says to replace it by hand",
    )

    capi_cluster: str | None = setting(
        "GPUHEAL_CAPI_CLUSTER",
        None,
        "kubernetes provider: the Cluster API Cluster whose Machines may be deleted (their spec.clusterName)",
        unset="any, where the Machine's nodeRef names the Node's UID (v1beta1); none where it does not (v1beta2)",
    )

    @field_validator("capi_namespaces")
    @classmethod
    def _namespaces(cls, value: str | None) -> str | None:
        for ns in (n.strip() for n in (value or "").split(",") if n.strip()):
            if not _NAMESPACE.match(ns):
                raise ValueError(f"GPUHEAL_CAPI_NAMESPACES: {ns!r} is not a Kubernetes namespace name")
        return value

    def machine_namespaces(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in (self.capi_namespaces or "").split(",") if n.strip())


class OwnerSettings(BaseModel):
    """Where a job's owner hears about its job (gpuheal.clients.owners): a chat webhook routed by
    Slurm user or account, and e-mail to the job's --mail-user through an SMTP relay."""

    routes: str | None = setting(
        "GPUHEAL_OWNER_ROUTES",
        None,
        "owner notices: JSON (inline or a file) of `user:NAME`, `account:NAME` (or a bare user name)"
        ' -> chat webhook URL, `"*"` the default',
    )
    notify_url: str | None = setting(
        "GPUHEAL_OWNER_NOTIFY_URL", None, "owner notices: the chat webhook for every job no route names"
    )
    format: Literal["generic", "slack"] = setting(
        "GPUHEAL_OWNER_NOTIFY_FORMAT", "generic", "owner notices' payload: `generic` (gpuheal's JSON) or `slack`"
    )
    smtp_host: str | None = setting(
        "GPUHEAL_SMTP_HOST",
        None,
        "owner e-mail: the SMTP relay (mail goes to the job's `--mail-user`)",
        unset="no e-mail",
    )
    smtp_port: int = setting("GPUHEAL_SMTP_PORT", 25, "owner e-mail: the relay's port", ge=1, le=65535)
    smtp_starttls: bool = setting("GPUHEAL_SMTP_STARTTLS", False, "owner e-mail: `1` to STARTTLS before sending")
    smtp_user: str | None = setting("GPUHEAL_SMTP_USER", None, "owner e-mail: the relay's login, if it asks")
    smtp_password_file: Path | None = setting(
        "GPUHEAL_SMTP_PASSWORD_FILE", None, "owner e-mail: file holding the relay's password (never logged)"
    )
    mail_from: str = setting("GPUHEAL_MAIL_FROM", "gpuheal@localhost", "owner e-mail: the sender address")
    mail_domain: str | None = setting(
        "GPUHEAL_MAIL_DOMAIN",
        None,
        "owner e-mail: a job whose `--mail-user` is a bare user name (Slurm's default) is mailed USER@this",
        unset="bare names get no e-mail",
    )
    mail_allowed: str | None = setting(
        "GPUHEAL_MAIL_ALLOWED_DOMAINS",
        None,
        "owner e-mail: comma-separated domains (and their subdomains) a job's addresses may be in; others get none",
        unset="GPUHEAL_MAIL_DOMAIN's alone where it is set, else none (`*`: any)",
    )

    def mail_allowed_domains(self) -> tuple[str, ...]:
        return tuple(d.strip() for d in (self.mail_allowed or "").split(",") if d.strip())


# A worker build's name in its Worker Deployment: an image tag, a git describe ("v2", "1.4.0").
BuildId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


def _not_a_coordinator_queue(queue: str) -> str:
    if queue.endswith(ids.COORDINATOR_QUEUE_SUFFIX):
        raise ValueError(
            f"{queue!r} ends in {ids.COORDINATOR_QUEUE_SUFFIX!r}, which names a coordinator's own queue "
            f"(that of cluster queue {ids.workflows_queue(queue)!r}): choose another name"
        )
    return queue


# A cluster's task queue; `<queue>-coordinator` beside it is its coordinator's (ids.coordinator_queue).
TaskQueue = Annotated[str, AfterValidator(_not_a_coordinator_queue)]


class Settings(BaseModel):
    temporal: TemporalSettings = TemporalSettings()
    task_queue: TaskQueue = setting("GPUHEAL_TASK_QUEUE", "gpuheal", "task queue of the worker")
    ui_url: str = setting("GPUHEAL_UI_URL", "http://127.0.0.1:8233", "Temporal Web UI, for links")
    metrics_host: str = setting(
        "GPUHEAL_METRICS_HOST", "127.0.0.1", "where the worker serves metrics (`0.0.0.0` in a pod)"
    )
    cluster: ClusterName | None = setting(
        "GPUHEAL_CLUSTER", None, "cluster name in reports and workflow ids (Slurm's ClusterName)", unset="required"
    )
    build_id: BuildId | None = setting(
        "GPUHEAL_BUILD_ID",
        None,
        "this worker's build: turns on Worker Versioning in the deployment `gpuheal-CLUSTER`, an incident stays on "
        "the build it started on (docs/production.md: upgrades)",
        unset="unversioned: every worker serves every incident",
    )
    worker_serves: Literal["all", "incidents", "coordinator"] = setting(
        "GPUHEAL_WORKER_SERVES",
        "all",
        "what `gpuheal worker` serves: `incidents` (the cluster's queue), `coordinator` (the coordinator's own queue: "
        "its workflow and activities, a process of its own so a storm's incidents never slow its decisions), or "
        "both; a cluster needs both served",
    )
    slurm: SlurmSettings = SlurmSettings()
    provider: ProviderSettings = ProviderSettings()
    webhook_token: SecretStr | None = setting(
        "GPUHEAL_WEBHOOK_TOKEN", None, "bearer token the webhook demands", unset="none: the webhook refuses to start"
    )
    # Per webhook process (each replica has its own). Beyond them a request gets 503 with
    # Retry-After: Alertmanager's webhook retries a 5xx at once, a 429 only at the group's next interval.
    webhook_rate: float = setting(
        "GPUHEAL_WEBHOOK_RATE",
        50.0,
        "webhook: requests a second it admits (a token bucket); beyond, 503 with Retry-After, which Alertmanager "
        "retries",
        gt=0,
    )
    webhook_burst: int = setting(
        "GPUHEAL_WEBHOOK_BURST",
        100,
        "webhook: requests it admits at once above the rate (a storm's alerts, grouped by node, arrive together); "
        "each report costs Temporal a few calls, visibility listings among them: keep replicas x rate within the "
        "namespace's limits",
        ge=1,
    )
    notify_url: str | None = setting("GPUHEAL_NOTIFY_URL", None, "webhook that receives notifications")
    rma_hook: str | None = setting(
        "GPUHEAL_RMA_HOOK",
        None,
        "executable called as `HOOK rma NODE INCIDENT` with the RMA evidence (JSON) on stdin; prints"
        ' `{"ticket": "..."}`',
        unset="no ticket: the evidence is in the postmortem",
    )
    owners: OwnerSettings = OwnerSettings()
    kubeconfig: str | None = setting("GPUHEAL_KUBECONFIG", None, "kubeconfig: turns on the Kubernetes half")
    k8s_in_cluster: bool = setting(
        "GPUHEAL_K8S_IN_CLUSTER",
        False,
        "`1`: the Kubernetes half with the pod's ServiceAccount instead of a kubeconfig",
    )
    domain_labels: tuple[str, ...] = setting(
        "GPUHEAL_DOMAIN_LABELS",
        ("gpuheal.io/rack", "gpuheal.io/nvlink-domain"),
        "comma list of the Node labels that name topology domains",
    )
    remediation: RemediationSettings = RemediationSettings()
    coordinator_updates: int = setting(
        "GPUHEAL_COORDINATOR_UPDATES",
        4,
        "updates this worker sends its cluster's coordinator at once; Temporal accepts 10 in flight per workflow: "
        "keep workers x this <= 8 (the chart's 2 replicas x 4), leaving room for operators' own",
        ge=1,
        le=8,
    )
    policy_file: str | None = setting(
        "GPUHEAL_POLICY_FILE",
        None,
        "the cluster's policy as a YAML file of the policy's fields (the chart's ConfigMap), instead of the policy "
        "variables (then none may be set): a worker offers it to the coordinator when it starts",
    )
    # Seeds the cluster's coordinator (its policy rules after); duplicate_window_s alone is read
    # from here by whoever receives a report (triggers.start): the coordinator is not asked.
    fleet: FleetPolicy = FleetPolicy()

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
        """Every declared variable `env` sets; SettingsError (naming it, quoting it) for a bad one.
        The policy comes from GPUHEAL_POLICY_FILE where it is set: declared once, never twice."""
        s = load(cls, env)
        if s.policy_file is None:
            return s
        twice = [v.name for v in variables(cls) if v.path[0] == "fleet" and env.get(v.name)]  # "" is unset
        if twice:
            raise SettingsError(f"GPUHEAL_POLICY_FILE is set, and so is {', '.join(twice)}: put it in the file")
        try:
            policy = policy_file.merged(FleetPolicy(), policy_file.read(Path(s.policy_file)), source=s.policy_file)
        except policy_file.PolicyFileError as err:
            raise SettingsError(f"GPUHEAL_POLICY_FILE: {err}") from err
        return s.model_copy(update={"fleet": policy})

    def incident_url(self, workflow_id: str) -> str:
        namespace = self.temporal.namespace or DEFAULT_NAMESPACE
        return f"{self.ui_url}/namespaces/{namespace}/workflows/{workflow_id}"


# --- the docs' tables (docs/configuration.md) ------------------------------------------------

# docs/configuration.md holds one generated table per group between these markers.
_BLOCK = re.compile(r"(<!-- settings: (\w+) -->\n).*?(\n<!-- /settings -->)", re.S)


def readme_table(group: str) -> str:
    """`policy`: the cluster's policy (Settings.fleet); `worker`: everything else."""
    found = [v for v in variables(Settings) if (v.path[0] == "fleet") == (group == "policy")]
    return table(found)


def with_tables(readme: str) -> str:
    """`readme` with each marked block replaced by its generated table."""
    return _BLOCK.sub(lambda m: f"{m.group(1)}\n{readme_table(m.group(2))}\n{m.group(3)}", readme)


if __name__ == "__main__":
    # python -m gpuheal.core.settings --table worker|policy   (print one table)
    # python -m gpuheal.core.settings --readme docs/configuration.md   (regenerate the docs' tables in place)
    if sys.argv[1:2] == ["--table"] and len(sys.argv) == 3:
        print(readme_table(sys.argv[2]))
    elif sys.argv[1:2] == ["--readme"] and len(sys.argv) == 3:
        path = Path(sys.argv[2])
        path.write_text(with_tables(path.read_text()))
    else:
        sys.exit("usage: python -m gpuheal.core.settings --table worker|policy | --readme docs/configuration.md")
