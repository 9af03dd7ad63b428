"""The settings' documentation and the Helm chart agree with the declarations
(gpuheal.core.envvars): every declared variable has its row, with its default, in the docs'
Configuration page (docs/configuration.md), no row names a variable that does not exist, every
default the README or a docs page quotes in its prose is the declared one, and every value the
chart sets is the declared default unless it is one of the chart's own choices listed here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal.core import settings as settings_module
from gpuheal.core.envvars import Var, shown_default, variables
from gpuheal.core.fleet import policy_file
from gpuheal.core.fleet.policy import FleetPolicy
from gpuheal.core.settings import Settings, readme_table, with_tables

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
CONFIGURATION = DOCS / "configuration.md"  # the generated tables' page
TABLES = CONFIGURATION.read_text()
REGENERATE = "run `python -m gpuheal.core.settings --readme docs/configuration.md`"
# Every page whose prose may quote a default: the README and the docs site.
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
CHART = REPO / "infra" / "helm" / "gpuheal"
DECLARED = variables(Settings)
BY_NAME = {v.name: v for v in DECLARED}

# Values the chart deliberately sets away from the declared default, and why.
CHART_CHOICES: dict[str, str] = {}
# ... and fields of its policy file (values.yaml `policy`).
POLICY_CHOICES = {
    "mode": "a new install observes for a week before it acts",
    "approval.required_for": "replacing a node waits for a human until the operators trust it",
}


def documented_rows(group: str) -> dict[str, str]:
    """docs/configuration.md's rows of one generated table: variable -> its default cell."""
    block = re.search(rf"<!-- settings: {group} -->\n(.*?)\n<!-- /settings -->", TABLES, re.S)
    assert block, f"docs/configuration.md has no <!-- settings: {group} --> block"
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| (.*?) \| .* \|$", block.group(1), re.M)
    return dict(rows)


@pytest.mark.parametrize("group", ["worker", "policy"])
def test_the_docs_document_each_declared_variable_with_its_default(group: str) -> None:
    rows = documented_rows(group)
    declared = {v.name: shown_default(v) for v in DECLARED if (v.path[0] == "fleet") == (group == "policy")}
    assert not declared.keys() - rows.keys(), f"declared, without a docs row: {sorted(declared.keys() - rows.keys())}"
    assert not rows.keys() - declared.keys(), f"docs rows for no declared variable: {sorted(rows.keys() - declared)}"
    differ = {name: (rows[name], declared[name]) for name in rows if rows[name] != declared[name]}
    assert not differ, f"docs default differs from the declaration (docs, declared): {differ}"
    assert readme_table(group) in TABLES, REGENERATE


def test_the_configuration_page_is_what_the_generator_writes() -> None:
    assert with_tables(TABLES) == TABLES, REGENERATE


def test_only_the_configuration_page_holds_the_tables() -> None:
    """One place for the tables: a copy elsewhere would go stale unchecked."""
    others = [p.relative_to(REPO) for p in PAGES if p != CONFIGURATION and "<!-- settings:" in p.read_text()]
    assert not others, f"generated settings tables outside docs/configuration.md: {others}"


def test_defaults_quoted_in_the_prose_are_the_declared_ones() -> None:
    units = {None: 1, "": 1, "s": 1, "min": 60, "h": 3600}
    seen = 0
    for page in PAGES:
        quoted = re.findall(r"`(GPUHEAL_[A-Z0-9_]+)` \((\d+(?:\.\d+)?)(?: (s|min|h))?\)", page.read_text())
        seen += len(quoted)
        where = page.relative_to(REPO)
        for name, number, unit in quoted:
            assert name in BY_NAME, f"{where} quotes {name}, which is not declared"
            assert float(number) * units[unit] == BY_NAME[name].default, f"{where}: {name} ({number} {unit})"
    assert seen, "the prose quotes no default: the pattern is stale"


def test_the_readmes_relative_links_lead_to_files() -> None:
    links = re.findall(r"\]\(((?!https?:|#)[^)#\s]+)(?:#[^)\s]*)?\)", README.read_text())
    assert any(link.startswith("docs/") for link in links), "the README links to no docs page: the pattern is stale"
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_settings_module_points_to_the_docs_instead_of_a_second_table() -> None:
    assert settings_module.__doc__ and "docs/configuration.md" in settings_module.__doc__
    assert "| GPUHEAL_" not in settings_module.__doc__


