"""A worker's admissions to its cluster's coordinator: one decision per incident (issue 36).

Each admission goes in `admit_and_request_many` (gpuheal.core.fleet.admitting), with the
incident's capacity request when it asks: a batch of a worker's incidents, decided in one
coordinator task, each answered its admission and, where its action takes capacity, its grant or
place in line. On the wire: no seed (the coordinator's start carries it) and no policy repeated
to a worker that holds it (AdmitItem.known_policy; this line keeps the policies it was sent).

A coordinator of the release before lacks the update: the worker then admits as that release
did (`admit_many` batches and `admit`, with the seed; no capacity decided: the incident asks),
and tries the new update again after REPROBE_S.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.client import WithStartWorkflowOperation

from gpuheal.activities.batching import Batcher
from gpuheal.core.fleet.models import (
    ADMIT_BATCH_MOST,
    Admission,
    AdmitBatch,
    AdmitItem,
    AdmitRequest,
    AdmitRequests,
    Admitted,
    Admitting,
    CapacityDecision,
)
from gpuheal.core.fleet.policy import FleetPolicy, VersionedPolicy, policy_key
from gpuheal.core.messages import FLEET_ADMIT, FLEET_ADMIT_AND_REQUEST_MANY, FLEET_ADMIT_MANY


class _AskAsBefore(Exception):
    """A request in line when its coordinator was found without the new update: asked again in the
    line of the release before (admit_many), not as a single admit of its own."""


POLICIES_KEPT = 16  # versions of the policies this worker was sent, by key (a change moves it on)
Start = Callable[[str], WithStartWorkflowOperation[Any, Any]]


class AdmitLines:
    """Each cluster's line of admissions (a Batcher over the worker's update slots), and the
    policies its coordinator sent, so it need not send them again."""

    def __init__(self, gate: asyncio.Semaphore, start: Start, seed: FleetPolicy) -> None:
        self._gate, self._start, self._seed = gate, start, seed
        self._lines: dict[str, Batcher[AdmitItem, Admitted]] = {}
        self._before: dict[str, Batcher[AdmitRequest, Admission]] = {}  # to a coordinator without it
        self._policies: OrderedDict[str, VersionedPolicy] = OrderedDict()
        self._known: dict[str, str] = {}  # cluster -> the key of the last policy it sent

    async def admit(
        self, admitting: Admitting, ask_capacity: bool = False, contain_if_held: bool = False
    ) -> tuple[Admission, CapacityDecision | None]:
        """Its admission, and its capacity decision when asked and decided (else None: the
        incident asks for capacity as before)."""
        cluster = admitting.cluster
        item = AdmitItem(
            admit=admitting,
            ask_capacity=ask_capacity,
            contain_if_held=contain_if_held,
            known_policy=self._known.get(cluster, ""),
        )
        line = self._line(cluster)
        if not line.batched:  # a coordinator of the release before: as that release admits
            return await self._as_before(item), None
        try:
            answer = await line.ask(item)
        except _AskAsBefore:
            return await self._as_before(item), None
        policy = answer.policy or self._policies.get(item.known_policy)
        if policy is None:  # (forgotten meanwhile: asked again, whole; the same decision, idempotent)
            answer = await self._line(cluster).ask(item.model_copy(update={"known_policy": ""}))
            policy = answer.policy
            assert policy is not None
        self._keep(cluster, policy)
        admission = Admission(
            policy=policy,
            repeat_offender=answer.repeat_offender,
            domain_incident=answer.domain_incident,
            breaker=answer.breaker,
        )
        return admission, answer.decision

    def _keep(self, cluster: str, policy: VersionedPolicy) -> None:
        key = policy_key(policy)
        self._policies[key] = policy
        self._policies.move_to_end(key)
        while len(self._policies) > POLICIES_KEPT:
            self._policies.popitem(last=False)
        self._known[cluster] = key

    def _line(self, cluster: str) -> Batcher[AdmitItem, Admitted]:
        if cluster not in self._lines:
            self._lines[cluster] = Batcher(
                self._gate,
                (FLEET_ADMIT_AND_REQUEST_MANY.name, self._many),
                self._one,
                most=ADMIT_BATCH_MOST,
                one_via_many=True,
            )
        return self._lines[cluster]

    async def _many(self, items: list[AdmitItem]) -> list[Admitted]:
        start = self._start(items[0].admit.cluster)
        batch = AdmitBatch(requests=tuple(items))
        return list((await FLEET_ADMIT_AND_REQUEST_MANY.execute_with_start(activity.client(), batch, start)).answers)

    async def _as_before(self, item: AdmitItem) -> Admission:
        """Admitted as the release before admits: its line of `admit_many` batches (and `admit`)."""
        cluster = item.admit.cluster
        if cluster not in self._before:
            self._before[cluster] = Batcher(self._gate, (FLEET_ADMIT_MANY.name, self._many_before), self._one_before)
        admission = await self._before[cluster].ask(self._request(item))
        self._keep(cluster, admission.policy)
        return admission

    def _request(self, item: AdmitItem) -> AdmitRequest:
        return AdmitRequest(**item.admit.model_dump(), seed=self._seed)

    async def _many_before(self, reqs: list[AdmitRequest]) -> list[Admission]:
        start = self._start(reqs[0].cluster)
        batch = AdmitRequests(requests=tuple(reqs))
        return list((await FLEET_ADMIT_MANY.execute_with_start(activity.client(), batch, start)).answers)

    async def _one_before(self, req: AdmitRequest) -> Admission:
        return await FLEET_ADMIT.execute_with_start(activity.client(), req, self._start(req.cluster))

    async def _one(self, item: AdmitItem) -> Admitted:
        """Alone, in a batch the coordinator refused: `admit`, as the release before asks, with the
        seed, the policy answered whole. In line when the coordinator was found without the new
        update: back to its caller, who asks in the line of the release before."""
        if not self._line(item.admit.cluster).batched:
            raise _AskAsBefore(item.admit.incident_id)
        a = await self._one_before(self._request(item))
        return Admitted(
            policy=a.policy, repeat_offender=a.repeat_offender, domain_incident=a.domain_incident, breaker=a.breaker
        )
