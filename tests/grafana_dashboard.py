"""The Grafana dashboard's queries (deploy/grafana/allocator.json), read for the tests that
check them: tests/unit/test_grafana_dashboard.py (against :class:`NodeMetrics`' registry, and
promtool) and tests/integration/test_grafana_dashboard_live.py (against a live node's
``/metrics``).

Rules: no Grafana server runs here, so a query is checked for what can be checked offline: it
parses as PromQL (promtool, after Grafana's variables are replaced by concrete values), and
every metric it reads and every label it matches, groups by or prints in a legend exists on
that metric (or is a label Prometheus attaches to every target: ``job``, ``instance``). The
PromQL reading here is deliberately small: it knows the functions, aggregations and keywords
below, and any other word followed by ``(`` fails the test rather than passing unnoticed.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "allocator.json"

TARGET_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus attaches to every scraped series."""
PROMETHEUS_SERIES: Mapping[str, frozenset[str]] = {"up": TARGET_LABELS}
"""Series Prometheus makes itself (no node exports them)."""

# Concrete values for Grafana's variables, so that promtool can parse a query.
JOB = "allocator-test"
INSTANCE = "node-a:8470"
VARIABLES = {
    "job": JOB,
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
}
# The series of an evaluation (:func:`empty_queries`): one sample every STEP for SAMPLES steps,
# the queries evaluated at EVAL_AT, when every range above ($__range included) holds data.
STEP = "15s"
SAMPLES = 400  # 100 minutes
EVAL_AT = "90m"
EVALUATE_EVERY = "15m"  # the rules hold no state: evaluating them at EVAL_AT is enough

AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "group", "topk", "bottomk"}
)
FUNCTIONS = frozenset(
    {
        "rate",
        "irate",
        "increase",
        "changes",
        "resets",
        "delta",
        "deriv",
        "round",
        "clamp_min",
        "clamp_max",
        "histogram_quantile",
        "max_over_time",
        "min_over_time",
        "avg_over_time",
        "last_over_time",
        "absent",
        "time",
        "timestamp",
        "abs",
        "vector",
        "scalar",
    }
)
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
LITERALS = frozenset({"inf", "nan"})

