from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpuheal.triggers.alertmanager import AlertmanagerPayload, to_reports


def alert(labels: dict[str, str], status: str = "firing", at: str = "2026-11-30T01:00:00Z") -> dict[str, Any]:
    return {"status": status, "labels": labels, "annotations": {}, "startsAt": at, "fingerprint": "f"}


def payload(*alerts: dict[str, Any]) -> AlertmanagerPayload:
    return AlertmanagerPayload.model_validate({"version": "4", "status": "firing", "alerts": list(alerts)})


@pytest.mark.parametrize(
    "labels",
    [
        {"node": "gpu01", "xid": "79", "gpu": "3"},
        {"Hostname": "gpu01", "err_code": "79", "gpu": "3"},
        {"instance": "gpu01.cluster.local:9400", "XID": "79", "gpu": "3"},
    ],
)
def test_label_spellings(labels: dict[str, str]) -> None:
    parsed = to_reports(payload(alert(labels)), "prod")
    assert parsed.rejected == []
    (r,) = parsed.reports
    assert (r.node, r.xid, r.gpu, r.cluster, r.source) == ("gpu01", 79, 3, "prod", "alertmanager")


def test_resolved_alerts_start_nothing() -> None:
    parsed = to_reports(payload(alert({"node": "gpu01", "xid": "79"}, status="resolved")), "c")
    assert parsed.reports == [] and parsed.resolved == 1


def test_fifty_alerts_for_one_failure_are_one_report() -> None:
    alerts = [alert({"node": "gpu01", "xid": "79", "gpu": "3"}, at=f"2026-11-30T01:00:{i:02d}Z") for i in range(50)]
    parsed = to_reports(payload(*alerts), "c")
    assert len(parsed.reports) == 1
    assert parsed.reports[0].observed_at.second == 0  # the earliest observation


def test_alert_without_node_is_rejected_with_reason() -> None:
    parsed = to_reports(payload(alert({"alertname": "GpuXid", "xid": "79"})), "c")
    assert parsed.reports == []
    assert "no node label" in parsed.rejected[0].reason


def test_alert_with_hostile_node_name_is_rejected() -> None:
    parsed = to_reports(payload(alert({"node": "gpu01;reboot", "xid": "79"})), "c")
    assert parsed.reports == [] and "node" in parsed.rejected[0].reason


def test_wrong_version_is_refused() -> None:
    with pytest.raises(ValidationError, match="version"):
        AlertmanagerPayload.model_validate({"version": "3", "status": "firing", "alerts": [alert({})]})


def test_a_give_back_alert_is_not_a_failure_report() -> None:
    parsed = to_reports(
        payload(alert({"node": "inf02", "gpuheal_action": "give_back", "alertname": "LlmQueueLong"})), "prod"
    )
    assert parsed.reports == [] and parsed.rejected == []
    (give_back,) = parsed.give_backs
    assert (give_back.cluster, give_back.node, give_back.reason) == ("prod", "inf02", "LlmQueueLong")


def test_an_xid_from_an_annotation_is_part_of_the_alert_key() -> None:
    """dcgm-exporter's rule keeps one firing alert (one fingerprint and start) while the GPU's last
    XID changes: XID 79 after XID 63 in that alert is another failure, not the same alert again."""

    def dcgm(xid: str) -> dict[str, Any]:
        return {**alert({"Hostname": "gpu01", "gpu": "0"}), "annotations": {"xid": xid}}

    (first,) = to_reports(payload(dcgm("63")), "c").reports
    (later,) = to_reports(payload(dcgm("79")), "c").reports
    (again,) = to_reports(payload(dcgm("79.0")), "c").reports
    assert (first.xid, later.xid) == (63, 79)
    assert first.alert_key == "f@20261130T010000+xid63" and later.alert_key == again.alert_key != first.alert_key
    (labelled,) = to_reports(payload(alert({"node": "gpu01", "xid": "79"})), "c").reports
    assert labelled.alert_key == "f@20261130T010000"  # a label is in the fingerprint already


@pytest.mark.parametrize(
    ("labels", "field"), [({"node": 'inf02" OR x="y'}, "node"), ({"node": "inf02", "cluster": "Prod OR 1"}, "cluster")]
)
def test_a_give_back_alert_with_a_bad_name_is_rejected(labels: dict[str, str], field: str) -> None:
    parsed = to_reports(payload(alert({**labels, "gpuheal_action": "give_back"})), "prod")
    assert parsed.give_backs == [] and parsed.rejected[0].reason.startswith(f"{field}: ")
