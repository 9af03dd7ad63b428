"""What each workflow task of the coordinator writes, in payload bytes, said when it nears gRPC's limit.

A workflow task's completion carries every command it made (activities' inputs, signals, the
carried state), each update's request (echoed in its acceptance) and answer, and the answers to
the queries that came with the task. Temporal's server refuses a completion over 4 MB (gRPC's
message limit) and then *terminates* the workflow (GrpcMessageTooLarge): the coordinator, with its
books. One did, 28 minutes into a 10,000-report storm (bench/results/README.md). This counts, per
workflow task, the bytes of what the coordinator writes, by kind, and warns in the worker's log
with the breakdown each time a task passes another TASK_BYTES_SAY: the next such failure names its
cause. Counting only: nothing the workflow does changes, and a replay says nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.worker import (
    ContinueAsNewInput,
    HandleQueryInput,
    HandleUpdateInput,
    Interceptor,
    SignalExternalWorkflowInput,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle

from gpuheal.core.messages import COORDINATOR

TASK_BYTES_SAY = 1 << 20  # each further MiB one task writes is said (gRPC refuses 4 MB)
GRPC_LIMIT = 4 << 20


class PayloadSizes(Interceptor):
    """The worker interceptor: counts the coordinator's payloads (the only workflow whose
    payloads grow with the fleet); every other workflow passes through untouched."""

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _Inbound


def size(values: Sequence[Any]) -> int:
    """Bytes of these values as the workflow's payload converter writes them."""
    if not values:
        return 0
    return sum(p.ByteSize() for p in workflow.payload_converter().to_payloads(list(values)))


class _Tally:
    """One workflow run's count: the current task's bytes by kind, and what was said of it."""

    def __init__(self) -> None:
        self.task = -1
        self.kinds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.said = 0

    def add(self, kind: str, values: Sequence[Any]) -> None:
        """Counted, never raising: a count that fails must not fail the workflow task."""
        if workflow.unsafe.is_replaying():
            return
        try:
            self._add(kind, values)
        except Exception as err:  # (a value the converter refuses fails where it is sent, not here)
            workflow.logger.debug("payload not counted: %s", err)

    def _add(self, kind: str, values: Sequence[Any]) -> None:
        task = workflow.info().get_current_history_length()  # the same throughout one task
        if task != self.task:
            self.task, self.said = task, 0
            self.kinds.clear()
            self.calls.clear()
        self.kinds[kind] += size(values)
        self.calls[kind] += 1
        total = sum(self.kinds.values())
        if total // TASK_BYTES_SAY > self.said:
            self.said = total // TASK_BYTES_SAY
            parts = ", ".join(f"{k} x{self.calls[k]}: {b / 1e6:.2f} MB" for k, b in self.kinds.most_common(6))
            workflow.logger.warning(
                "workflow task at history event %d writes %.2f MB of payloads so far (gRPC refuses %d MiB "
                "and the server then terminates the workflow): %s",
                task,
                total / 1e6,
                GRPC_LIMIT >> 20,
                parts,
            )


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        self.tally: _Tally | None = None
        if outbound.info().workflow_type == COORDINATOR.name:
            self.tally = _Tally()
            outbound = _Outbound(outbound, self.tally)
        super().init(outbound)

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        answer = await super().handle_update_handler(input)
        if self.tally is not None:  # its request is echoed in its acceptance
            self.tally.add(f"update {input.update}", [*input.args, answer])
        return answer

    async def handle_query(self, input: HandleQueryInput) -> Any:
        """A query's answer is counted on its own: one asked while the workflow is idle goes back
        alone (gRPC's limit is the same), and whether it rode with a task cannot be told here."""
        answer = await super().handle_query(input)
        if self.tally is not None and not input.query.startswith("__"):  # (the SDK's own: the UI's details)
            _Tally().add(f"query {input.query}", [answer])
        return answer


class _Outbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, tally: _Tally) -> None:
        super().__init__(next)
        self.tally = tally

    def start_activity(self, input: StartActivityInput) -> ActivityHandle[Any]:
        self.tally.add(f"activity {input.activity}", input.args)
        return super().start_activity(input)

    async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
        self.tally.add(f"signal {input.signal}", input.args)
        return await super().signal_external_workflow(input)

    def continue_as_new(self, input: ContinueAsNewInput) -> NoReturn:
        self.tally.add("continue-as-new", input.args)
        super().continue_as_new(input)
