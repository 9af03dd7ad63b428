"""Settings declared once: each environment variable is named, explained and given its default on
the model field that holds the value, and one loader walks those declarations.

    rate: int = setting("GPUHEAL_RATE", 20, "new remediations ...", ge=1)

`setting` is pydantic's Field with the variable's name in `json_schema_extra` and its meaning as
the field's description. The models that carry these values into workflows (RemediationSettings,
FleetPolicy, ...) stay plain frozen models: nothing here reads the environment by itself, and a
workflow that builds `FleetPolicy()` gets the same defaults the loader falls back to. The docs'
tables are generated from the same walk (`python -m gpuheal.core.settings --readme docs/configuration.md`)
and tests/test_settings_docs.py holds docs/configuration.md and the Helm chart to it.

How a variable's text becomes a value follows from the field's type: a tuple is a comma list, a
bool a "1" flag, a Path is resolved; anything else goes to pydantic as text (numbers, literals and
patterns are checked there). An empty variable is an unset one. An optional sub-model declared
with `section(only_with=...)` exists only when one of the named variables is on (the Kubernetes
half, borrowing). One variable may be declared on two fields (GPUHEAL_VERIFY_TIMEOUT_S is both the
incident's and the job recovery's); it is read into both.

Why not pydantic-settings as the loader: its sources map a BaseSettings class's fields to
`PREFIX_FIELD` / `PREFIX_PARENT__CHILD` names and decode complex values as JSON. These variables are
an existing, irregular set (SLURM_CONF, GPUHEAL_SLURM_DIR for sandbox_dir, comma lists, "1" flags)
spread over frozen payload models that must not become BaseSettings (a BaseSettings reads the
environment whenever it is built, a workflow included), with presence rules between them; a
custom source would do all of the work below and add a BaseSettings shell around `Settings`, whose
tests and callers build it directly and expect it to read nothing.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from gpuheal.core.errors import SettingsError, quote

Kind = Literal["text", "list", "flag", "path"]
M = TypeVar("M", bound=BaseModel)


def setting(name: str, default: Any, meaning: str, *, unset: str | None = None, **constraints: Any) -> Any:
    """A field read from `name`. `unset` says what an unset variable means where the default
    (None) says too little, e.g. "required" or "`TEMPORAL_ADDRESS`, else ..."."""
    extra: dict[str, Any] = {"env": name} if unset is None else {"env": name, "unset": unset}
    return Field(default=default, description=meaning, json_schema_extra=extra, **constraints)


def section(*, only_with: tuple[str, ...]) -> Any:
    """An optional sub-model that exists only when one of these variables is set (a flag: is 1)."""
    return Field(default=None, json_schema_extra={"only_with": list(only_with)})


@dataclass(frozen=True)
class Var:
    """One declared environment variable, where its value lands and what it means."""

    name: str
    meaning: str
    path: tuple[str, ...]  # field names from the root model, e.g. ("fleet", "budget", "cluster")
    default: Any
    unset: str | None
    kind: Kind
    secret: bool = False  # never shown back, not even in an error


def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _plain(annotation: Any) -> Any:
    """`X | None` -> X."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _submodel(annotation: Any) -> type[BaseModel] | None:
    plain = _plain(annotation)
    return plain if isinstance(plain, type) and issubclass(plain, BaseModel) else None


def _kind(annotation: Any) -> Kind:
    plain = _plain(annotation)
    if get_origin(plain) is tuple:
        return "list"
    if plain is bool:
        return "flag"
    if plain is Path:
        return "path"
    return "text"


def variables(model: type[BaseModel], path: tuple[str, ...] = ()) -> list[Var]:
    """Every declared variable under `model`, in declaration order (a shared one at each field)."""
    found: list[Var] = []
    for fname, field in model.model_fields.items():
        extra, where = _extra(field), (*path, fname)
        if "env" in extra:
            kind, secret = _kind(field.annotation), _plain(field.annotation) is SecretStr
            meaning, unset = field.description or "", extra.get("unset")
            found.append(Var(extra["env"], meaning, where, field.default, unset, kind, secret))
        elif (sub := _submodel(field.annotation)) is not None:
            found += variables(sub, where)
    return found


def _parse(var: Var, raw: str) -> Any:
    if var.kind == "list":
        return tuple(x.strip() for x in raw.split(",") if x.strip())
    if var.kind == "path":
        return Path(raw).resolve()
    if var.kind == "flag":
        if raw not in ("0", "1"):
            raise SettingsError(f"{var.name}={quote(raw)}: set it to 1 to turn it on, or leave it unset")
        return raw == "1"
    return raw


def _collect(
    model: type[BaseModel],
    env: Mapping[str, str],
    index: Mapping[str, Var],
    path: tuple[str, ...],
    read: dict[Any, str],
) -> dict[str, Any]:
    """The values the environment sets under `model`, as nested dicts; `read` maps each field's
    path to the variable it came from (for error messages)."""
    out: dict[str, Any] = {}
    for fname, field in model.model_fields.items():
        extra, where = _extra(field), (*path, fname)
        if "env" in extra:
            if raw := env.get(extra["env"]):
                out[fname] = _parse(index[extra["env"]], raw)
                read[where] = extra["env"]
        elif (sub := _submodel(field.annotation)) is not None:
            only = extra.get("only_with")
            if only is not None and not any(_on(index[n], env) for n in only):
                continue
            inner = _collect(sub, env, index, where, read)
            if inner or only is not None:
                out[fname] = inner
    return out


def _on(var: Var, env: Mapping[str, str]) -> bool:
    raw = env.get(var.name)
    return bool(raw) and bool(_parse(var, raw or ""))


def load(model: type[M], env: Mapping[str, str]) -> M:
    """`model` from the variables its fields declare. A wrong value is a SettingsError that
    names the variable and quotes what it holds."""
    index = {v.name: v for v in variables(model)}
    read: dict[Any, str] = {}
    values = _collect(model, env, index, (), read)
    try:
        return model.model_validate(values)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = tuple(e["loc"])
            # the longest field path that a variable set (a list item's error is its list's)
            name = next((read[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in read), None)
            msg = e["msg"].removeprefix("Value error, ")
            if name is None:
                problems.append(f"{'.'.join(map(str, loc))}: {msg}")
            else:
                shown = "(hidden)" if index[name].secret else quote(env[name])
                problems.append(f"{name}={shown}: {msg}")
        raise SettingsError("; ".join(problems)) from err


def shown_default(var: Var) -> str:
    """The default as docs/configuration.md shows it."""
    if var.unset is not None:
        return var.unset
    value = var.default
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return "`1`" if value else "unset"
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def table(found: list[Var]) -> str:
    """A Markdown table, one row per variable (a shared one once)."""
    rows, seen = ["| variable | default | meaning |", "|---|---|---|"], set()
    for v in found:
        if v.name not in seen:
            seen.add(v.name)
            rows.append(f"| `{v.name}` | {shown_default(v)} | {v.meaning} |")
    return "\n".join(rows)
