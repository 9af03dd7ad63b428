"""The node health agent: NVML readings and kernel-log XIDs -> Prometheus metrics (and reports).

- XIDs: from the kernel log when it is readable (it has every XID); from NVML's critical-XID
  events otherwise. Either way a counter per GPU and XID (`gpuheal_gpu_xid_errors_total`), so a
  repeated XID stays visible, unlike dcgm-exporter's last-value gauge.
- Health counters polled from NVML: uncorrectable volatile ECC errors, retired pages pending,
  remapped rows pending/failed, NVLink error counters, hardware throttle reasons, GPU lost.
- Optionally reports straight to gpuheal's webhook (the direct path, seconds faster than
  scrape + rule evaluation + Alertmanager grouping), with the same bearer token.

On a machine without a GPU it starts, says so, and still watches the kernel log.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuheal.core import policy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.report import HealthReport
from gpuheal.triggers.alertmanager import firing_payload
from gpuheal.triggers.kmsg import follow, normalise_pci, parse_xid_line
from gpuheal.triggers.nvml import GpuReading, Nvml, NvmlUnavailable

log = logging.getLogger("gpuheal.agent")


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        g = ["node", "gpu"]
        self.nvml_up = Gauge("gpuheal_agent_nvml_up", "1 when NVML answers", ["node"], registry=registry)
        self.xid = Counter(
            "gpuheal_gpu_xid_errors",
            "XID errors seen, per GPU and XID",
            [*g, "xid", "source"],
            registry=registry,
        )
        self.xid_last_seen = Gauge(
            "gpuheal_gpu_xid_last_seen_timestamp_seconds",
            "When each XID was last seen; alert rules use it so a restart never replays old XIDs",
            [*g, "xid"],
            registry=registry,
        )
        self.lost = Gauge("gpuheal_gpu_lost", "1 when NVML reports the GPU lost", g, registry=registry)
        self.ecc = Gauge(
            "gpuheal_gpu_ecc_uncorrected_volatile",
            "Uncorrectable ECC errors since reset",
            g,
            registry=registry,
        )
        self.retired = Gauge(
            "gpuheal_gpu_retired_pages_pending", "1 when page retirement awaits a reset", g, registry=registry
        )
        self.remap_pending = Gauge(
            "gpuheal_gpu_remap_pending", "1 when row remapping awaits a reset", g, registry=registry
        )
        self.remap_failure = Gauge("gpuheal_gpu_remap_failure", "1 when row remapping failed", g, registry=registry)
        self.nvlink = Gauge(
            "gpuheal_gpu_nvlink_errors", "NVLink error counters", [*g, "link", "counter"], registry=registry
        )
        self.throttle = Gauge(
            "gpuheal_gpu_throttle",
            "1 while a hardware throttle reason is active",
            [*g, "reason"],
            registry=registry,
        )


@dataclass(frozen=True)
class Finding:
    gpu: str
    xid: int | None = None
    signal: str | None = None
    text: str = ""
    kernel_log: str = ""  # the kernel's line, verbatim (RMA evidence)


class WebhookReporter:
    """Posts findings to gpuheal's webhook in Alertmanager's format (one endpoint, one parser)."""

    def __init__(self, url: str, token: str, cluster: str | None, quiet_s: float = 300) -> None:
        self.url, self.token, self.cluster, self.quiet_s = url, token, cluster, quiet_s
        self._sent: dict[tuple[str, int | None, str | None], float] = {}
        self.boards: dict[str, dict[str, str]] = {}  # GPU index -> its uuid, serial, PCI bus id

    def report(self, node: str, f: Finding) -> bool:
        key = (f.gpu, f.xid, f.signal)
        if time.monotonic() - self._sent.get(key, -1e9) < self.quiet_s:
            return False  # the running workflow already has it
        body = firing_payload(
            node,
            xid=f.xid,
            signal=f.signal,
            gpu=f.gpu,
            cluster=self.cluster,
            summary=f.text,
            alertname="GpuHealthAgent",
            receiver="gpuheal-agent",
            board=self.boards.get(f.gpu),
            kernel_log=f.kernel_log,
        )
        req = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10):
                pass
        except (urllib.error.URLError, OSError) as err:
            log.error("could not report %s to %s: %s", f, self.url, err)
            return False
        self._sent[key] = time.monotonic()
        return True


def findings_from(reading: GpuReading, previous: GpuReading | None) -> list[Finding]:
    """What in a reading is worth a remediation (pure: tested without NVML)."""
    gpu = str(reading.index)
    out = []
    if reading.lost:
        out.append(Finding(gpu, signal="gpu_lost", text=f"GPU {gpu} lost (NVML_ERROR_GPU_IS_LOST)"))
        return out
    if reading.remap_failure:
        out.append(Finding(gpu, signal="row_remap_failure", text=f"GPU {gpu}: row remapping failed"))
    before = previous.ecc_uncorrected_volatile if previous else 0
    if reading.ecc_uncorrected_volatile and reading.ecc_uncorrected_volatile > (before or 0):
        out.append(
            Finding(
                gpu,
                signal="ecc_dbe_volatile",
                text=f"GPU {gpu}: {reading.ecc_uncorrected_volatile} uncorrectable ECC errors",
            )
        )
    return out


def actionable_xid(xid: int) -> bool:
    probe = HealthReport(node="probe", cluster="probe", xid=xid, observed_at=datetime.now(UTC))
    return policy.triage(probe).action != ActionClass.IGNORE


class Agent:
    def __init__(
        self,
        node: str,
        metrics: AgentMetrics,
        nvml: Nvml | None = None,
        kmsg_path: str | None = "/dev/kmsg",
        reporter: WebhookReporter | None = None,
        poll_s: float = 10.0,
    ) -> None:
        self.node, self.m, self.nvml, self.kmsg_path = node, metrics, nvml, kmsg_path
        self.reporter, self.poll_s = reporter, poll_s
        self.gpu_count = 0
        self.pci_to_gpu: dict[str, str] = {}
        self._last: dict[int, GpuReading] = {}
        self._stop = threading.Event()

    # --- start-up ------------------------------------------------------------------------

    def start(self, background: bool = True) -> list[str]:
        """Open the sources and (with background) start watching them; returns what the agent
        could not use, each said plainly."""
        problems = []
        if self.nvml is not None:
            try:
                self.gpu_count = self.nvml.open()
                self.m.nvml_up.labels(self.node).set(1)
            except NvmlUnavailable as err:
                self.nvml = None
                self.m.nvml_up.labels(self.node).set(0)
                problems.append(f"{err} (no GPU or no NVIDIA driver here): NVML health polling is off")
        if self.nvml is not None:
            for i in range(self.gpu_count):
                r = self.nvml.read(i)
                if r.pci:
                    self.pci_to_gpu[normalise_pci(r.pci)] = str(i)
                if self.reporter is not None:  # every report names the board, for its RMA record
                    self.reporter.boards[str(i)] = {
                        "gpu_uuid": r.uuid,
                        "gpu_serial": r.serial,
                        "pci_bus_id": normalise_pci(r.pci) if r.pci else "",
                    }
        kmsg_ok = False
        if self.kmsg_path:
            try:
                open(self.kmsg_path, "rb").close()
                kmsg_ok = True
                if background:
                    threading.Thread(target=self._watch_kernel_log, daemon=True, name="kmsg").start()
            except OSError as err:
                problems.append(f"kernel log {self.kmsg_path} unreadable ({err}): XID 79/119/120 unseen")
        if self.nvml is not None and background:
            threading.Thread(target=self._poll_loop, daemon=True, name="nvml-poll").start()
            if not kmsg_ok and self.nvml.register_xid_events():
                threading.Thread(target=self._watch_nvml_events, daemon=True, name="nvml-events").start()
        log.info(
            "agent on %s: %d GPU(s) via NVML, kernel log %s",
            self.node,
            self.gpu_count,
            self.kmsg_path if kmsg_ok else "off",
        )
        for p in problems:
            log.warning("%s", p)
        return problems

    def stop(self) -> None:
        self._stop.set()

    # --- sources -------------------------------------------------------------------------

    def on_xid(self, gpu: str, xid: int, source: str, text: str = "", line: str = "") -> None:
        self.m.xid.labels(self.node, gpu, str(xid), source).inc()
        self.m.xid_last_seen.labels(self.node, gpu, str(xid)).set_to_current_time()
        log.warning("XID %d on GPU %s (%s) %s", xid, gpu, source, text)
        if self.reporter is not None and actionable_xid(xid):
            self.reporter.report(self.node, Finding(gpu, xid=xid, text=f"XID {xid}: {text}", kernel_log=line))

    def _watch_kernel_log(self) -> None:
        assert self.kmsg_path is not None
        for line in follow(self.kmsg_path):
            if self._stop.is_set():
                return
            hit = parse_xid_line(line)
            if hit is not None:
                self.on_xid(self.pci_to_gpu.get(hit.pci, hit.pci), hit.xid, "kmsg", hit.text, line.strip()[:1000])

    def _watch_nvml_events(self) -> None:
        assert self.nvml is not None
        while not self._stop.is_set():
            event = self.nvml.wait_xid(1000)
            if event is not None:
                self.on_xid(str(event[0]), event[1], "nvml")

    def poll_once(self) -> list[Finding]:
        assert self.nvml is not None
        found = []
        for i in range(self.gpu_count):
            r = self.nvml.read(i)
            g = str(i)
            self.m.lost.labels(self.node, g).set(int(r.lost))
            if r.ecc_uncorrected_volatile is not None:
                self.m.ecc.labels(self.node, g).set(r.ecc_uncorrected_volatile)
            for value, gauge in (
                (r.retired_pages_pending, self.m.retired),
                (r.remap_pending, self.m.remap_pending),
                (r.remap_failure, self.m.remap_failure),
            ):
                if value is not None:
                    gauge.labels(self.node, g).set(int(value))
            for (link, counter), n in r.nvlink_errors.items():
                self.m.nvlink.labels(self.node, g, str(link), counter).set(n)
            for reason, active in r.throttle.items():
                self.m.throttle.labels(self.node, g, reason).set(int(active))
            found += findings_from(r, self._last.get(i))
            self._last[i] = r
        if self.reporter is not None:
            for f in found:
                self.reporter.report(self.node, f)
        return found

    def _poll_loop(self) -> None:
        while not self._stop.wait(0 if not self._last else self.poll_s):
            try:
                self.poll_once()
            except Exception as err:
                log.error("NVML poll failed: %s", err)
