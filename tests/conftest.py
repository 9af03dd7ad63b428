from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import settings
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Interceptor
from temporalio.testing import WorkflowEnvironment

from gpuheal.clients.temporal import DATA_CONVERTER
from gpuheal.core import search_attributes as sa
from infra.sandbox import REPO

BIN = Path(sys.executable).parent
TEST_SERVER_STARTUP = timedelta(seconds=60)

# Property-based tests run the same examples every time (a flaky suite is a defect, and CI must
# not find a new example by chance); HYPOTHESIS_PROFILE=explore searches afresh, with more of them.
settings.register_profile("suite", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", max_examples=2000, database=None, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


def require_binary(name: str) -> Path:
    """Integration tests need real components; a missing one is a failure, never a skip."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed at {path}: run `make setup` (pip install -e .[dev])")
    return path


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server (the workflow tests): timers and retries of an hour
    pass in moments. Its binary is the installed one: nothing is downloaded."""
    env = await start_time_skipping()
    yield env
    await env.shutdown()


async def start_dev_server(interceptors: Sequence[Interceptor] = ()) -> WorkflowEnvironment:
    """Temporal's dev server (the installed `temporal` CLI), in real time: for what the
    time-skipping server does not do as a real one does (a workflow task's heartbeat while a
    local activity runs). Its search attributes registered as the sandbox registers them."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(require_binary("temporal")),
        data_converter=DATA_CONVERTER,
        interceptors=interceptors,
        ui=False,
    )
    return await with_search_attributes(env)


async def start_time_skipping(interceptors: Sequence[Interceptor] = ()) -> WorkflowEnvironment:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(require_binary("temporal-test-server")),
        data_converter=DATA_CONVERTER,
        interceptors=interceptors,
        # The SDK waits 5 s by default for the server to answer; make check starts one per process,
        # on 2 cores and beside whatever else runs: a slow start is not a failed test.
        test_server_startup_timeout=TEST_SERVER_STARTUP,
    )
    return await with_search_attributes(env)


async def with_search_attributes(env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The project's search attributes, registered as the sandbox registers them."""
    attrs = {k.name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{k.indexed_value_type.name}") for k in sa.ALL}
    await env.client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(namespace="default", search_attributes=attrs)
    )
    return env