def test_each_variable_is_declared_once_or_shared_alike() -> None:
    seen: dict[str, Var] = {}
    for v in DECLARED:
        assert v.meaning and "|" not in v.meaning, f"{v.name}: a one-line meaning, no table separator"
        if v.name in seen:  # one variable held by two fields (GPUHEAL_VERIFY_TIMEOUT_S): the same setting
            first = seen[v.name]
            assert (first.default, first.meaning, first.kind) == (v.default, v.meaning, v.kind), v.name
        seen[v.name] = v
    assert {v.name for v in DECLARED if v.path != seen[v.name].path} == {
        "GPUHEAL_VERIFY_TIMEOUT_S",
        "GPUHEAL_GPUS_PER_NODE",
    }


# --- the Helm chart ------------------------------------------------------------------------


def chart_env() -> tuple[dict[str, str | None], set[str]]:
    """The ConfigMap's variables -> the values.yaml path each comes from (None: a literal), and
    every variable name any template sets."""
    from_values: dict[str, str | None] = {}
    with_path = None
    for line in (CHART / "templates" / "configmap.yaml").read_text().split("data:", 1)[1].splitlines():
        if m := re.search(r"\{\{-? with \.Values\.([\w.]+)", line):
            with_path = m.group(1)
        elif m := re.match(r"\s+([A-Z][A-Z0-9_]*): (.*)$", line):
            ref = re.search(r"\.Values\.([\w.]+)", m.group(2))
            from_values[m.group(1)] = ref.group(1) if ref else with_path if "{{ . " in m.group(2) else None
    names = set(from_values)
    for template in (CHART / "templates").glob("*.yaml"):
        names |= set(re.findall(r"- name: ((?:GPUHEAL_|SLURM_)[A-Z0-9_]+)", template.read_text()))
    return from_values, names


def at(tree: Any, path: str) -> Any:
    for key in path.split("."):
        tree = tree[key]
    return tree


def test_the_chart_sets_only_declared_variables() -> None:
    from_values, names = chart_env()
    assert from_values, "no variables found in the chart's ConfigMap: the parser is stale"
    assert not names - BY_NAME.keys(), f"the chart sets undeclared variables: {sorted(names - BY_NAME.keys())}"


def test_the_chart_defaults_are_the_declared_ones() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    from_values, _ = chart_env()
    differ, choices = {}, set()
    for name, path in from_values.items():
        if path is None:
            continue  # a literal of the chart's pods (SLURM_CONF's mount, the in-cluster flag)
        given, var = at(values, path), BY_NAME[name]  # KeyError: a template reads a value the chart lacks
        if var.default is None or given in (None, ""):
            continue  # nothing to disagree with: a required value, or one the chart leaves unset
        parsed: Any = Settings.from_env({name: str(given)})  # as the worker reads the chart's text
        for key in var.path:
            parsed = getattr(parsed, key)
        if name in CHART_CHOICES:
            choices.add(name)
            assert parsed != var.default, f"{name}: listed as a chart choice, but the chart has the default"
        elif parsed != var.default:
            differ[name] = (f"{path}: {given!r}", var.default)
    assert not differ, f"values.yaml differs from the declared defaults (chart, declared): {differ}"
    assert choices == CHART_CHOICES.keys(), f"stale chart choices: {sorted(CHART_CHOICES.keys() - choices)}"


def test_the_charts_policy_is_a_policy_file_with_the_declared_defaults_but_its_choices() -> None:
    """values.yaml `policy` is what the worker reads as GPUHEAL_POLICY_FILE: a valid policy file
    (a typo in a field name, or a budget of "5.5", fails here, not in a pod), and it sets every
    field it names to the declared default unless it is one of the chart's choices."""
    given = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    policy = policy_file.merged(FleetPolicy(), given, source="values.yaml policy")
    changed = {line.split(":", 1)[0] for line in policy_file.differences(FleetPolicy(), policy)}
    assert changed == POLICY_CHOICES.keys(), f"the chart's policy differs from the defaults in {sorted(changed)}"
    config = (CHART / "templates" / "configmap.yaml").read_text()
    assert "GPUHEAL_POLICY_FILE: /etc/gpuheal/policy.yaml" in config and "toYaml .Values.policy" in config
    assert not [v.name for v in DECLARED if v.path[0] == "fleet" and v.name in config], "policy set twice"
