"""Providers: how a platform repairs or replaces a node, one module each, chosen by name.

Adding a cloud API is one file (``gpuheal/providers/mycloud.py`` with a class implementing
:class:`gpuheal.providers.base.NodeProvider` and a ``build(ctx)`` function) and one line in
``PROVIDERS`` below. Modules are imported only when chosen, so a worker without Kubernetes never
loads the Kubernetes client for a provider it does not use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from gpuheal.core.errors import SettingsError
from gpuheal.providers.base import NodeProvider, ProviderContext

# name -> module with a `build(ctx) -> NodeProvider`
PROVIDERS: dict[str, str] = {
    "sandbox": "gpuheal.providers.sandbox",
    "kubernetes": "gpuheal.providers.kubernetes",
    "exec": "gpuheal.providers.exec_hook",
}


def build_provider(ctx: ProviderContext) -> NodeProvider:
    """The provider GPUHEAL_PROVIDER names; refuses, naming the setting, when it is unset or unknown."""
    name = ctx.settings.name
    choices = ", ".join(PROVIDERS)
    if not name:
        raise SettingsError(
            f"GPUHEAL_PROVIDER is not set: set it to how this cluster repairs and replaces nodes ({choices}); "
            "the worker will not guess"
        )
    if name not in PROVIDERS:
        raise SettingsError(f"GPUHEAL_PROVIDER={name!r} is not a provider: choose one of {choices}")
    build = cast(Callable[[ProviderContext], NodeProvider], importlib.import_module(PROVIDERS[name]).build)
    return build(ctx)
