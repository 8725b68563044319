"""peercache.bench.growth and its fit: the power law on synthetic data, the sizes parser, and every curve
end to end at small sizes (bounded: the whole file runs in well under a minute)."""
import json

import numpy as np
import pytest

from peercache.bench import fit, growth
from peercache.errors import ConfigError


# -- the fit -----------------------------------------------------------------------------------

def test_a_linear_cost_fits_b_1_and_is_linear():
    xs = [1e4, 1e5, 1e6, 1e7]
    f = fit.power_fit(xs, [120.0 * x for x in xs])
    assert f.b == pytest.approx(1.0, abs=1e-9) and f.a == pytest.approx(120.0, rel=1e-9)
    assert f.r2 == pytest.approx(1.0) and f.linear and not f.superlinear and f.n == 4
    assert f.predict(1e8) == pytest.approx(1.2e10, rel=1e-9)


def test_a_quadratic_cost_fits_b_2_and_is_superlinear():
    xs = [2, 4, 8, 16, 32, 64]
    f = fit.power_fit(xs, [0.5 * x * x for x in xs])
    assert f.b == pytest.approx(2.0, abs=1e-9) and f.a == pytest.approx(0.5, rel=1e-9)
    assert f.superlinear and not f.linear


def test_a_noisy_near_linear_cost_is_linear_within_the_tolerance_and_a_flat_one_is_not():
    rng = np.random.default_rng(7)
    xs = np.geomspace(10, 1e6, 12)
    noisy = fit.power_fit(xs, 3.0 * xs ** 1.05 * rng.uniform(0.9, 1.1, xs.size))
    assert abs(noisy.b - 1.05) < 0.03 and noisy.linear and not noisy.superlinear and 0.99 < noisy.r2 <= 1.0
    flat = fit.power_fit(xs, np.full(xs.size, 5.0))
    assert flat.b == pytest.approx(0.0, abs=1e-9) and not flat.linear and not flat.superlinear
    assert fit.power_fit(xs, xs ** 1.2).superlinear            # just past the 1.1 threshold


@pytest.mark.parametrize("xs, ys, why", [([1], [1], "at least 2"), ([1, 2], [1, -2], "positive"),
                                        ([3, 3], [1, 2], "distinct"), ([1, 2], [1], "equal-length")])
def test_the_fit_refuses_what_a_log_log_line_cannot_be_drawn_through(xs, ys, why):
    with pytest.raises(ValueError, match=why):
        fit.power_fit(xs, ys)


def test_sizes_parse_binary_suffixes_and_scientific_notation_sorted():
    assert growth.parse_sizes("2G,64M,1K") == [1024, 64 << 20, 2 << 30]
    assert growth.parse_sizes("1e5, 1e4,10000") == [10000, 100000]
    with pytest.raises(ConfigError, match="not a number"):
        growth.parse_sizes("1e4,lots")
    with pytest.raises(ConfigError, match="whole number"):
        growth.parse_sizes("0.5")


def test_fits_are_over_total_costs_so_a_constant_per_key_figure_is_linear():
    pts = [{"x": x, "status": "ok", "metrics": {"dir_bytes_per_key": 300.0, "publish_keys_per_s": 4e4,
                                                 "lookup_keys_per_s": 4e5 / (x / 1e3) ** 0.5}}
           for x in (1e3, 1e4, 1e5)] + [{"x": 1e6, "status": "not_measured", "metrics": {}}]
    fits = {f["cost"]: f for f in growth.fits(pts, "directory")}
    assert fits["dir_bytes"]["b"] == pytest.approx(1.0) and fits["dir_bytes"]["linear"]
    assert fits["publish_all_s"]["b"] == pytest.approx(1.0) and fits["dir_bytes"]["n"] == 3
    # per-key lookup cost growing as sqrt(keys): looking every key up grows as keys^1.5
    assert fits["lookup_all_s"]["b"] == pytest.approx(1.5) and fits["lookup_all_s"]["superlinear"]


# -- the tool end to end, small sizes -----------------------------------------------------------

def _run(tmp_path, *argv):
    out = tmp_path / "g.json"
    rc = growth.main([*argv, "--out", str(out), "--quiet"])
    doc = json.loads(out.read_text())
    return rc, doc


def _ok_points(doc, n):
    pts = doc["result"]["points"]
    assert [p["status"] for p in pts] == ["ok"] * n, pts
    return pts


