"""Record the coordinator's histories from the tests that run it on the time-skipping server, as
replay material (`make histories`: GPUHEAL_RECORD_HISTORIES=tests/histories/coordinator). Every
coordinator (and domain incident) a test starts is saved, each run of its continue-as-new chain
as its own file; tests/test_replay.py replays them through later releases and checks every
update's answer (tests/replaying.py). A test run without the variable records nothing."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    StartWorkflowUpdateWithStartInput,
    WorkflowHandle,
    WorkflowUpdateHandle,
)
from temporalio.testing import WorkflowEnvironment

from gpuheal.core import messages as m

RECORDED = (m.COORDINATOR.name, m.DOMAIN_INCIDENT.name)
SUFFIX = {m.COORDINATOR.name: "fleet", m.DOMAIN_INCIDENT.name: "domain"}


def destination() -> Path | None:
    where = os.environ.get("GPUHEAL_RECORD_HISTORIES")
    return Path(where) if where else None


class Recorder(Interceptor):
    """Notes the ids of the workflows worth recording that a test's client starts."""

    def __init__(self) -> None:
        self.started: dict[str, str] = {}  # workflow id -> its type

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Noting(next, self.started)

    async def save(self, client: Client, test: str, dest: Path) -> list[Path]:
        """Each run of each noted workflow, oldest first: DEST/TEST.N.KIND.json."""
        saved: list[Path] = []
        dest.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^a-z0-9_]+", "_", test.lower()).removeprefix("test_")[:90]
        for n, (wid, kind) in enumerate(sorted(self.started.items())):
            runs: list[Any] = []
            run_id: str | None = None
            while True:  # back along the continue-as-new chain from the latest run
                history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
                runs.insert(0, history)
                run_id = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
                if not run_id:
                    break
            for k, history in enumerate(runs):
                path = dest / f"{name}.{n}{chr(ord('a') + k)}.{SUFFIX[kind]}.json"
                path.write_text(history.to_json())
                saved.append(path)
        return saved


async def recording(
    name: str, start: Callable[[Sequence[Interceptor]], Awaitable[WorkflowEnvironment]]
) -> AsyncIterator[WorkflowEnvironment]:
    """A fixture's server of the test's own (`start` with the recorder); with
    GPUHEAL_RECORD_HISTORIES, what the test started there is saved under `name` when it ends."""
    recorder = Recorder()
    env = await start([recorder])
    yield env
    dest = destination()
    if dest is not None:
        await recorder.save(env.client, name, dest)
    await env.shutdown()


class _Noting(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, started: dict[str, str]) -> None:
        super().__init__(next)
        self.started = started

    def _note(self, workflow: str, wid: str) -> None:
        if workflow in RECORDED:
            self.started[wid] = workflow

    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        self._note(input.workflow, input.id)
        return await super().start_workflow(input)

    async def start_update_with_start_workflow(
        self, input: StartWorkflowUpdateWithStartInput
    ) -> WorkflowUpdateHandle[Any]:
        self._note(input.start_workflow_input.workflow, input.start_workflow_input.id)
        return await super().start_update_with_start_workflow(input)
