"""docs/grafana/peercache.json: a dashboard Grafana can import, over metrics the code exports."""
import json
import re
from pathlib import Path

import pytest

from peercache.metrics import exported_names

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana" / "peercache.json"
#: A metric name in PromQL: an identifier not followed by "(" (a function) and not a label or a keyword.
NAME = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "le", "instance", "rail", "status", "tier", "result", "to", "reason", "plane", "server",
            "node", "protocol", "inf", "nan",
            # aggregation operators, when "by (...)" stands between them and their "("
            "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile",
            "count_values"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dash: dict) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables' queries."""
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        q = v.get("query")
        if v["type"] == "query":
            out.append(q["query"] if isinstance(q, dict) else q)
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` uses (label matchers, strings, durations and keywords left out)."""
    bare = re.sub(r'"[^"]*"', '""', expr)                      # strings ("$instance", regexes)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)                     # label matchers
    bare = re.sub(r"\[[^\]]*\]", "[]", bare)                    # range durations
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", bare)   # label lists
    bare = re.sub(r"\blabel_values\(([^,)]*),[^)]*\)", r"label_values(\1)", bare)
    return {m for m in NAME.findall(bare) if m.lower() not in KEYWORDS and not m.isdigit()}


def test_it_parses_as_an_importable_dashboard(dashboard):
    assert dashboard["title"] == "PeerCache" and dashboard["uid"] == "peercache"
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            e = t["expr"]
            for a, b in ("()", "{}", "[]"):
                assert e.count(a) == e.count(b), f"{p['title']}: unbalanced {a}{b} in {e}"
            for var in re.findall(r"\$(\w+)", e):
                assert var in variables or var.startswith("__"), f"{p['title']}: no variable ${var}"


def test_every_metric_it_queries_is_one_the_code_exports(dashboard):
    exported = exported_names()
    used = set().union(*(metric_names(q) for q in queries(dashboard)))
    assert used, "no metric found in the dashboard's queries"
    unknown = sorted(used - exported)
    assert not unknown, f"the dashboard queries metrics no collector exports: {unknown}"


def test_it_shows_every_peercache_family(dashboard):
    used = set().union(*(metric_names(q) for q in queries(dashboard)))
    families = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in exported_names() if n.startswith("peercache_")}
    shown = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used}
    assert families - shown == set(), f"families the dashboard leaves out: {sorted(families - shown)}"


@pytest.mark.parametrize("expr, names", [
    ('sum by (rail) (rate(peercache_read_bytes_total{instance=~"$instance"}[$__rate_interval]))',
     {"peercache_read_bytes_total"}),
    ("histogram_quantile(0.99, sum by (le) (rate(peercache_get_batch_duration_seconds_bucket[5m])))",
     {"peercache_get_batch_duration_seconds_bucket"}),
    ("a_metric / ignoring(rail) group_left sum by (instance) (b_metric)", {"a_metric", "b_metric"}),
    ("label_values(peercache_node_info, instance)", {"peercache_node_info"}),
])
def test_metric_names_are_read_from_promql(expr, names):
    assert metric_names(expr) == names


def test_a_name_the_code_does_not_export_is_caught():
    assert metric_names("rate(peercache_read_byte_total[1m])") - exported_names() == {"peercache_read_byte_total"}
