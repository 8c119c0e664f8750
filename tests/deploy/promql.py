"""The metric names the dashboards and alert rules of deploy/ use, read from their PromQL expressions.

An expression's metric names are its identifiers once label matchers (``{...}``), range selectors (``[5m]``),
grouping clauses (``by (...)``), strings, Grafana's ``$variables`` and numbers are taken out, less the PromQL
functions (an identifier followed by ``(``) and keywords.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = {"bastion": DEPLOY / "grafana" / "bastion.json", "mailrelay": DEPLOY / "grafana" / "mailrelay.json"}
RULES = DEPLOY / "prometheus" / "alerts.yml"

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
_REMOVED = [
    re.compile(r'"(?:[^"\\]|\\.)*"'),  # strings
    re.compile(r"\{[^}]*\}"),  # label matchers
    re.compile(r"\[[^\]]*\]"),  # range selectors
    re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"),  # label lists
    re.compile(r"\$\w+"),  # Grafana variables
]
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expression: str) -> set[str]:
    text = expression
    for pattern in _REMOVED:
        text = pattern.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        end = match.end()
        rest = text[end:].lstrip()
        if rest.startswith("(") or match.group() in KEYWORDS:
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # 1e3, 0.95
        names.add(match.group())
    return names


def dashboard_expressions(program: str) -> list[str]:
    dashboard = json.loads(DASHBOARDS[program].read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def rules() -> list[dict[str, object]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def rule_expressions(group: str) -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [str(rule["expr"]) for entry in groups if entry["name"] == group for rule in entry["rules"]]


def used_names(program: str) -> set[str]:
    """Every metric name the program's dashboard and its group of alert rules use."""
    return {
        name
        for expression in [*dashboard_expressions(program), *rule_expressions(program)]
        for name in metric_names(expression)
    }


def exported_names(text: str) -> set[str]:
    """The names a scrape exports: each sample's, and each family's as its ``# TYPE`` line names it (a labelled
    metric nobody recorded yet has no sample, but is exported)."""
    from prometheus_client.parser import text_string_to_metric_families

    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names
