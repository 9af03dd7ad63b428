"""A held incident's containment decided with its capacity request: one decision per incident
(issue 36). A storm's thousand held incidents each asked `contain` in an update of its own after
their request was held: about 950 of the coordinator's 1,150 updates, each a slot of the ten
Temporal allows in flight. Asked with the request (CapacityRequest.contain_if_held), it is
decided in the same workflow task, right after the request (or the batch) is decided, in the
requests' order: exactly as the same requests followed by each one's `contain`, one at a time
(tests/test_coordination.py proves it)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpuheal.core.fleet import coordination
from gpuheal.core.fleet.coordination import Effects
from gpuheal.core.fleet.models import CapacityDecision, CapacityRequest, FleetState


def with_containment(
    s: FleetState,
    reqs: Sequence[CapacityRequest],
    answers: Sequence[CapacityDecision],
    now: datetime,
    counts_left: bool = True,
) -> tuple[list[CapacityDecision], Effects]:
    """Each answer that did not grant a request asking `contain_if_held`, with the containment
    decision `coordination.contain` gives (within the containment bound, never while tripped);
    every other answer as it was."""
    out, decided = Effects(), []
    for req, answer in zip(reqs, answers, strict=True):
        if req.contain_if_held and not answer.granted:
            c, effects = coordination.contain(s, req, now, counts_left=counts_left)
            out += effects
            answer = answer.model_copy(update={"contained": c.granted, "containment": c.reason})
        decided.append(answer)
    return decided, out
