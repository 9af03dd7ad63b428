"""The dev harness: the local sandbox (Temporal dev server, Slurm daemons, Kubernetes with kwok,
Prometheus and Alertmanager) as real processes, and the demo. Used by the demo, the tests and
the benchmarks; never by the product (the import contract in pyproject.toml forbids it), and not
part of the installed wheel."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
SLURM_SCRIPT = INFRA / "slurm" / "sandbox.sh"
SLURM_ROOTS_SCRIPT = INFRA / "slurm" / "roots.sh"
TEMPORAL_SCRIPT = INFRA / "temporal" / "dev-server.sh"
TEMPORAL_CLUSTER_SCRIPT = INFRA / "temporal" / "cluster" / "cluster.sh"
TRAIN_JOB = INFRA / "slurm" / "jobs" / "train.py"
K8S = INFRA / "k8s"
MONITORING = INFRA / "monitoring"
RUN = REPO / ".run"

# Slurm releases the sandbox runs: the host's (Debian 12) and the Debian roots of roots.sh.
HOST_SLURM = "22.05"
SLURM_VERSIONS = ("22.05", "24.11", "26.05")
NEWEST_SLURM = SLURM_VERSIONS[-1]
