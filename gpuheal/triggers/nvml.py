"""A thin layer over NVML (PyPI nvidia-ml-py, module pynvml).

Thin on purpose: it only turns NVML calls into plain readings, so the agent's logic is tested
against a substituted library (tests/test_agent.py) and the real one is exercised on a GPU host.
On a machine without a GPU or driver, open() raises NvmlUnavailable with NVML's own reason.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

NVLINK_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
# Clock event (throttle) reasons that mean hardware trouble rather than policy.
THROTTLE_REASONS = {
    0x08: "hw_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake",
    0x20: "sw_thermal_slowdown",
}


class NvmlUnavailable(RuntimeError):
    pass


@dataclass
class GpuReading:
    index: int
    pci: str = ""
    uuid: str = ""
    serial: str = ""  # the board's serial (what a vendor's RMA asks for)
    lost: bool = False
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    nvlink_errors: dict[tuple[int, str], int] = field(default_factory=dict)
    throttle: dict[str, bool] = field(default_factory=dict)


class Nvml:
    def __init__(self, lib: Any = None) -> None:
        if lib is None:
            import pynvml

            lib = pynvml
        self.lib = lib
        self._handles: list[Any] = []
        self._events: Any = None

    def open(self) -> int:
        """Initialise NVML and return the GPU count."""
        try:
            self.lib.nvmlInit()
            count = int(self.lib.nvmlDeviceGetCount())
            self._handles = [self.lib.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self.lib.NVMLError as err:
            raise NvmlUnavailable(f"NVML unavailable: {err}") from err
        return count

    def close(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except self.lib.NVMLError:
            pass

    def _opt(self, fn: Callable[[], T]) -> T | None:
        """A reading the GPU may not support (NOT_SUPPORTED) is None, not an error."""
        try:
            return fn()
        except self.lib.NVMLError as err:
            if getattr(err, "value", None) == self.lib.NVML_ERROR_GPU_IS_LOST:
                raise
            return None

    def read(self, index: int) -> GpuReading:
        lib, h = self.lib, self._handles[index]
        r = GpuReading(index=index)
        try:
            r.pci = str(self._opt(lambda: _text(lib.nvmlDeviceGetPciInfo(h).busId)) or "")
            r.uuid = str(self._opt(lambda: _text(lib.nvmlDeviceGetUUID(h))) or "")
            r.serial = str(self._opt(lambda: _text(lib.nvmlDeviceGetSerial(h))) or "")
            r.ecc_uncorrected_volatile = self._opt(
                lambda: int(
                    lib.nvmlDeviceGetTotalEccErrors(h, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC)
                )
            )
            pending = self._opt(lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h))
            r.retired_pages_pending = None if pending is None else bool(pending)
            rows = self._opt(lambda: lib.nvmlDeviceGetRemappedRows(h))
            if rows is not None:
                r.remap_pending, r.remap_failure = bool(rows[2]), bool(rows[3])
            reasons = self._opt(lambda: int(lib.nvmlDeviceGetCurrentClocksEventReasons(h)))
            if reasons is not None:
                r.throttle = {name: bool(reasons & bit) for bit, name in THROTTLE_REASONS.items()}
            for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
                if self._opt(partial(lib.nvmlDeviceGetNvLinkState, h, link)) is None:
                    break  # no such link (or no NVLink at all)
                for code, name in NVLINK_COUNTERS.items():
                    value = self._opt(partial(lib.nvmlDeviceGetNvLinkErrorCounter, h, link, code))
                    if value is not None:
                        r.nvlink_errors[(link, name)] = int(value)
        except lib.NVMLError as err:
            if getattr(err, "value", None) != lib.NVML_ERROR_GPU_IS_LOST:
                raise
            r.lost = True
        return r

    def register_xid_events(self) -> bool:
        lib = self.lib
        try:
            self._events = lib.nvmlEventSetCreate()
            for h in self._handles:
                lib.nvmlDeviceRegisterEvents(h, lib.nvmlEventTypeXidCriticalError, self._events)
        except lib.NVMLError:
            self._events = None
        return self._events is not None

    def wait_xid(self, timeout_ms: int) -> tuple[int, int] | None:
        """Block up to timeout_ms for one critical-XID event: (gpu index, xid)."""
        lib = self.lib
        try:
            data = lib.nvmlEventSetWait_v2(self._events, timeout_ms)
        except lib.NVMLError as err:
            if getattr(err, "value", None) == lib.NVML_ERROR_TIMEOUT:
                return None
            raise
        index = next((i for i, h in enumerate(self._handles) if _same(h, data.device)), -1)
        return index, int(data.eventData)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _same(a: Any, b: Any) -> bool:
    """Device handles are ctypes pointers: compare what they point at."""
    try:
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return bool(a == b)