def test_directory_curve_embedded_small(tmp_path):
    rc, doc = _run(tmp_path, "--curve", "directory", "--sizes", "1e3,1e4", "--duration", "0.5", "--warmup", "0.2",
                   "--max-seconds", "60")
    assert rc == 0 and doc["status"] == "ok" and doc["tool"] == growth.TOOL
    assert doc["meta"]["curve"] == "directory" and doc["meta"]["backend"] == "embedded" and doc["meta"]["host"]
    pts = _ok_points(doc, 2)
    for p in pts:
        m = p["metrics"]
        assert m["dir_bytes_per_key"] > 0 and m["publish_keys_per_s"] > 0 and m["lookup_keys_per_s"] > 0
        assert p["detail"]["verified_keys"] == min(p["x"], growth.VERIFY_SAMPLE)
    assert {f["cost"] for f in doc["result"]["fits"]} == {"dir_bytes", "publish_all_s", "lookup_all_s"}


def test_directory_curve_over_its_bound_is_not_measured_never_faked(tmp_path):
    rc, doc = _run(tmp_path, "--curve", "directory", "--sizes", "1e3,2e5", "--size-seconds", "0.05",
                   "--duration", "0.3", "--warmup", "0.1", "--max-seconds", "60")
    pts = doc["result"]["points"]
    assert pts[-1]["status"] == "not_measured" and "passed its bound" in pts[-1]["reason"]
    assert pts[-1]["metrics"] == {}


def test_members_curve_small(tmp_path):
    rc, doc = _run(tmp_path, "--curve", "members", "--sizes", "2,4", "--window", "1.2",
                   "--heartbeat-interval", "0.3", "--member-procs", "2", "--max-seconds", "60")
    assert rc == 0, doc["error"]
    pts = _ok_points(doc, 2)
    for p in pts:
        m = p["metrics"]
        assert m["heartbeat_cpu_cores"] > 0 and m["join_seen_ms"] > 0 and m["members_call_ms"] > 0
        assert p["detail"]["members_listed"] == p["x"] + 1        # the members and the host
        # every member and the host heartbeat every 0.3 s: about (x + 1) / 0.3 per second
        assert 0.5 * (p["x"] + 1) / 0.3 < m["heartbeat_msgs_per_s"] < 2.0 * (p["x"] + 1) / 0.3
    assert doc["meta"]["member_procs"] == 2


@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_register_curve_small(tmp_path, protocol):
    rc, doc = _run(tmp_path, "--curve", "register", "--protocol", protocol, "--sizes", "4M,16M", "--repeats", "2")
    assert rc == 0, doc["error"]
    pts = _ok_points(doc, 2)
    assert [p["detail"]["slots"] for p in pts] == [32, 128]
    assert all(p["metrics"]["register_s"] > 0 and p["metrics"]["node_start_s"] > 0 for p in pts)
    assert "ibv_reg_mr" in doc["meta"]["rdma"]


def test_get_cpu_curve_small(tmp_path):
    rc, doc = _run(tmp_path, "--curve", "get_cpu", "--sizes", "1,8", "--window", "0.5", "--warmup", "0.1",
                   "--page-size", "16384")
    assert rc == 0, doc["error"]
    pts = _ok_points(doc, 2)
    assert all(p["metrics"]["get_cpu_us_per_page"] > 0 and p["detail"]["pages"] > 0 for p in pts)
    assert [f["cost"] for f in doc["result"]["fits"]] == ["get_cpu_us_per_batch"]


def test_options_that_cannot_measure_are_refused(tmp_path):
    assert growth.main(["--curve", "members", "--sizes", "1000", "--quiet"]) == 2
    assert growth.main(["--curve", "directory", "--directory", "ftp://x", "--quiet"]) == 2
    assert growth.main(["--curve", "get_cpu", "--heartbeat-interval", "90", "--quiet"]) == 2


def test_directory_curve_redis_small(tmp_path):
    from peercache.lab.launch import redis as redis_launch
    ok, why = redis_launch.available()
    if not ok:
        pytest.skip(why)
    pytest.importorskip("redis")
    with redis_launch.RedisServer() as srv:
        # without --redis-flush a non-empty database is refused, not emptied
        import redis
        r = redis.Redis.from_url(srv.url)
        r.set("someone-elses", b"1")
        rc, doc = _run(tmp_path, "--curve", "directory", "--directory", srv.url, "--sizes", "1e3,1e4",
                       "--duration", "0.5", "--warmup", "0.2")
        assert rc == 2 or doc["status"] == "failed"
        assert r.get("someone-elses") == b"1"
        rc, doc = _run(tmp_path, "--curve", "directory", "--directory", srv.url, "--redis-flush", "--sizes", "1e3,1e4",
                       "--duration", "0.5", "--warmup", "0.2", "--max-seconds", "60")
        r.close()
    assert rc == 0, doc["error"]
    pts = _ok_points(doc, 2)
    assert doc["meta"]["backend"] == "redis" and doc["meta"]["redis_version"]
    assert all(p["detail"]["used_memory_after"] > p["detail"]["used_memory_before"] for p in pts)