_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)?\s*\{([^{}]*)\}")
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_WORD = re.compile(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(\s*\()?")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LABEL_VALUES = re.compile(r"^label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*(\w+)\s*\)$")


@dataclass(frozen=True)
class Query:
    """One PromQL query of the dashboard, where it is and what it prints."""

    where: str
    expr: str
    legend: str = ""


@dataclass
class Reading:
    """What one query reads: metrics, each with the labels its selector matches on, and the
    labels the query groups by (or joins on)."""

    metrics: dict[str, set[str]] = field(default_factory=dict)
    grouping: set[str] = field(default_factory=set)
    aggregations: list[str] = field(default_factory=list)
    unknown_functions: set[str] = field(default_factory=set)
    matchers: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(metric, label, operator, value) as written."""


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return dashboard


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: Mapping[str, Any]) -> Iterator[Query]:
    """Every PromQL query: the panels' targets and the annotations' (the variables'
    ``label_values`` are no PromQL: :func:`label_values`)."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            where = f"panel {panel['id']} {panel.get('title')!r} {target.get('refId')}"
            yield Query(where, target["expr"], target.get("legendFormat", ""))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            yield Query(f"annotation {annotation['name']!r}", annotation["expr"])


def label_values(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(variable, metric, label) of every query variable written ``label_values(m, l)``."""
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query if isinstance(query, str) else query["query"]
        match = _LABEL_VALUES.match(text.strip())
        assert match, f"variable {variable['name']}: not label_values(metric, label): {text}"
        yield variable["name"], match[1], match[2]


def substitute(expr: str) -> str:
    """The query with Grafana's variables replaced by concrete values (an unknown one fails)."""

    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        assert name in VARIABLES, f"no test value for the variable ${name} in {expr}"
        return VARIABLES[name]

    return _VARIABLE.sub(value, expr)


def read(expr: str) -> Reading:
    """What ``expr`` (variables substituted or not) reads; see the module's rules."""
    reading = Reading()
    rest = expr

    def selector(match: re.Match[str]) -> str:
        metric = match[1]
        assert metric, f"a selector without a metric name in {expr}"
        body = match[2]
        labels = reading.metrics.setdefault(metric, set())
        position = 0
        while position < len(body.strip()):
            matcher = _MATCHER.match(body, position)
            assert matcher, f"cannot read the matchers {{{body}}} in {expr}"
            labels.add(matcher[1])
            reading.matchers.append((metric, matcher[1], matcher[2], matcher[3]))
            position = matcher.end()
        return " __selector__ "

    rest = _SELECTOR.sub(selector, rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)  # ranges and subqueries' steps

    def grouping(match: re.Match[str]) -> str:
        reading.grouping |= {label.strip() for label in match[2].split(",") if label.strip()}
        return " "

    rest = _GROUPING.sub(grouping, rest)
    for word, call in _WORD.findall(rest):
        lowered = word.lower()
        if word == "__selector__" or lowered in KEYWORDS or lowered in LITERALS:
            continue
        if call:
            if word in AGGREGATIONS:
                reading.aggregations.append(word)
            elif word not in FUNCTIONS:
                reading.unknown_functions.add(word)
        else:
            reading.metrics.setdefault(word, set())
    return reading


def legend_labels(legend: str) -> set[str]:
    return set(_LEGEND.findall(legend))


def problems(queries_: list[Query], exported: Mapping[str, set[str]]) -> list[str]:
    """Every metric a query reads that ``exported`` (series name -> its labels) lacks, and every
    label matched, grouped by or printed that the metrics it reads do not all carry."""
    known: dict[str, set[str]] = {name: set(labels) for name, labels in exported.items()}
    for name, labels in PROMETHEUS_SERIES.items():
        known.setdefault(name, set()).update(labels)
    found: list[str] = []
    for query in queries_:
        reading = read(query.expr)
        if reading.unknown_functions:
            found.append(f"{query.where}: unknown functions {sorted(reading.unknown_functions)}")
        if not reading.metrics:
            found.append(f"{query.where}: reads no metric")
        for metric, matched in reading.metrics.items():
            if metric not in known:
                found.append(f"{query.where}: {metric} is not exported")
                continue
            missing = matched - known[metric] - TARGET_LABELS
            if missing:
                found.append(f"{query.where}: {metric} has no label {sorted(missing)}")
        readable = [known[m] | TARGET_LABELS for m in reading.metrics if m in known]
        common = set.intersection(*readable) if readable else set()
        for label in sorted(reading.grouping - common):
            found.append(f"{query.where}: groups by {label!r}, which not every metric it reads has")
        printed = legend_labels(query.legend)
        kept = reading.grouping if reading.aggregations else common
        for label in sorted(printed - kept):
            found.append(f"{query.where}: the legend prints {label!r}, which the result lacks")
    return found


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: run scripts/install-system-deps.sh (package prometheus)"
    return found


Sample = tuple[str, Mapping[str, str], float]
"""(series name, labels, value) as a node exports it."""


def empty_queries(queries_: list[Query], samples: Iterable[Sample], workdir: Path) -> str:
    """Evaluate every query with Prometheus' engine (``promtool test rules``) over ``samples``
    scraped from one target (``job``, ``instance`` and ``up`` added), each held constant for
    :data:`SAMPLES` steps; return promtool's report of the queries that found no data ("" if
    none). A NaN or infinite value is held as 1: the values do not matter here, the names and
    labels the queries look for do."""
    series = [{"series": _series("up", {}), "values": f"1+0x{SAMPLES}"}]
    for name, labels, value in samples:
        if name.endswith("_created"):
            continue  # the client's creation timestamps; Prometheus ignores them by default
        held = value if math.isfinite(value) else 1.0
        series.append({"series": _series(name, labels), "values": f"{held:f}+0x{SAMPLES}"})
    rules = [
        {
            "alert": "DashboardQueryEmpty",
            "expr": f"absent({substitute(query.expr)})",
            "labels": {"query": query.where},
        }
        for query in queries_
    ]
    rule_file = workdir / "dashboard-queries.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    test = {
        "rule_files": [rule_file.name],
        "evaluation_interval": EVALUATE_EVERY,
        "tests": [
            {
                "interval": STEP,
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": EVAL_AT, "alertname": "DashboardQueryEmpty", "exp_alerts": []}
                ],
            }
        ],
    }
    test_file = workdir / "dashboard-queries.test.yml"
    test_file.write_text(yaml.safe_dump(test))
    done = subprocess.run(
        [promtool(), "test", "rules", test_file.name],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def _series(name: str, labels: Mapping[str, str]) -> str:
    every = {**labels, "job": JOB, "instance": INSTANCE}
    return name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(every.items())) + "}"
