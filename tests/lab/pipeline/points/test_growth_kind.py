"""The ``growth`` kind: its points in the growth scenario, the tool's options it builds, its rows from a
tool document, and the growth report (figures, tables, overview, conclusions) from those rows."""
import pandas as pd
import pytest

from peercache.lab.analysis import charts
from peercache.lab.analysis.scenarios import REPORTS
from peercache.lab.analysis.scenarios.declare import Chart, NotDrawn
from peercache.lab.pipeline import experiments, kinds
from peercache.lab.pipeline.points.growth import GrowthRun, rows_of
from peercache.lab.tidy import rows_to_records


def test_the_growth_scenario_expands_to_one_point_per_curve_and_backend_in_both_forms():
    sc = experiments.load_scenarios()["growth"]
    for form in ("local", "rdma"):
        names = [p.name for part in sc[form].values() for p in GrowthRun.expand("growth", part, [])]
        assert names == ["growth_directory_embedded", "growth_directory_redis", "growth_members_embedded",
                         "growth_register_tcp", "growth_register_shm", "growth_get_cpu_tcp"], form
    # a curve with a backend it does not take is refused when the grid is built
    with pytest.raises(ValueError, match="takes backend embedded or redis"):
        GrowthRun.expand("growth", {"kind": "growth", "curve": "directory", "backend": ["tcp"], "sizes": [1, 2]}, [])
    assert kinds.KINDS["growth"] is GrowthRun


def test_the_tool_options_of_each_curve():
    d = GrowthRun.argv({"curve": "directory", "backend": "redis", "sizes": [10000, 100000]}, "redis://127.0.0.1:7/0",
                       3.0, 1.0)
    assert d[:4] == ["--curve", "directory", "--sizes", "10000,100000"]
    assert d[-3:] == ["--directory", "redis://127.0.0.1:7/0", "--redis-flush"] and "--duration" in d
    e = GrowthRun.argv({"curve": "directory", "backend": "embedded", "sizes": [10, 20]}, None, 3.0, 1.0)
    assert "--directory" not in e
    r = GrowthRun.argv({"curve": "register", "backend": "shm", "sizes": [1 << 26, 1 << 31], "page_size": 4096},
                       None, 3.0, 1.0)
    assert r[r.index("--protocol") + 1] == "shm" and r[r.index("--page-size") + 1] == "4096"
    m = GrowthRun.argv({"curve": "members", "backend": "embedded", "sizes": [2, 4]}, None, 4.0, 1.0)
    assert m[m.index("--window") + 1] == "4"


def _doc(curve, backend, points, fits):
    units = {"directory": {"dir_bytes_per_key": "B", "publish_keys_per_s": "ops/s", "lookup_keys_per_s": "ops/s"},
             "members": {"heartbeat_cpu_cores": "ratio", "members_call_ms": "ms"}}[curve]
    return {"status": "ok", "result": {"curve": curve, "x_unit": "keys" if curve == "directory" else "members",
                                       "units": units, "points": points, "fits": fits}}


def _fit(metric, cost, unit, xs, a, b):
    costs = [a * x ** b for x in xs]
    return {"metric": metric, "cost": cost, "cost_unit": unit, "a": a, "b": b, "r2": 0.999, "n": len(xs),
            "linear": abs(b - 1) <= 0.1, "superlinear": b > 1.1, "xs": xs, "costs": costs}


CTX = {"experiment": "local", "testbed": "local", "scenario": "growth", "repetition": 0, "tool": "peercache-growth",
       "side": "client", "host": "localhost", "protocol": "tcp"}


