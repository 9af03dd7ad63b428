"""slurmrestd has no node filter for jobs: the backend reads the light state listing and looks up
each live job, unless the listing cannot be read whole (array tasks, het components, a state in
an unknown shape, a refused call): then the one full listing answers. Against a scripted server
answer (the real daemons are in tests/integration/test_slurm_backends.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from gpuheal.clients.slurm.rest import SlurmRest


def backend(listing: tuple[int, dict[str, Any]]) -> SlurmRest:
    rest = SlurmRest("http://127.0.0.1:1", "root", token=SecretStr("t"), api="v0.0.44")

    async def answer(method: str, path: str, *_: Any, **__: Any) -> tuple[int, dict[str, Any]]:
        assert path.endswith("/jobs/state/"), path
        return listing

    rest._request = answer  # type: ignore[method-assign]
    return rest


@pytest.mark.parametrize(
    ("state", "live"),
    [(["RUNNING"], [7]), ({"current": ["RUNNING", "COMPLETING"]}, [7]), ("SUSPENDED", [7]), (["PENDING"], [])],
)
async def test_the_live_jobs_are_read_from_the_state_listing(state: object, live: list[int]) -> None:
    listing = {"jobs": [{"job_id": 7, "state": state}, {"job_id": "8", "state": ["PENDING"]}]}
    assert await backend((200, listing))._live_job_ids() == live


@pytest.mark.parametrize(
    "entry",
    [
        {"job_id": "1240_5", "state": ["RUNNING"]},  # an array task
        {"job_id": "1235+1", "state": ["RUNNING"]},  # a het component
        {"job_id": 9, "state": None},  # a state in a shape not known here
        {"job_id": 9, "state": []},
    ],
)
async def test_a_listing_that_cannot_be_read_whole_falls_back_to_the_full_one(entry: dict[str, Any]) -> None:
    assert await backend((200, {"jobs": [{"job_id": 7, "state": ["RUNNING"]}, entry]}))._live_job_ids() is None


async def test_a_server_without_the_state_listing_falls_back_too() -> None:
    assert await backend((404, {}))._live_job_ids() is None
    assert await backend((200, {"jobs": None}))._live_job_ids() is None
