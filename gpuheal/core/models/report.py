"""A health report: what a trigger (node agent, Alertmanager, Slurm's health check) says failed.

Validated where it enters (a CLI flag, a webhook body), so a malformed report is refused with the
reason before any workflow starts.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from gpuheal.core.models.base import (
    GPU_SERIAL_PATTERN,
    PCI_BUS_ID_PATTERN,
    AwareDatetime,
    ClusterName,
    Frozen,
    NodeName,
)


class HealthReport(Frozen):
    """One observation that a GPU (or its node) is unhealthy."""

    node: NodeName
    cluster: ClusterName
    xid: int | None = Field(default=None, ge=1, le=999)
    # A non-XID signal, such as "gpu_lost", "ecc_dbe_volatile", "row_remap_failure",
    # "nvlink_down" or "health_check_failed" (see policy.SIGNAL_ACTIONS).
    signal: str | None = Field(default=None, pattern=r"^[a-z0-9_]{1,40}$")
    gpu: int | None = Field(default=None, ge=0, le=63)
    source: str = Field(default="cli", pattern=r"^[a-z0-9_-]{1,32}$")
    observed_at: AwareDatetime
    summary: str = Field(default="", max_length=500)
    # An Alertmanager alert's identity (fingerprint@startsAt): the same alert re-sent starts nothing.
    alert_key: str | None = Field(default=None, pattern=r"^[A-Za-z0-9@:+._-]{1,100}$")
    gpu_uuid: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")  # a GPU's record follows it
    # The board's serial (what a vendor's RMA asks for; it survives re-imaging and node renames)
    # and its PCI bus id; the kernel's own line for the failure, verbatim.
    gpu_serial: str | None = Field(default=None, pattern=GPU_SERIAL_PATTERN)
    pci_bus_id: str | None = Field(default=None, pattern=PCI_BUS_ID_PATTERN)
    kernel_log: str = Field(default="", max_length=1000)

    @model_validator(mode="after")
    def _xid_or_signal(self) -> HealthReport:
        if self.xid is None and self.signal is None:
            raise ValueError("a report needs an XID or a signal name")
        return self

    def describe(self) -> str:
        what = f"XID {self.xid}" if self.xid is not None else self.signal
        gpu = f" on GPU {self.gpu}" if self.gpu is not None else ""
        return f"{what}{gpu} on {self.cluster}/{self.node}"