def _rows():
    xs = [1e4, 1e5, 1e6]
    dpts = [{"x": x, "status": "ok", "reason": None, "detail": {},
             "metrics": {"dir_bytes_per_key": 300.0, "publish_keys_per_s": 4e4, "lookup_keys_per_s": 3e5}}
            for x in xs] + [{"x": 1e7, "status": "not_measured", "reason": "publishing passed its bound of 180 s",
                             "metrics": {}, "detail": {}}]
    dfits = [_fit("dir_bytes_per_key", "dir_bytes", "B", xs, 300.0, 1.0),
             _fit("publish_keys_per_s", "publish_all_s", "s", xs, 2.5e-5, 1.0),
             _fit("lookup_keys_per_s", "lookup_all_s", "s", xs, 3.3e-6, 1.02)]
    ms = [2, 4, 8, 16]
    mpts = [{"x": n, "status": "ok", "reason": None, "detail": {},
             "metrics": {"heartbeat_cpu_cores": 1e-4 * n * n, "members_call_ms": 0.2}} for n in ms]
    mfits = [_fit("heartbeat_cpu_cores", "heartbeat_cpu_cores", "ratio", ms, 1e-4, 2.0),
             _fit("members_call_ms", "members_call_ms", "ms", ms, 0.2, 0.0)]
    rows = []
    for doc, p, run in ((_doc("directory", "embedded", dpts, dfits), {"curve": "directory", "backend": "embedded"},
                         "local/growth/growth_directory_embedded/rep0"),
                        (_doc("members", "embedded", mpts, mfits), {"curve": "members", "backend": "embedded"},
                         "local/growth/growth_members_embedded/rep0")):
        rows += list(rows_of(doc, p, {**CTX, "run_id": run}))
    return rows


def test_rows_one_per_x_and_metric_then_a_fit_row_each():
    rows = _rows()
    d = [r for r in rows if r.extra["curve"] == "directory" and r.metric == "dir_bytes_per_key"]
    assert [r.extra["x"] for r in d] == [1e4, 1e5, 1e6, 1e7]
    assert [r.status for r in d] == ["ok", "ok", "ok", "not_measured"] and d[-1].value is None
    assert "passed its bound" in d[-1].reason and d[0].unit == "B" and d[0].extra["x_unit"] == "keys"
    fits = [r for r in rows if r.metric == "fit_exponent"]
    assert len(fits) == 5 and all(r.unit == "ratio" and r.value == r.extra["b"] for r in fits)
    hb = next(r for r in fits if r.extra["cost"] == "heartbeat_cpu_cores")
    assert hb.extra["superlinear"] and not hb.extra["linear"] and hb.extra["a"] == pytest.approx(1e-4)


def _frame():
    df = pd.DataFrame(rows_to_records(_rows()))
    df["verdict"] = "unchecked"
    df["limited_by"] = None
    return df


def test_the_report_draws_a_figure_per_curve_with_fits_and_names_the_superlinear_cost():
    df = _frame()
    rep = REPORTS["growth"]
    out = charts.build_scenario("growth", df, pd.DataFrame(), None)
    by = {c.name: c for c in out}
    assert set(by) == {"growth_directory", "growth_members", "growth_register", "growth_get_cpu"}
    assert isinstance(by["growth_directory"], Chart) and isinstance(by["growth_members"], Chart)
    assert isinstance(by["growth_register"], NotDrawn) and isinstance(by["growth_get_cpu"], NotDrawn)
    legends = [t.get_text() for ax in by["growth_members"].fig.axes if ax.get_legend()
               for t in ax.get_legend().get_texts()]
    assert any("x^2.00" in t for t in legends)
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in by["growth_directory"].fig.axes
               if ax.get_visible())
    missing = [n for n in by["growth_directory"].notes if "not_measured" in n]
    assert missing == ["embedded at 10,000,000 keys: not_measured: publishing passed its bound of 180 s"]
    (cap, fits), (_, vals) = rep.tables(df, {})
    assert len(fits) == 5 and sum(f["growth"] == "FASTER THAN LINEAR" for f in fits) == 1
    assert any(v["value"].startswith("not_measured") for v in vals)
    concl = [c.text for c in rep.conclusions(df, {})]
    assert any("directory host CPU" in t and "faster than linearly" in t and "x^2.00" in t for t in concl)
    assert not any("memory" in t and "faster" in t for t in concl)
    assert any("not_measured at 10,000,000 keys: publishing passed its bound" in t for t in concl)
    ov = rep.overview("growth", df, df, df.iloc[0:0], {})
    assert len(ov) == 5 and all(set(o) == {"scenario", "GET throughput", "% of single-NIC raw limit", "limited by",
                                           "notes", "run"} for o in ov)


def test_without_a_superlinear_cost_the_report_names_the_steepest():
    df = _frame()
    df = df[~df["extra"].str.contains('"members"')]
    concl = [c.text for c in REPORTS["growth"].conclusions(df, {})]
    assert any("no cost grows faster than linearly" in t and "look every key up" in t for t in concl)
