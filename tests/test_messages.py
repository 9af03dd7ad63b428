"""Every workflow declares the handlers gpuheal.core.messages says it has, by the same names and
types: a caller that goes through a reference (an activity, the CLI, the webhook) reaches a
handler that takes what it sends and answers what it expects."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest
from temporalio import workflow

from gpuheal.core import messages as m
from gpuheal.workflows.domain import DomainIncidentWorkflow
from gpuheal.workflows.fleet import FleetCoordinator
from gpuheal.workflows.job_recovery import JobRecoveryWorkflow
from gpuheal.workflows.remediation import GpuRemediationWorkflow

CLASSES: dict[m.Workflow[Any, Any], type] = {
    m.INCIDENT: GpuRemediationWorkflow,
    m.COORDINATOR: FleetCoordinator,
    m.DOMAIN_INCIDENT: DomainIncidentWorkflow,
    m.JOB_RECOVERY: JobRecoveryWorkflow,
}


def signature(fn: Any) -> tuple[list[object], object]:
    """The handler's parameter types (without self) and its return type."""
    hints = typing.get_type_hints(fn)
    params = [hints[p] for p in inspect.signature(fn).parameters if p != "self"]
    return params, hints["return"]


def test_every_workflow_has_its_references() -> None:
    assert set(CLASSES) == set(m.HANDLERS)


@pytest.mark.parametrize("ref", list(CLASSES), ids=lambda r: r.name)
def test_the_workflow_is_declared_as_its_reference(ref: m.Workflow[Any, Any]) -> None:
    defn = workflow._Definition.must_from_class(CLASSES[ref])
    assert defn.name == ref.name
    assert signature(defn.run_fn) == ([ref.input, *ref.carried], ref.output)


@pytest.mark.parametrize("ref", list(CLASSES), ids=lambda r: r.name)
def test_every_handler_is_declared_as_its_reference(ref: m.Workflow[Any, Any]) -> None:
    defn = workflow._Definition.must_from_class(CLASSES[ref])
    declared = m.HANDLERS[ref]
    updates = {u.name: u for u in declared if isinstance(u, m.Update)}
    signals = {s.name: s for s in declared if isinstance(s, m.Signal)}
    queries = {q.name: q for q in declared if isinstance(q, m.Query)}
    assert set(defn.updates) == set(updates)
    assert set(defn.signals) == set(signals)
    assert set(defn.queries) == set(queries)
    for name, u in updates.items():
        assert signature(defn.updates[name].fn) == ([u.input], u.output), name
    for name, s in signals.items():
        assert signature(defn.signals[name].fn) == ([s.input], type(None)), name
    for name, q in queries.items():
        assert signature(defn.queries[name].fn) == ([], q.output), name


def test_a_name_is_declared_once_per_kind_and_workflow() -> None:
    for refs in m.HANDLERS.values():
        for kind in (m.Update, m.Signal, m.Query):
            names = [r.name for r in refs if isinstance(r, kind)]
            assert len(names) == len(set(names))
