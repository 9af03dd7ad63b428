"""The node agent against a substituted NVML library and real-format kernel log lines."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuheal.triggers.agent import Agent, AgentMetrics, Finding, WebhookReporter, findings_from
from gpuheal.triggers.alertmanager import AlertmanagerPayload, firing_payload, to_reports
from gpuheal.triggers.healthcheck import check
from gpuheal.triggers.kmsg import normalise_pci, parse_xid_line
from gpuheal.triggers.nvml import GpuReading, Nvml

# Lines in the format the NVIDIA driver writes (kernel log, 5xx drivers).
KERNEL_LINES = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=2345, name=python, GPU has fallen off the bus.", "0000:3b:00", 79),
    (
        "[12345.678] NVRM: Xid (PCI:0000:B1:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
        "error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "0000:b1:00",
        48,
    ),
    (
        "NVRM: Xid (PCI:0000:17:00): 119, pid=1, name=nccl, Timeout after 6s of waiting for RPC response from GPU0 "
        "GSP!",
        "0000:17:00",
        119,
    ),
    ("NVRM: Xid (PCI:0000:65:00.0): 94, Contained: SM (0x1). RST: No, D-RST: No", "0000:65:00", 94),
]


@pytest.mark.parametrize(("line", "pci", "xid"), KERNEL_LINES)
def test_kernel_log_xid_lines(line: str, pci: str, xid: int) -> None:
    hit = parse_xid_line(line)
    assert hit is not None and (hit.pci, hit.xid) == (pci, xid)


@pytest.mark.parametrize("line", ["NVRM: loading NVIDIA UNIX x86_64 Kernel Module", "Xid 79", ""])
def test_other_kernel_lines_are_not_xids(line: str) -> None:
    assert parse_xid_line(line) is None


def test_pci_ids_from_nvml_and_kernel_match() -> None:
    assert normalise_pci("00000000:3B:00.0") == normalise_pci("0000:3b:00") == "0000:3b:00"


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvmlLib:
    """Just enough of pynvml's surface, with per-GPU state a test can change."""

    NVMLError = NVMLError
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_NVLINK_MAX_LINKS = 4
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus: int = 2, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.state: list[dict[str, Any]] = [
            {
                "ecc": 0,
                "pending": 0,
                "rows": (0, 0, 0, 0),
                "lost": False,
                "reasons": 0,
                "links": 2,
                "pci": f"00000000:{0x3B + i:02X}:00.0",
                "uuid": f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000",
                "serial": f"165232008{i:04d}",
            }
            for i in range(gpus)
        ]

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError(12)  # NVML_ERROR_LIBRARY_NOT_FOUND

    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return len(self.state)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def _gpu(self, h: int) -> dict[str, Any]:
        if self.state[h]["lost"]:
            raise NVMLError(15)
        return self.state[h]

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self._gpu(h)["uuid"])

    def nvmlDeviceGetSerial(self, h: int) -> str:
        return str(self._gpu(h)["serial"])

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return type("Pci", (), {"busId": self._gpu(h)["pci"].encode()})

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return int(self._gpu(h)["ecc"])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return int(self._gpu(h)["pending"])

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return tuple(self._gpu(h)["rows"])  # type: ignore[return-value]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self._gpu(h)["reasons"])

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= self._gpu(h)["links"]:
            raise NVMLError(3)
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        return 10 * link + counter


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_readings_become_metrics_and_findings() -> None:
    lib = FakeNvmlLib()
    reg = CollectorRegistry()
    agent = Agent("gpu07", AgentMetrics(reg), nvml=Nvml(lib), kmsg_path=None)
    assert agent.start(background=False) == [] and agent.gpu_count == 2
    assert agent.poll_once() == []
    assert sample(reg, "gpuheal_agent_nvml_up", node="gpu07") == 1
    assert sample(reg, "gpuheal_gpu_nvlink_errors", node="gpu07", gpu="0", link="1", counter="crc_flit") == 12

    lib.state[1].update(ecc=3, rows=(0, 1, 1, 1), reasons=0x40)
    found = agent.poll_once()
    assert {f.signal for f in found} == {"ecc_dbe_volatile", "row_remap_failure"}
    assert sample(reg, "gpuheal_gpu_ecc_uncorrected_volatile", node="gpu07", gpu="1") == 3
    assert sample(reg, "gpuheal_gpu_remap_failure", node="gpu07", gpu="1") == 1
    assert sample(reg, "gpuheal_gpu_throttle", node="gpu07", gpu="1", reason="hw_thermal_slowdown") == 1
    # no new ECC errors: not reported again
    assert [f.signal for f in agent.poll_once()] == ["row_remap_failure"]

    lib.state[0]["lost"] = True
    found = agent.poll_once()
    assert Finding("0", signal="gpu_lost", text="GPU 0 lost (NVML_ERROR_GPU_IS_LOST)") in found
    assert sample(reg, "gpuheal_gpu_lost", node="gpu07", gpu="0") == 1


