"""The dev harness: the local sandbox (Temporal dev server, Slurm daemons, Kubernetes with kwok,
Prometheus and Alertmanager) as real processes, and the demo. Used by the demo, the tests and
the benchmarks; never by the product (the import contract in pyproject.toml forbids it), and not
part of the installed wheel."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
SLURM_SCRIPT = INFRA / "slurm" / "sandbox.sh"
TEMPORAL_SCRIPT = INFRA / "temporal" / "dev-server.sh"
TRAIN_JOB = INFRA / "slurm" / "jobs" / "train.py"
K8S = INFRA / "k8s"
MONITORING = INFRA / "monitoring"
RUN = REPO / ".run"
