"""What goes to the vendor, decided and shown: pure functions over an incident's reports and
stages (the models are gpuheal.core.rma)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuheal.core.models.base import NodeState
from gpuheal.core.models.report import HealthReport
from gpuheal.core.models.result import StageRecord
from gpuheal.core.rma import Board, RmaEvidence


def needed(node_state: NodeState, repeat: str | None) -> str | None:
    """Why this incident's board goes to the vendor, or None: it was replaced, it failed its
    validation after a repair, or it is a repeat offender."""

    if node_state == NodeState.FAILED_VALIDATION:
        return "failed validation after repair"
    if repeat:
        return repeat
    if node_state in (NodeState.REPLACED, NodeState.AWAITING_REPLACEMENT):
        return "replaced"
    return None


def boards_of(reports: Iterable[HealthReport]) -> tuple[Board, ...]:
    """Each board the reports named, once (by serial, else UUID, else GPU index)."""
    found: dict[object, Board] = {}
    for r in reports:
        if r.gpu is None and not (r.gpu_uuid or r.gpu_serial or r.pci_bus_id):
            continue
        key = r.gpu_serial or r.gpu_uuid or r.gpu
        b = found.get(key, Board())
        found[key] = Board(
            gpu=b.gpu if b.gpu is not None else r.gpu,
            uuid=b.uuid or r.gpu_uuid,
            serial=b.serial or r.gpu_serial,
            pci_bus_id=b.pci_bus_id or r.pci_bus_id,
        )
    return tuple(found.values())


def kernel_lines(reports: Iterable[HealthReport]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r.kernel_log for r in reports if r.kernel_log))


def actions_of(stages: Sequence[StageRecord]) -> tuple[str, ...]:
    return tuple(f"{st.stage.value}: {st.outcome}" for st in stages if st.outcome)


def items(e: RmaEvidence) -> list[str]:
    """The postmortem's RMA section, one item per line."""
    lines = [f"Why: {e.why}; ticket: {e.ticket or 'none filed'}"]
    for b in e.boards:
        gpu = b.gpu if b.gpu is not None else "?"
        lines.append(f"GPU {gpu}: serial {b.serial or '?'}, UUID {b.uuid or '?'}, PCI {b.pci_bus_id or '?'}")
    lines += [f"Kernel: {line}" for line in e.kernel_log]
    lines += [
        f"Earlier: {h.at:%Y-%m-%d %H:%M} on {h.node}: XID {h.xid if h.xid is not None else '-'}, "
        f"{h.action or '-'}, {h.outcome or 'open'} ({h.incident_id})"
        for h in e.history
    ]
    return lines
