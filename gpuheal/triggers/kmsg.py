"""XIDs from the kernel log.

NVML's event API cannot report every XID (79 "fell off the bus", 119/120 GSP errors among them),
but the driver always logs them:

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.

/dev/kmsg gives one record per read() ("<prio>,<seq>,<usec>,<flags>;<text>"); a plain file
(used in tests and for `journalctl -k` captures) gives one line per record.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

XID_RE = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\): "
    r"(?P<xid>\d+)(?:, pid=(?P<pid>[^,]*))?(?:, name=(?P<name>[^,]*))?,?\s*(?P<text>.*)"
)


@dataclass(frozen=True)
class KernelXid:
    pci: str  # "0000:3b:00", lower case
    xid: int
    pid: str | None
    text: str


def parse_xid_line(line: str) -> KernelXid | None:
    m = XID_RE.search(line)
    if m is None:
        return None
    return KernelXid(pci=m["pci"].lower(), xid=int(m["xid"]), pid=m["pid"], text=m["text"].strip()[:200])


def normalise_pci(bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" and the kernel's "0000:3b:00" name the same GPU."""
    domain, bus, rest = bus_id.lower().split(":", 2)
    return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}"


def follow(path: str, from_start: bool = False) -> Iterator[str]:
    """Yield new kernel log records as they arrive (blocking). Starts at the end, so a restarted
    agent does not replay old XIDs as new failures."""
    if path == "/dev/kmsg":
        fd = os.open(path, os.O_RDONLY)
        if not from_start:
            os.lseek(fd, 0, os.SEEK_END)
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BrokenPipeError:  # records were overwritten before we read them
                continue
            yield record.split(";", 1)[-1].rstrip("\n")
    with open(path, errors="replace") as f:
        if not from_start:
            f.seek(0, os.SEEK_END)
        pending = ""
        while True:
            chunk = f.readline()
            if not chunk:
                time.sleep(0.1)
                continue
            pending += chunk
            if pending.endswith("\n"):
                yield pending.rstrip("\n")
                pending = ""
