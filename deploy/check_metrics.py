#!/usr/bin/env python3
"""Checks the Grafana dashboard and the alert rules against the metrics agentfleet exports.

- deploy/dashboards/agentfleet.json is valid JSON and every query names a metric that the code
  exports (`metrics::counter!/gauge!/histogram!("name")` in api/, worker/, shared/; a
  histogram's `_bucket`, `_sum` and `_count` series included) or one on EXPORTER_METRICS;
- the same for every rule of deploy/helm/agentfleet/files/agentfleet.rules.yaml, and every alert
  has a severity, a summary and a runbook_url whose anchor is a heading of docs/operations.md;
- with `--metrics FILE...` (the text of `/metrics` of the API and workers): every agentfleet
  metric the dashboard and the rules name is in those files, with the type the query assumes.
  Metrics appear there only once set, so the files must come from a process that did the
  work (an end-to-end test); without `--strict` a metric missing from them is only reported.

    python3 deploy/check_metrics.py [--metrics api.txt worker.txt [--strict] [--require NAME...]]

Exit 0 when all hold, 1 otherwise (every problem printed).
"""

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy/dashboards/agentfleet.json"
RULES = ROOT / "deploy/helm/agentfleet/files/agentfleet.rules.yaml"
RUNBOOK = ROOT / "docs/operations.md"
CODE_DIRS = ("api/src", "worker/src", "shared/src")

# Metrics that other exporters serve; the rules name them (see the rules file's header).
EXPORTER_METRICS = {
    # RabbitMQ's built-in rabbitmq_prometheus plugin, per-object metrics on.
    "rabbitmq_queue_messages": "rabbitmq_prometheus (per-object metrics)",
    "rabbitmq_identity_info": "rabbitmq_prometheus",
    # postgres_exporter (prometheus-community).
    "pg_up": "postgres_exporter",
    # redis_exporter (oliver006).
    "redis_up": "redis_exporter",
    # Prometheus itself: whether a scrape succeeded.
    "up": "Prometheus (scrape health)",
}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")

# PromQL words that are not metric names.
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and",
    "or", "unless", "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk",
    "quantile", "count_values", "group", "inf", "nan", "atan2",
}

problems: list[str] = []


def problem(msg: str) -> None:
    problems.append(msg)
    print(f"  FAIL {msg}")


def exported_by_code() -> dict[str, str]:
    """Metric name -> counter | gauge | histogram, from the macros in the code."""
    found: dict[str, str] = {}
    pattern = re.compile(r'metrics::(counter|gauge|histogram)!\(\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')
    for d in CODE_DIRS:
        for path in sorted((ROOT / d).rglob("*.rs")):
            for kind, name in pattern.findall(path.read_text()):
                if found.get(name, kind) != kind:
                    problem(f"{name} is both a {found[name]} and a {kind} in the code")
                found[name] = kind
    return found


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small lexer, not a parser: it drops
    strings, label matchers, ranges, grouping clauses and functions, and keeps the rest)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\{?\w+\}?", " ", s)  # Grafana variables
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("("):  # a function or an aggregation
            continue
        if word.lower() in PROMQL_WORDS:
            continue
        # A duration or a number's exponent is preceded by a digit.
        if m.start() > 0 and s[m.start() - 1].isdigit():
            continue
        names.add(word)
    return names


