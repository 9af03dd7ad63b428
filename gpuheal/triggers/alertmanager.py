"""Alertmanager webhook payloads (version 4) to health reports. Pure: no I/O.

Label names differ between exporters, so several are accepted:
node: node, Hostname, hostname, instance (port stripped); XID: xid, err_code, XID;
GPU: gpu, GPU, gpu_index (a UUID label is kept in the summary, not as an index); the board:
gpu_serial or serial, pci_bus_id or pci, and the kernel's line in the annotation kernel_log;
non-XID signal: gpuheal_signal; cluster: cluster.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuheal.core.errors import describe_error
from gpuheal.core.models.base import GPU_SERIAL_PATTERN, PCI_BUS_ID_PATTERN, ClusterName, NodeName
from gpuheal.core.models.report import HealthReport

NODE_LABELS = ("node", "Hostname", "hostname", "instance")
XID_LABELS = ("xid", "err_code", "XID")
GPU_LABELS = ("gpu", "GPU", "gpu_index")
UUID_LABELS = ("UUID", "gpu_uuid", "uuid")  # dcgm-exporter labels the GPU's UUID
SERIAL_LABELS = ("gpu_serial", "serial")  # the board's serial: its RMA record follows it
PCI_LABELS = ("pci_bus_id", "pci")


class Alert(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: str = Field(pattern=r"^(firing|resolved)$")
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: datetime
    endsAt: str = "0001-01-01T00:00:00Z"
    generatorURL: str = ""
    fingerprint: str = ""


class AlertmanagerPayload(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: str = Field(pattern=r"^4$")
    status: str
    receiver: str = ""
    groupKey: str = ""
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: str = ""
    truncatedAlerts: int = 0
    alerts: list[Alert] = Field(min_length=1, max_length=1000)


class Rejected(BaseModel):
    alert: str
    reason: str


class GiveBack(BaseModel):
    """An alert that says inference wants its node back (label gpuheal_action="give_back")."""

    cluster: ClusterName  # both reach a visibility query: validated like every node name
    node: NodeName
    reason: str


class Parsed(BaseModel):
    reports: list[HealthReport]
    rejected: list[Rejected]
    resolved: int
    give_backs: list[GiveBack] = []


def _first(labels: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if labels.get(name):
            return labels[name]
    return None


def _node_from(value: str) -> str:
    host = value.rsplit(":", 1)[0] if re.search(r":\d+$", value) else value
    return host.split(".")[0]  # short hostname, as Slurm names nodes


def to_reports(payload: AlertmanagerPayload, default_cluster: str) -> Parsed:
    """Firing alerts become reports, de-duplicated; resolved alerts start nothing."""
    reports: dict[tuple[object, ...], HealthReport] = {}
    rejected: list[Rejected] = []
    give_backs: list[GiveBack] = []
    resolved = 0
    for alert in payload.alerts:
        name = alert.labels.get("alertname", "?") + (f" [{alert.fingerprint}]" if alert.fingerprint else "")
        if alert.status == "resolved":
            resolved += 1
            continue
        node = _first(alert.labels, NODE_LABELS)
        if node is None:
            rejected.append(Rejected(alert=name, reason=f"no node label (looked for {', '.join(NODE_LABELS)})"))
            continue
        if alert.labels.get("gpuheal_action") == "give_back":  # demand shifted back to inference
            why = (alert.annotations.get("summary") or alert.labels.get("alertname", "alert"))[:200]
            try:
                give_backs.append(
                    GiveBack(cluster=alert.labels.get("cluster") or default_cluster, node=_node_from(node), reason=why)
                )
            except ValidationError as err:
                rejected.append(Rejected(alert=name, reason=describe_error(err, "alert")))
            continue
        # dcgm-exporter's rule carries the XID as the alert value, in an annotation
        xid_label = _first(alert.labels, XID_LABELS)
        xid_s = xid_label or _first(alert.annotations, XID_LABELS)
        gpu_s = _first(alert.labels, GPU_LABELS)
        try:
            xid = int(float(xid_s)) if xid_s is not None else None
            report = HealthReport(
                node=_node_from(node),
                cluster=alert.labels.get("cluster") or default_cluster,
                xid=xid,
                signal=alert.labels.get("gpuheal_signal"),
                gpu=int(gpu_s) if gpu_s is not None and gpu_s.isdigit() else None,
                source="alertmanager",
                observed_at=alert.startsAt,
                summary=(alert.annotations.get("summary") or alert.labels.get("alertname", ""))[:500],
                alert_key=_alert_key(alert, None if xid_label else xid),
                gpu_uuid=_first(alert.labels, UUID_LABELS),
                **_board(alert),
            )
        except (ValidationError, ValueError) as err:
            rejected.append(Rejected(alert=name, reason=describe_error(err, "alert")))
            continue
        key = (report.cluster, report.node, report.xid, report.signal, report.gpu)
        # Fifty alerts for one failure are one report: keep the earliest observation.
        if key not in reports or report.observed_at < reports[key].observed_at:
            reports[key] = report
    return Parsed(reports=list(reports.values()), rejected=rejected, resolved=resolved, give_backs=give_backs)


BOARD_PATTERNS = {"gpu_serial": re.compile(GPU_SERIAL_PATTERN), "pci_bus_id": re.compile(PCI_BUS_ID_PATTERN)}


def _board(alert: Alert) -> dict[str, str]:
    """The board's serial, PCI bus id and kernel line, where the alert has them. A malformed one is
    left out, never the failure report with it."""
    found = {"gpu_serial": _first(alert.labels, SERIAL_LABELS), "pci_bus_id": _first(alert.labels, PCI_LABELS)}
    board = {k: v for k, v in found.items() if v and BOARD_PATTERNS[k].match(v)}
    if alert.annotations.get("kernel_log"):
        board["kernel_log"] = alert.annotations["kernel_log"][:1000]
    return board


def firing_payload(
    node: str,
    *,
    xid: int | None = None,
    signal: str | None = None,
    gpu: str | None = None,
    cluster: str | None = None,
    summary: str = "",
    alertname: str = "GpuXidCritical",
    receiver: str = "gpuheal",
    starts_at: datetime | None = None,
    board: dict[str, str] | None = None,
    kernel_log: str = "",
) -> dict[str, Any]:
    """One firing alert as Alertmanager's webhook sends it (the agent's direct reports, the
    sandbox's injected failures): built from the models above, so it always parses."""
    labels = {"alertname": alertname, "node": node, "severity": "critical"}
    for name, value in (("xid", xid), ("gpuheal_signal", signal), ("gpu", gpu), ("cluster", cluster)):
        if value is not None:
            labels[name] = str(value)
    labels.update({k: v for k, v in (board or {}).items() if v})  # gpu_uuid, gpu_serial, pci_bus_id
    annotations = {"summary": summary[:400]} if summary else {}
    if kernel_log:
        annotations["kernel_log"] = kernel_log[:1000]
    alert = Alert(
        status="firing",
        labels=labels,
        annotations=annotations,
        startsAt=starts_at or datetime.now(UTC),
        fingerprint="-".join(str(v) for v in (node, xid, signal, gpu) if v is not None),
    )
    payload = AlertmanagerPayload(
        version="4",
        status="firing",
        receiver=receiver,
        groupKey=f"{{}}:{{node={node!r}}}",
        groupLabels={"node": node},
        commonLabels=labels,
        alerts=[alert],
    )
    return payload.model_dump(mode="json")


def _alert_key(alert: Alert, annotated_xid: int | None = None) -> str | None:
    """fingerprint@startsAt: Alertmanager re-sends a firing alert every repeat_interval with both
    unchanged; a new firing of the same rule has a new start. An XID carried in an annotation
    (dcgm-exporter's last XID) is not in the fingerprint, so it joins the key: an XID 79 that
    follows an XID 63 within one firing is another failure, not the same alert again."""
    if not alert.fingerprint:
        return None
    key = f"{alert.fingerprint}@{alert.startsAt.astimezone(UTC):%Y%m%dT%H%M%S}"
    if annotated_xid is not None:
        key += f"+xid{annotated_xid}"
    return re.sub(r"[^A-Za-z0-9@:+._-]", "-", key)[:100]
