"""The exec hook: how a cloud API (or a site's own tooling) plugs in without a line of Python.

``GPUHEAL_PROVIDER_HOOK`` is an executable called as ``HOOK replace NODE INCIDENT RUN`` (prints
``{"new_node": "..."}``; exit 75 with ``{"no_capacity": "why"}`` when there is no node to be had;
``GPUHEAL_REJECTED_NODES`` in its environment lists, comma-separated, nodes it gave this run whose
GPUs failed validation: it offers another, or says no capacity),
``HOOK repair NODE ACTION``, ``HOOK decommission NODE REASON``, ``HOOK health NODE`` (prints
``{"healthy": true, "detail": "..."}``), and for nodes borrowed from inference ``HOOK adopt NODE``
and ``HOOK release NODE REASON``. A replacement must be idempotent per incident run
(``INCIDENT/RUN``; a node's next failure is a new run of the same incident id that needs a new
node): a retried activity calls it again. It runs under the provider timeout; on timeout its whole process group
is killed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpuheal.clients import proc
from gpuheal.core.errors import SettingsError
from gpuheal.core.models.base import ActionClass, check_node_name
from gpuheal.core.models.replacement import HealthCheckResult, RepairResult, ReplacementResult
from gpuheal.providers.base import Hold, NoSpareCapacity, ProviderContext

EX_TEMPFAIL = 75  # sysexits.h: "try again later", the hook's way to say "no capacity now"
REJECTED_ENV = "GPUHEAL_REJECTED_NODES"  # new nodes of this run whose GPUs failed validation: not again


class ExecHookProvider:
    def __init__(self, hook: str, timeout_s: float) -> None:
        self._hook = hook
        self._timeout = timeout_s

    async def _run(self, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        done = await proc.run(
            [self._hook, *args],
            timeout_s=self._timeout,
            env={**os.environ, **env} if env else None,
            check=False,
            what=f"provider hook {args[0]}",
        )
        out: dict[str, Any] = json.loads(done.stdout or "{}") if done.stdout.strip().startswith("{") else {}
        if done.returncode == EX_TEMPFAIL and "no_capacity" in out:
            raise NoSpareCapacity(str(out["no_capacity"]))
        if done.returncode != 0:
            raise RuntimeError(f"provider hook {args[0]} failed ({done.returncode}): {done.stderr[-500:]}")
        return out

    async def repair(self, node: str, action: ActionClass) -> RepairResult:
        out = await self._run("repair", check_node_name(node), action.value)
        return RepairResult(action=action, repaired=True, detail=str(out.get("message", "repaired")))

    async def replace(
        self, node: str, key: str, earlier: ReplacementResult | None = None, hold: Hold | None = None
    ) -> ReplacementResult:
        incident, _, run = key.partition("/")
        rejected = earlier.rejected if earlier is not None else ()
        env = {REJECTED_ENV: ",".join(map(check_node_name, rejected))}
        out = await self._run("replace", check_node_name(node), incident, run, env=env)
        return ReplacementResult(failed_node=node, new_node=check_node_name(str(out["new_node"])))

    async def decommission(self, node: str, reason: str) -> str:
        return str((await self._run("decommission", check_node_name(node), reason)).get("message", "removed"))

    async def adopt(self, node: str) -> str:
        return str((await self._run("adopt", check_node_name(node))).get("message", "joined"))

    async def release(self, node: str, reason: str) -> str:
        return str((await self._run("release", check_node_name(node), reason)).get("message", "released"))

    async def check_health(self, node: str) -> HealthCheckResult:
        out = await self._run("health", check_node_name(node))
        return HealthCheckResult(node=node, healthy=bool(out["healthy"]), detail=str(out.get("detail", "")))


def build(ctx: ProviderContext) -> ExecHookProvider:
    if not ctx.settings.hook:
        raise SettingsError("GPUHEAL_PROVIDER=exec needs GPUHEAL_PROVIDER_HOOK (the hook's path)")
    return ExecHookProvider(ctx.settings.hook, ctx.timeout_s)


def repair_hook(ctx: ProviderContext) -> ExecHookProvider | None:
    """The hook for GPU resets and reboots on platforms that have no API for them."""
    hook = ctx.settings.repair_hook
    return ExecHookProvider(hook, ctx.timeout_s) if hook else None
