"""The Kubernetes API, for activities and providers: one way to build a client, one way to call it.

The official client is synchronous; every call goes through :func:`call`, which runs it in a
thread (the worker's event loop stays free) with a request timeout. Imported only by the worker
and the Kubernetes activities and providers, never by the workflow or the short CLI commands.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpuheal.clients.proc import heartbeat

REQUEST_TIMEOUT_S = 15
POOL_LABEL = "gpuheal.io/pool"
REPLACES_ANNOTATION = "gpuheal.io/replaces"  # on a new Node: the incident run it was reserved for
# On a new Node whose burn-in ran and failed (label: selectable; the annotation says why). A
# provider never takes a Node with it, nor a cordoned one; a person clears it with the repair.
REJECTED_LABEL = "gpuheal.io/validation"
REJECTED = "failed"
UNVALIDATED = "none"  # its burn-in gave no verdict: kept out for a person to validate
REJECTED_ANNOTATION = "gpuheal.io/validation-failed"


def load_api(kubeconfig: str | None) -> client.ApiClient:
    """A kubeconfig file (the sandbox's, a ServiceAccount's), or the in-cluster config."""
    if kubeconfig:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return api
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)


def node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


async def wait_node_ready(core: client.CoreV1Api, name: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if node_ready(await call(core.read_node, name)):
                return
        except ApiException as err:
            if err.status != 404:
                raise
        heartbeat(f"waiting for Kubernetes node {name} to be Ready")
        await asyncio.sleep(0.5)
    raise TimeoutError(f"Kubernetes node {name} not Ready within {timeout_s:.0f} s")
