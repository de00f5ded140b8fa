"""Collect the PromQL of the deploy files and take expressions apart, for the stack tests.

No PromQL parser exists in Python, so this is a small scanner that understands exactly what the
checks need: the top-level operands of comparison and set operators (``a / b > 0.05`` -> ``a / b``;
``(x == 1) unless on (instance) y`` -> ``x``, ``y``), skipping strings, label matchers and ranges.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

# The service's metric contract (service/metrics.py); histograms add _bucket/_sum/_count.
COUNTERS = {
    "retention_requests_total",
    "retention_rejections_total",
    "retention_token_layers_computed_total",
    "retention_token_layers_saved_total",
    "retention_degraded_requests_total",
    "retention_shed_requests_total",
}
GAUGES = {
    "retention_queue_depth",
    "retention_in_flight_requests",
    "retention_process_resident_memory_bytes",
    "retention_model_info",
    "retention_predicted_drain_seconds",
    "retention_cost_model_token_seconds",
    "retention_cost_model_run_seconds",
    "retention_cost_model_tail_factor",
}
HISTOGRAMS = {
    "retention_event_loop_lag_seconds",
    "retention_request_duration_seconds",
    "retention_queue_duration_seconds",
    "retention_inference_duration_seconds",
    "retention_batch_size",
    "retention_batch_tokens",
    "retention_input_tokens",
    "retention_requested_rho",
    "retention_effective_rho",
    "retention_activation_memory_estimate_bytes",
    "retention_served_rho",
    "retention_predicted_wait_seconds",
}
KNOWN_SERIES = COUNTERS | GAUGES | {f"{h}{s}" for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}

GRAFANA_VARS = {
    "__rate_interval": "30s",
    "__interval": "5s",
    "__range": "5m",
    "endpoint": ".*",
    "model": ".*",
}

_METRIC_RE = re.compile(r"(?<![\w:])retention_[a-z0-9_]+(?![\w:])")
_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
_SET_OPS = ("and", "or", "unless")
_MODIFIER_RE = re.compile(r"^\s*(?:bool\s+|(?:on|ignoring|group_left|group_right)\s*(?:\([^)]*\))?\s*)+")
_NUMBER_RE = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$")


def metric_names(expr: str) -> set[str]:
    """Names of ``retention_*`` series an expression selects (strings and matchers skipped)."""
    return set(_METRIC_RE.findall(_blank_strings(expr)))


def _blank_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)


def _strip_parens(expr: str) -> str:
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")") and _closing(expr, 0) == len(expr) - 1:
        expr = expr[1:-1].strip()
    return expr


def _closing(expr: str, start: int) -> int:
    depth = 0
    quote: str | None = None
    for i in range(start, len(expr)):
        c = expr[i]
        if quote:
            if c == "\\":
                continue
            if c == quote:
                quote = None
            continue
        if c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def top_level_split(expr: str) -> list[str]:
    """Operands of the top-level comparison / set operators of ``expr`` ([expr] when there are none)."""
    expr = _strip_parens(expr)
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    i = 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == quote and expr[i - 1] != "\\":
                quote = None
            i += 1
            continue
        if c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            op = next((o for o in _COMPARISONS if expr.startswith(o, i)), None)
            if op is None:
                word = re.match(r"(and|or|unless)\b", expr[i:])
                if word and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
                    op = word.group(1)
            if op is not None:
                parts.append(expr[start:i])
                i += len(op)
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    if len(parts) == 1:
        return [] if _NUMBER_RE.match(expr) else [expr]
    operands: list[str] = []
    for part in parts:
        part = _strip_parens(_MODIFIER_RE.sub("", part))
        if part:
            operands.extend(top_level_split(part))
    return operands


def substitute_grafana(expr: str, **chosen: str) -> str:
    """Replace Grafana's variables by values Prometheus accepts: the ``chosen`` ones (a multi-value pick
    is a regex alternation, ``a|b``), the others at the 'All' value of the templates."""
    values = {**GRAFANA_VARS, **chosen}

    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return panels


def dashboard_exprs(path: Path) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of a Grafana dashboard JSON."""
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    return [
        (panel.get("title", "?"), target["expr"])
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def dashboard_variable_queries(path: Path) -> list[tuple[str, str]]:
    """``label_values(metric, label)`` of the dashboard's template variables, as (metric, label)."""
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        match = re.fullmatch(r"\s*label_values\(\s*([\w:]+)\s*,\s*(\w+)\s*\)\s*", text)
        if match:
            out.append((match.group(1), match.group(2)))
    return out


def rule_exprs(path: Path) -> list[tuple[str, str]]:
    """(alert or record name, expr) for every rule of a Prometheus rules file."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [
        (rule.get("alert") or rule.get("record"), rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
    ]


def adapter_exprs(rules: list[dict[str, Any]], matchers: str, group_by: str) -> list[tuple[str, str]]:
    """prometheus-adapter ``metricsQuery`` templates filled in the way the adapter does."""
    out = []
    for rule in rules:
        series = re.match(r"\s*'?([\w:]+)", rule["seriesQuery"])
        assert series is not None, rule["seriesQuery"]
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series.group(1))
            .replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", group_by)
        )
        out.append((rule["name"]["as"], query))
    return out
