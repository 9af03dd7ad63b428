"""Evidence for the vendor (RMA): which board, what it did across incidents, what the kernel said,
what gpuheal did. The models only (an incident's result carries them; gpuheal.core.rma_policy
decides and renders them; activities/rma.py reads Temporal's visibility for the board's history
and hands the bundle to the site's ticket hook).

A board is named by its serial (what a vendor's RMA form asks for), which survives re-imaging and
node renames; its UUID and PCI bus id are kept beside it.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):  # as gpuheal.core.models.Frozen, which imports these (no import back)
    model_config = ConfigDict(frozen=True, extra="forbid")


class Board(Frozen):
    gpu: int | None = None
    uuid: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None


class XidRecord(Frozen):
    """One incident of the board (or, with no serial known, of the node)."""

    at: datetime
    node: str
    incident_id: str
    run_id: str
    xid: int | None = None
    action: str = ""
    outcome: str = ""


class RmaRequest(Frozen):
    """What the incident knows: its node, its run, why, the boards, the kernel's lines, its actions."""

    cluster: str
    node: str
    incident_id: str
    run_id: str
    why: str
    boards: tuple[Board, ...]
    kernel_log: tuple[str, ...]
    actions: tuple[str, ...]  # "stage: outcome", in order


class RmaEvidence(RmaRequest):
    """... and what visibility adds: the board's incidents; then the ticket."""

    history: tuple[XidRecord, ...]
    ticket: str = ""  # what the ticket hook answered (its id), or why none was filed