def dashboard_exprs() -> list[tuple[str, str]]:
    try:
        dash = json.loads(DASHBOARD.read_text())
    except json.JSONDecodeError as e:
        problem(f"{DASHBOARD.relative_to(ROOT)}: not valid JSON: {e}")
        return []
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append((f"panel {p.get('title')!r}", t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    if not out:
        problem("the dashboard has no query")
    return out


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def rule_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load(RULES.read_text())
    anchors = heading_anchors(RUNBOOK.read_text()) if RUNBOOK.exists() else set()
    if not anchors:
        problem(f"{RUNBOOK.relative_to(ROOT)} missing or without headings")
    out = []
    names = set()
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            out.append((f"rule {name}", rule["expr"]))
            if "alert" not in rule:
                continue
            if name in names:
                problem(f"alert {name} defined twice")
            names.add(name)
            if rule.get("labels", {}).get("severity") not in ("warning", "critical"):
                problem(f"alert {name}: severity must be warning or critical")
            ann = rule.get("annotations", {})
            if not ann.get("summary"):
                problem(f"alert {name}: no summary")
            url = ann.get("runbook_url", "")
            anchor = url.partition("#")[2]
            if not url.startswith("RUNBOOK_BASE#"):
                problem(f"alert {name}: runbook_url must be RUNBOOK_BASE#<anchor>, is {url!r}")
            elif anchor != name.lower():
                problem(f"alert {name}: runbook anchor {anchor!r} should be {name.lower()!r}")
            elif anchor not in anchors:
                problem(f"alert {name}: docs/operations.md has no heading for #{anchor}")
    if not names:
        problem("the rules file has no alert")
    return out


def exposition_families(text: str) -> dict[str, str]:
    """Metric family -> type, from Prometheus text exposition (`# TYPE` lines, and samples
    without one as untyped)."""
    families: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = kind.strip()
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            base = name
            for suffix in HISTOGRAM_SERIES:
                if name.endswith(suffix) and name[: -len(suffix)] in families:
                    base = name[: -len(suffix)]
            families.setdefault(base, "untyped")
    return families


def resolve(name: str, code: dict[str, str]) -> tuple[str, str] | None:
    """(family, type) of a series name the code exports, or None."""
    if name in code:
        return name, code[name]
    for suffix in HISTOGRAM_SERIES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and code.get(base) == "histogram":
            return base, "histogram"
    return None


def self_test() -> None:
    """The lexer and the exposition reader on known input, so a broken checker cannot pass."""
    cases = {
        'histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{k="v"}[5m])))': {"a_seconds_bucket"},
        "max(a) / clamp_min(sum(rate(b_total[5m:1m])) or vector(0), 1e-3) > 300": {"a", "b_total"},
        'up{job=~".*x.*"} == 0 or absent(x_info) unless on (i) y offset 5m': {"up", "x_info", "y"},
    }
    for expr, want in cases.items():
        got = promql_metric_names(expr)
        if got != want:
            problem(f"self-test: {expr!r} gave {sorted(got)}, want {sorted(want)}")
    text = "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n# TYPE g gauge\ng 3\nu 1\n"
    got = exposition_families(text)
    if got != {"h": "histogram", "g": "gauge", "u": "untyped"}:
        problem(f"self-test: exposition read as {got}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", nargs="+", type=Path, default=[],
                    help="files holding /metrics output of the API and workers")
    ap.add_argument("--strict", action="store_true",
                    help="a metric the queries use must be in the --metrics files")
    ap.add_argument("--require", nargs="+", default=[],
                    help="metrics that must be in the --metrics files")
    args = ap.parse_args()

    print("== dashboard and alert rules against the metrics the code exports")
    self_test()
    code = exported_by_code()
    if "agentfleet_runnable_runs" not in code or "agentfleet_no_such_metric" in code:
        problem("the metric names were not read from the code")
    used: dict[str, str] = {}  # family -> type, of agentfleet's metrics the queries use
    queries = dashboard_exprs() + rule_exprs()
    for where, expr in queries:
        names = promql_metric_names(expr)
        if not names:
            problem(f"{where}: no metric found in {expr!r}")
        for name in sorted(names):
            found = resolve(name, code)
            if found:
                used[found[0]] = found[1]
                if found[1] == "histogram" and name == found[0]:
                    problem(f"{where}: {name} is a histogram; query its _bucket, _sum or _count")
            elif name not in EXPORTER_METRICS:
                problem(f"{where}: {name} is exported neither by agentfleet nor by a listed exporter")
    print(f"  {len(queries)} queries; agentfleet metrics used: {len(used)}; "
          f"exporter metrics allowed: {', '.join(sorted(EXPORTER_METRICS))}")

    if args.metrics:
        families: dict[str, str] = {}
        for f in args.metrics:
            families.update(exposition_families(f.read_text()))
        unseen = []
        for family, kind in sorted(used.items()):
            if family not in families:
                unseen.append(family)
            elif families[family] != kind:
                problem(f"/metrics: {family} is a {families[family]}, the code says {kind}")
        seen = len(used) - len(unseen)
        print(f"  /metrics ({', '.join(str(f) for f in args.metrics)}): {seen} of {len(used)} "
              f"used metrics present" + (f"; not present: {', '.join(unseen)}" if unseen else ""))
        if unseen and args.strict:
            problem(f"/metrics lacks {', '.join(unseen)}")
        for name in args.require:
            if name not in families:
                problem(f"/metrics lacks {name}, which must be there")
    if problems:
        print(f"metrics check: {len(problems)} problem(s)")
        return 1
    print("metrics check: every query names an exported metric; every alert has its runbook")
    return 0


if __name__ == "__main__":
    sys.exit(main())
