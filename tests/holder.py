"""A stand-in incident run for the coordinator's fault tests: a workflow of the node's id that
holds what it asked for until it is terminated. (Its own module: the workflow sandbox imports
the module a workflow is defined in, and a test module imports the activities' clients.)"""

from __future__ import annotations

from temporalio import workflow


@workflow.defn(name="Holder")
class Holder:
    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)
