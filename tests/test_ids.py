"""Workflow ids: each kind built from its one format and recognised by it. The formats are pinned
here: running incidents, Slurm drain reasons and recorded histories hold them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuheal.core import ids
from gpuheal.core.models.slurm import JobSnapshot

JOB = JobSnapshot(
    job_id=12, name="train", state="RUNNING", nodes="gpu01", requeueable=True, restart_count=0, submit_time=1796000000
)
AT = datetime(2026, 11, 30, 1, 2, 3, tzinfo=UTC)


def test_the_formats_are_the_ones_running_workflows_have() -> None:
    assert ids.incident_id("prod", "gpu01") == "gpuheal-prod-gpu01"  # one per node
    assert ids.coordinator_id("prod") == "gpuheal-prod-fleet"
    assert ids.recovery_id("prod", JOB) == "gpuheal-prod-job-12-1796000000-r0"
    assert (
        ids.domain_incident_id("prod", "gpuheal.io/rack=R7", AT)
        == "gpuheal-prod-domain-gpuheal-io-rack-r7-20261130010203"
    )


def test_one_recovery_per_failure_of_a_job() -> None:
    again = JOB.model_copy(update={"restart_count": 1})
    assert ids.recovery_id("prod", JOB) != ids.recovery_id("prod", again)


@pytest.mark.parametrize("cluster", ["prod", "us-east-1"])  # a cluster name may hold dashes
def test_every_kind_is_an_id_of_its_cluster(cluster: str) -> None:
    built: dict[ids.Kind, str] = {
        "incident": ids.incident_id(cluster, "gpu-01.a"),
        "coordinator": ids.coordinator_id(cluster),
        "job_recovery": ids.recovery_id(cluster, JOB),
        "domain_incident": ids.domain_incident_id(cluster, "rack=r7", AT),
    }
    assert set(built) == set(ids.FORMATS)
    assert len(set(built.values())) == len(built)
    for workflow_id in built.values():
        assert workflow_id.startswith(f"gpuheal-{cluster}-") and ids.is_gpuheal_id(workflow_id)


def test_a_node_name_is_not_an_id() -> None:
    assert not ids.is_gpuheal_id("gpu01")
