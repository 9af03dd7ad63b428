"""`gpuheal healthcheck`: a one-shot GPU check for Slurm's HealthCheckProgram.

Slurm's stock health checks drain the node themselves, with a reason nobody acts on. This one
reports what it found to gpuheal's webhook instead, so the failure becomes an incident with a
workflow (drain, requeue, repair) and a timeline. It exits 0 so Slurm takes no action of its own;
its findings go to stdout for slurmd's log.
"""

from __future__ import annotations

from gpuheal.core.settings import Settings
from gpuheal.triggers.agent import Finding, findings_from
from gpuheal.triggers.agent_main import build_reporter
from gpuheal.triggers.nvml import Nvml, NvmlUnavailable


def check(nvml: Nvml, expect_gpus: int) -> list[Finding]:
    try:
        count = nvml.open()
    except NvmlUnavailable as err:
        if expect_gpus > 0:
            return [Finding("all", signal="health_check_failed", text=f"{err}; expected {expect_gpus} GPUs")]
        return []
    found: list[Finding] = []
    if count < expect_gpus:
        found.append(Finding("all", signal="gpu_lost", text=f"{count} of {expect_gpus} GPUs visible"))
    for i in range(count):
        found += findings_from(nvml.read(i), None)
    nvml.close()
    return found


def run_healthcheck(settings: Settings, node: str, expect_gpus: int, report_to: str | None) -> int:
    reporter = build_reporter(settings, report_to)
    found = check(Nvml(), expect_gpus)
    for f in found:
        sent = reporter.report(node, f) if reporter else False
        print(
            f"gpuheal healthcheck {node}: {f.signal or f'XID {f.xid}'} on GPU {f.gpu}: {f.text}"
            f"{' (reported)' if sent else ''}"
        )
    if not found:
        print(f"gpuheal healthcheck {node}: healthy")
    return 0
