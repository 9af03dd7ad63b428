"""The Slurm backend over slurmrestd (Slurm 24.11 and later), with JWT authentication.

For workers with no munge and no Slurm commands: the usual case on Kubernetes, where Slinky runs
slurmrestd. The token comes from GPUHEAL_SLURM_REST_TOKEN or, better, a file
(GPUHEAL_SLURM_REST_TOKEN_FILE, re-read on every 401 so a rotated token is picked up); it is
sent as X-SLURM-USER-TOKEN and never logged or put in an error message. The API version is the
newest this module knows that the server serves (or GPUHEAL_SLURM_REST_API).

How each operation maps (checked against 24.11.5 and 26.05.5). The API has no node filter for
jobs: the backend filters by each job's hostlist, and lists only live jobs in full.

| operation | REST |
|---|---|
| nodes, node | GET /slurm/V/nodes/, GET /slurm/V/node/NAME (a FUTURE or unknown node: nodes null) |
| update node | POST /slurm/V/node/NAME {"state": ["DRAIN"], "reason": ...} (RESUME, DOWN, FUTURE) |
| jobs on node | GET /slurm/V/jobs/state/ (id and state), then GET /slurm/V/job/ID of each live job (see LIVE_LOOKUPS) |
| job, jobs | GET /slurm/V/job/ID (404 once Slurm forgot it) |
| update job | POST /slurm/V/job/ID {"begin_time": ..., "excluded_nodes": [...]} (pending jobs only) |
| signal a job | DELETE /slurm/V/job/ID?signal=USR1&flags=BATCH_JOB (its batch script; without the flag: all of it) |
| requeue (and hold) | v0.0.45 (26.05): GET /slurm/V/job/ID/requeue(?flags=Hold). Earlier APIs have none: see below |

Requeue before v0.0.45 (24.11's v0.0.40 to v0.0.42, 25.x's v0.0.43/44): the API has no call for it
(its only "requeue" is the --requeue flag of a submission, and DELETE ?flags=FEDERATION_REQUEUE
*cancels* the job). The backend requeues the way Slurm does when a node fails: it sets the
failed node DOWN, and slurmctld requeues every requeueable batch job on it. Because that also
ends jobs that may not be requeued, it does so only when every live job on the node is
requeueable; otherwise it refuses (RequeueUnavailable, naming the jobs) and leaves all of them
running on the drained node for an operator.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import SecretStr

from gpuheal.clients.slurm.base import (
    JobUpdate,
    NodeOutOfService,
    NodeState,
    RequeueUnavailable,
    SlurmError,
    UnknownNode,
)
from gpuheal.clients.slurm.hostlist import expand
from gpuheal.clients.slurm.parsers import V004X, parse_jobs, parse_nodes
from gpuheal.core.models.base import LIVE_JOB_STATES, check_node_name
from gpuheal.core.models.slurm import JobSnapshot, NodeInfo

FIRST_WITH_REQUEUE = "v0.0.45"
# Live jobs looked up one by one (LOOKUPS_AT_ONCE at a time) after the light state listing; with
# more, the full listing is cheaper. The full listing of 10,000 jobs takes seconds (every field
# of every job, pending ones included); the state listing is a fraction of it.
LIVE_LOOKUPS = 256
LOOKUPS_AT_ONCE = 16


class SlurmRest:
    def __init__(
        self,
        url: str,
        user: str,
        token: SecretStr | None = None,
        token_file: Path | None = None,
        api: str | None = None,
        timeout_s: float = 20.0,
    ) -> None:
        if token is None and token_file is None:
            raise ValueError("the slurmrestd backend needs GPUHEAL_SLURM_REST_TOKEN or GPUHEAL_SLURM_REST_TOKEN_FILE")
        if api is not None and api not in V004X:
            raise ValueError(f"GPUHEAL_SLURM_REST_API={api!r}: gpuheal speaks {', '.join(V004X)}")
        self._url = url.rstrip("/")
        self._user = user
        self._token = token
        self._token_file = token_file
        self._api = api
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.calls = 0

    # --- HTTP ------------------------------------------------------------------------------

    def _secret(self) -> str:
        if self._token_file is not None:
            return self._token_file.read_text().strip()
        assert self._token is not None
        return self._token.get_secret_value()

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, params: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        headers = {"X-SLURM-USER-NAME": self._user, "X-SLURM-USER-TOKEN": self._secret()}
        self.calls += 1
        try:
            async with aiohttp.ClientSession(timeout=self._timeout) as session:
                async with session.request(
                    method, f"{self._url}{path}", json=body, params=params, headers=headers
                ) as resp:
                    raw = await resp.text()
                    status = resp.status
        except aiohttp.ClientResponseError as err:
            # 26.05 answers a bad token with "511 Network Authentication Required" followed by
            # bytes past its Connection: close, which aiohttp refuses to parse: still a refusal.
            if " 511 " in str(err) or "authentication error" in str(err).lower():
                status, raw = 511, ""
            else:
                raise SlurmError(f"slurmrestd at {self._url}: HTTP error: {err.message[:300]}") from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise SlurmError(f"slurmrestd at {self._url}: {type(err).__name__}: {err}") from err
        if status in (401, 511):
            raise SlurmError(f"slurmrestd refused the token for user {self._user!r} (HTTP {status}): renew it")
        try:
            data = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            data = {"errors": [{"description": raw.strip()[:300]}]}  # e.g. a 404 page for an unserved API
        return status, data if isinstance(data, dict) else {}

    async def _api_path(self) -> str:
        if self._api is None:
            for version in reversed(V004X):  # the newest the server serves
                status, _ = await self._request("GET", f"/slurm/{version}/ping/")
                if status == 200:
                    self._api = version
                    break
            else:
                raise SlurmError(f"slurmrestd at {self._url} serves none of {', '.join(V004X)}")
        return f"/slurm/{self._api}"

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, params: dict[str, str] | None = None
    ) -> dict[str, Any]:
        status, data = await self._request(method, await self._api_path() + path, body, params)
        if status >= 300:
            raise SlurmError(f"slurmrestd {method} {path}: HTTP {status}: {_errors(data)}")
        return data

    # --- SlurmBackend ----------------------------------------------------------------------

    async def version(self) -> str:
        data = await self._call("GET", "/ping/")
        return str(((data.get("meta") or {}).get("slurm") or {}).get("release") or "")

    async def nodes(self) -> dict[str, NodeInfo]:
        return parse_nodes(await self._call("GET", "/nodes/"))

    async def node(self, name: str) -> NodeInfo:
        check_node_name(name)
        found = parse_nodes(await self._call("GET", f"/node/{name}"))
        if name in found:
            return found[name]
        # FUTURE and unknown nodes look the same here (nodes: null); the flag tells them apart.
        future = parse_nodes(await self._call("GET", f"/node/{name}", params={"flags": "FUTURE"}))
        if name in future:
            raise NodeOutOfService(f"node {name!r} is not in service (State={future[name].state.upper()})")
        raise UnknownNode(f"Slurm has no node named {name!r}")

    async def update_node(self, name: str, state: NodeState, reason: str | None = None) -> None:
        body: dict[str, Any] = {"state": [state.upper()]}
        if reason:
            body["reason"] = reason
        await self._call("POST", f"/node/{check_node_name(name)}", body)

    async def _all_jobs(self) -> list[JobSnapshot]:
        return parse_jobs(await self._call("GET", "/jobs/"))

    async def jobs_on_node(self, node: str) -> list[JobSnapshot]:
        check_node_name(node)
        live = await self._live_job_ids()
        if live is None or len(live) > LIVE_LOOKUPS:
            jobs = await self._all_jobs()
        else:
            gate = asyncio.Semaphore(LOOKUPS_AT_ONCE)

            async def one(job_id: int) -> JobSnapshot | None:
                async with gate:
                    return await self.job(job_id)

            try:
                jobs = [j for j in await asyncio.gather(*(one(i) for i in live)) if j is not None]
            except SlurmError:  # one lookup refused: the one listing answers instead
                jobs = await self._all_jobs()
        return [j for j in jobs if j.state in LIVE_JOB_STATES and node in expand(j.nodes)]

    async def _live_job_ids(self) -> list[int] | None:
        """The ids of jobs in a live state, from the state listing (id and state of each job), or
        None where it cannot be read whole: the server does not answer it, an id is an array task
        or a het component ("1240_5", "1235+1", which one job lookup does not return whole), or a
        state is in a shape not known here. Then the full listing is asked."""
        status, data = await self._request("GET", f"{await self._api_path()}/jobs/state/")
        if status >= 300 or not isinstance(data.get("jobs"), list):
            return None
        found = []
        for entry in data["jobs"]:
            job_id, state = str(entry.get("job_id", "")), entry.get("state", entry.get("job_state"))
            if isinstance(state, dict):  # {"current": [...], "reason": ...}
                state = state.get("current")
            if isinstance(state, str):
                state = [state]
            if not job_id.isdigit() or not isinstance(state, list) or not state:
                return None
            if {str(s) for s in state} & LIVE_JOB_STATES:
                found.append(int(job_id))
        return found

    async def job(self, job_id: int) -> JobSnapshot | None:
        status, data = await self._request("GET", f"{await self._api_path()}/job/{job_id}")
        if status == 404:
            return None
        if status >= 300:
            raise SlurmError(f"slurmrestd GET /job/{job_id}: HTTP {status}: {_errors(data)}")
        jobs = parse_jobs(data)
        return jobs[0] if jobs else None

    async def mail_user(self, job_id: int) -> str:
        job = await self.job(job_id)  # 22.05's v0.0.38 leaves it out: "" there
        return job.mail_user if job is not None else ""

    async def jobs(self, job_ids: Iterable[int]) -> list[JobSnapshot]:
        wanted = sorted(set(job_ids))
        if len(wanted) > 3:  # one listing beats many lookups
            return [j for j in await self._all_jobs() if j.job_id in wanted]
        found = [await self.job(i) for i in wanted]
        return [j for j in found if j is not None]

    async def update_job(self, job_id: int, update: JobUpdate) -> None:
        body: dict[str, Any] = {}
        if update.start_now:
            body["begin_time"] = {"set": True, "infinite": False, "number": int(time.time())}
        if update.excluded_nodes is not None:
            body["excluded_nodes"] = [check_node_name(n) for n in update.excluded_nodes]
        if body:
            await self._call("POST", f"/job/{job_id}", body)

    async def requeue(self, job_id: int, failed_node: str, hold: bool = False) -> None:
        await self._api_path()
        if self._api is not None and self._api >= FIRST_WITH_REQUEUE:
            await self._call("GET", f"/job/{job_id}/requeue", params={"flags": "Hold"} if hold else None)
            return
        # No requeue call in this API: requeue through the node, as Slurm does when one fails.
        on_node = await self.jobs_on_node(failed_node)
        blockers = [j for j in on_node if not j.requeueable]
        if blockers:
            names = ", ".join(f"{j.job_id} ({j.name})" for j in blockers)
            raise RequeueUnavailable(
                f"slurmrestd {self._api} has no requeue call (it came in v0.0.45, Slurm 26.05); gpuheal would "
                f"requeue by setting {failed_node} DOWN, which would end job(s) {names} submitted --no-requeue"
            )
        node = await self.node(failed_node)
        await self.update_node(failed_node, "down", node.reason or f"gpuheal: requeue of job {job_id}")
        if hold:
            await self._call("POST", f"/job/{job_id}", {"hold": True})

    async def hold(self, job_id: int) -> None:
        await self._call("POST", f"/job/{job_id}", {"hold": True})

    async def signal_job(self, job_id: int, signal: str, batch_only: bool) -> None:
        params = {"signal": signal, **({"flags": "BATCH_JOB"} if batch_only else {})}
        await self._call("DELETE", f"/job/{job_id}", params=params)


def _errors(data: dict[str, Any]) -> str:
    errs = data.get("errors") or []
    return "; ".join(str(e.get("description") or e.get("error") or e) for e in errs) or "(no detail)"
