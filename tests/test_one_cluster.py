"""One cluster, one authority: a report, a give-back or an activity call naming another cluster
is refused before anything is asked or started (gpuheal.triggers.start, gpuheal.activities.fleet)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from temporalio.exceptions import ApplicationError

from gpuheal.activities.fleet import FOREIGN_CLUSTER, FleetActivities
from gpuheal.core.fleet.models import CapacityRequest, Placement
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.models.base import ActionClass
from gpuheal.core.models.incident import RemediationSettings
from gpuheal.core.models.report import HealthReport
from gpuheal.core.settings import Settings
from gpuheal.triggers.start import ForeignCluster, give_back_borrowed, start_or_join

SETTINGS = Settings(cluster="east")


class NoClient:
    """Any call to Temporal fails the test: a refused report must not reach it."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"Temporal was asked ({name}) for another cluster's report")


async def test_a_report_for_another_cluster_is_refused_before_temporal_is_asked() -> None:
    report = HealthReport(node="gpu01", cluster="prod-east", xid=79, observed_at=datetime.now(UTC))
    with pytest.raises(ForeignCluster, match="'prod-east' is not this endpoint's cluster 'east'"):
        await start_or_join(NoClient(), SETTINGS, report)  # type: ignore[arg-type]
    with pytest.raises(ForeignCluster, match="'west' is not this endpoint's cluster 'east'"):
        await give_back_borrowed(NoClient(), SETTINGS, "west", "inf02", "alice", "demand")  # type: ignore[arg-type]


async def test_an_activity_refuses_another_clusters_coordinator_without_retrying() -> None:
    fleet = FleetActivities(None, None, FleetPolicy(), RemediationSettings(), (), 1, cluster="east")  # type: ignore[arg-type]
    req = CapacityRequest(
        cluster="west", incident_id="gpuheal-west-gpu01", placement=Placement(node="gpu01", cluster_size=1),
        action=ActionClass.REPLACE_NODE,
    )  # fmt: skip
    for call in (fleet.request_capacity(req), fleet.confirm_capacity(req), fleet.find_open_incidents("west")):
        with pytest.raises(ApplicationError) as err:
            await call
        assert err.value.non_retryable and err.value.type == FOREIGN_CLUSTER
        assert "'west' is not this worker's cluster 'east'" in str(err.value)
