"""infra/monitoring/rules.yml keeps the policy's ignored XIDs out of the XID alert by hand: the
list there must be XID_ACTIONS's (an XID the policy ignores would page and start an incident that
does nothing; one it acts on, left out of the alert, would never start one)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpuheal.core.policy import XID_ACTIONS, ActionClass

RULES = Path(__file__).resolve().parent.parent / "infra" / "monitoring" / "rules.yml"
# A label matcher on `xid`: =, !=, =~ or !~ and its quoted value (PromQL)
XID_MATCHER = re.compile(r'\bxid\s*(=~|!~|!=|=)\s*"([^"]*)"')


def xid_rules() -> dict[str, list[tuple[str, str]]]:
    """Each alert whose expression matches on the `xid` label: its matchers (operator, value)."""
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text())
    found: dict[str, list[tuple[str, str]]] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            matchers = XID_MATCHER.findall(str(rule.get("expr", "")))
            if matchers:
                found[rule["alert"]] = matchers
    return found


def test_the_xid_alert_leaves_out_exactly_the_xids_the_policy_ignores() -> None:
    ignored = {xid for xid, (action, _) in XID_ACTIONS.items() if action == ActionClass.IGNORE}
    assert ignored, "XID_ACTIONS ignores no XID: the rule's exclusion has nothing to mirror"
    rules = xid_rules()
    assert set(rules) == {"GpuXidError"}, f"rules matching on xid: {sorted(rules)}"
    [(op, value)] = rules["GpuXidError"]
    assert op == "!~", f"GpuXidError selects xid{op}{value!r}; it should leave out the ignored ones (!~)"
    # A PromQL regex matches the whole value: an alternation of plain numbers is a set.
    alternatives = value.split("|")
    assert all(a.isdigit() for a in alternatives), f"not a plain list of XIDs: {value!r}"
    assert sorted(int(a) for a in alternatives) == sorted(ignored)
