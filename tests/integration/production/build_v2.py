"""Build v2's incident workflow, for the upgrade test (test_upgrade.py): a module of its own, as
a workflow's module must be, so that Temporal's sandbox loads only what the workflow needs."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from gpuheal.workflows.remediation import GpuRemediationWorkflow

with workflow.unsafe.imports_passed_through():  # as the product's workflows import them
    from gpuheal.core.messages import INCIDENT
    from gpuheal.core.models.incident import RemediationInput
    from gpuheal.core.models.result import RemediationResult


@workflow.defn(name=INCIDENT.name)
class IncidentV2(GpuRemediationWorkflow):
    """A timer before anything else. v1's histories lack it, so an incident of v1 replayed on v2
    would fail its determinism check: an incompatible change."""

    @workflow.init
    def __init__(self, inp: RemediationInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        await workflow.sleep(timedelta(milliseconds=10), summary="build v2's first step")
        return await super().run(inp)