def test_xids_are_counted_per_gpu_and_xid() -> None:
    reg = CollectorRegistry()
    agent = Agent("gpu07", AgentMetrics(reg), nvml=Nvml(FakeNvmlLib()), kmsg_path=None)
    agent.start(background=False)
    hit = parse_xid_line(KERNEL_LINES[0][0])
    assert hit is not None
    for _ in range(3):  # a repeated XID stays visible, unlike a last-value gauge
        agent.on_xid(agent.pci_to_gpu[hit.pci], hit.xid, "kmsg")
    assert sample(reg, "gpuheal_gpu_xid_errors_total", node="gpu07", gpu="0", xid="79", source="kmsg") == 3
    assert (sample(reg, "gpuheal_gpu_xid_last_seen_timestamp_seconds", node="gpu07", gpu="0", xid="79") or 0) > 0


def test_without_nvml_the_agent_starts_and_says_why() -> None:
    reg = CollectorRegistry()
    agent = Agent("gpu07", AgentMetrics(reg), nvml=Nvml(FakeNvmlLib(fail_init=True)), kmsg_path="/nonexistent")
    problems = agent.start(background=False)
    assert any("NVML unavailable" in p and "polling is off" in p for p in problems)
    assert any("kernel log /nonexistent unreadable" in p for p in problems)
    assert sample(reg, "gpuheal_agent_nvml_up", node="gpu07") == 0


def test_real_nvml_library_on_this_machine_reports_unavailable_or_works() -> None:
    """Exercises the real pynvml binding: without a GPU it must fail with NVML's reason."""
    import pynvml

    nvml = Nvml(pynvml)
    try:
        count = nvml.open()
    except Exception as err:
        assert "NVML unavailable" in str(err)
    else:
        assert count >= 0 and isinstance(nvml.read(0) if count else GpuReading(0), GpuReading)


def test_healthcheck_findings() -> None:
    assert check(Nvml(FakeNvmlLib(fail_init=True)), expect_gpus=8)[0].signal == "health_check_failed"
    assert check(Nvml(FakeNvmlLib(fail_init=True)), expect_gpus=0) == []
    assert check(Nvml(FakeNvmlLib(gpus=7)), expect_gpus=8)[0].signal == "gpu_lost"
    assert check(Nvml(FakeNvmlLib(gpus=8)), expect_gpus=8) == []


def test_findings_from_is_pure() -> None:
    prev = GpuReading(index=0, ecc_uncorrected_volatile=2)
    assert findings_from(GpuReading(index=0, ecc_uncorrected_volatile=2), prev) == []
    assert findings_from(GpuReading(index=0, ecc_uncorrected_volatile=5), prev)[0].signal == "ecc_dbe_volatile"


def test_a_report_names_the_board_and_carries_the_kernels_line() -> None:
    """Each report says which board failed (UUID, serial, PCI bus id, from NVML at start-up) and
    the kernel's own line: the RMA evidence, from the agent to the incident."""
    received: list[dict[str, Any]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None: ...

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/alertmanager"
        reporter = WebhookReporter(url, "t0ken", "c1")
        agent = Agent("gpu07", AgentMetrics(CollectorRegistry()), nvml=Nvml(FakeNvmlLib()), reporter=reporter)
        agent.kmsg_path = None
        agent.start(background=False)
        line, _, _ = KERNEL_LINES[0]
        hit = parse_xid_line(line)
        assert hit is not None
        agent.on_xid(agent.pci_to_gpu[hit.pci], hit.xid, "kmsg", hit.text, line)
    finally:
        server.shutdown()
    (payload,) = received
    (report,) = to_reports(AlertmanagerPayload.model_validate(payload), "c1").reports
    assert report.gpu == 0 and report.gpu_serial == "1652320080000"
    assert report.gpu_uuid == "GPU-00000000-aaaa-bbbb-cccc-000000000000" and report.pci_bus_id == "0000:3b:00"
    assert report.kernel_log == line.strip()


def test_a_malformed_board_label_is_dropped_never_the_report() -> None:
    payload = firing_payload("gpu07", xid=79, board={"gpu_serial": "bad serial;", "pci_bus_id": "0000:3b:00"})
    (report,) = to_reports(AlertmanagerPayload.model_validate(payload), "c1").reports
    assert report.gpu_serial is None and report.pci_bus_id == "0000:3b:00" and report.xid == 79
