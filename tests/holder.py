"""A stand-in incident run for the coordinator's fault tests: a workflow of the node's id that
holds what it asked for until it is terminated. (Its own module: the workflow sandbox imports
the module a workflow is defined in, and a test module imports the activities' clients.)"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow


@workflow.defn(name="Holder")
class Holder:
    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


@workflow.defn(name="SlotHolder")
class SlotHolder:
    """An incident waiting in an activity (its capacity request, while the coordinator it asks
    has not answered): the activity holds one of its queue's slots until the test lets it go."""

    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity("hold_a_slot", start_to_close_timeout=timedelta(hours=1))
