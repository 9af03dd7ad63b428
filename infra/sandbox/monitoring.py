"""Prometheus and Alertmanager (Debian's packages) as plain processes on loopback, configured
from infra/monitoring, for the tests and the detection-latency benchmark."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from infra.sandbox import MONITORING


class MonitoringError(RuntimeError):
    pass


@dataclass
class Monitoring:
    root: Path
    webhook_url: str
    token_file: Path
    agents: dict[str, int]  # node -> agent metrics port
    workers: tuple[int, ...] = ()  # worker metrics ports to scrape (gpuheal's and the SDK's)
    prometheus_port: int = 29090
    alertmanager_port: int = 29093
    interval: str = "1s"
    group_wait: str = "1s"
    group_interval: str = "1s"
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def render(self) -> tuple[Path, Path]:
        self.root.mkdir(parents=True, exist_ok=True)
        targets = (
            "\n".join(
                f'        - targets: ["127.0.0.1:{port}"]\n          labels: {{node: "{node}"}}'
                for node, port in self.agents.items()
            )
            or "      []"
        )
        prom = self.root / "prometheus.yml"
        prom.write_text(
            Template((MONITORING / "prometheus.yml.tmpl").read_text()).substitute(
                INTERVAL=self.interval,
                RULES=MONITORING / "rules.yml",
                AM_PORT=self.alertmanager_port,
                AGENT_TARGETS=targets,
                WORKER_JOBS=self._worker_jobs(),
            )
        )
        am = self.root / "alertmanager.yml"
        am.write_text(
            Template((MONITORING / "alertmanager.yml.tmpl").read_text()).substitute(
                GROUP_WAIT=self.group_wait,
                GROUP_INTERVAL=self.group_interval,
                WEBHOOK_URL=self.webhook_url,
                TOKEN_FILE=self.token_file,
            )
        )
        return prom, am

    def _worker_jobs(self) -> str:
        if not self.workers:
            return ""
        targets = ", ".join(f'"127.0.0.1:{port}"' for port in self.workers)
        return f"  - job_name: gpuheal-worker\n    static_configs:\n      - targets: [{targets}]"

    def query(self, promql: str) -> list[dict[str, object]]:
        """One instant query against this Prometheus: the result vector (empty: no data)."""
        url = f"http://127.0.0.1:{self.prometheus_port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise MonitoringError(f"query {promql!r} failed: {body}")
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def start(self, prometheus: bool = True) -> None:
        """Alertmanager, then Prometheus (unless told not to: alerts posted to Alertmanager's API)."""
        for binary in ("prometheus", "prometheus-alertmanager")[not prometheus :]:
            if shutil.which(binary) is None:
                raise MonitoringError(f"{binary} is missing: make setup installs Debian's package")
        prom, am = self.render()
        self.procs.append(
            self._spawn(
                "alertmanager",
                [
                    "prometheus-alertmanager",
                    f"--config.file={am}",
                    f"--storage.path={self.root / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
                    "--cluster.listen-address=",
                ],
            )
        )
        if not prometheus:
            self._wait_ready(self.alertmanager_port)
            return
        self.procs.append(
            self._spawn(
                "prometheus",
                [
                    "prometheus",
                    f"--config.file={prom}",
                    f"--storage.tsdb.path={self.root / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                ],
            )
        )
        for port in (self.alertmanager_port, self.prometheus_port):
            self._wait_ready(port)

    def fire(self, *alerts: dict[str, str]) -> None:
        """Alerts (their labels) posted to Alertmanager's API, as Prometheus posts its firing rules."""
        body = json.dumps([{"labels": labels, "annotations": {"summary": "from the test"}} for labels in alerts])
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.alertmanager_port}/api/v2/alerts",
            data=body.encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10):
            pass

    def metric(self, name: str) -> float:
        """The sum of Alertmanager's own metric `name` over its series (0: none)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.alertmanager_port}/metrics", timeout=10) as resp:
            lines = resp.read().decode().splitlines()
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.split("{")[0].split(" ")[0] == name)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "ab")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _wait_ready(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise MonitoringError(f"port {port} not ready after {timeout:.0f} s; logs in {self.root}")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()
