"""The metrics scrapes drive keeps around a window (peercache.lab.tools.promscrape): the strict parser
(prometheus-client's, with the checks it leaves out) and the per-rail deltas over real captures
(tests/fixtures/lab/PROVENANCE.md), the document split, the index."""
import json
import shutil
from pathlib import Path

import pytest

from peercache.lab.errors import ParseError
from peercache.lab.tools import promscrape

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "promscrape"
RDMA = FIX / "softroce_multi_rail"


def text(name: str) -> str:
    return (FIX / name).read_text()


def rdma(edge: str) -> promscrape.Scrape:
    f = RDMA / "metrics" / f"consumer-p0-t2.{edge}.prom"
    return promscrape.parse(f.read_text(), str(f))


def test_a_tcp_drive_scrape_parses_and_has_no_rails():
    start, end = (promscrape.parse(text(f"consumer-p0-tcp.{e}.prom"), e) for e in ("start", "end"))
    assert start.types["peercache_read_bytes_total"] == "counter"
    assert start.types["peercache_get_batch_duration_seconds"] == "histogram"
    assert promscrape.node_of(start) == promscrape.node_of(end) == "drive-0"
    # tcp: the per-rail families are declared, without samples
    assert promscrape.rails(start) == {} and promscrape.rail_window(start, end) == {}
    got = [s.series("peercache_get_bytes_total")[()] for s in (start, end)]
    assert 0 < got[0] < got[1]
    assert end.series("peercache_get_batch_duration_seconds_bucket")[(("le", "+Inf"),)] == \
        end.series("peercache_get_batch_duration_seconds_count")[()]


def test_a_serve_scrape_parses_with_its_directory_and_data_server():
    s = promscrape.parse(text("producer-tcp.end.prom"), "serve")
    assert promscrape.node_of(s) == "serve"
    assert s.series("peercache_pool_slots")[()] == 256
    assert s.series("peercache_data_requests_total")[()] > 0


def test_the_rail_delta_of_a_real_rdma_window_is_what_drive_counted_itself():
    """Soft-RoCE, 2 rails, drive at the window's edges: the scrapes' delta is drive's own rail figure."""
    window = promscrape.rail_window(rdma("start"), rdma("end"))
    drive = {r["rail"]: r for r in json.loads((RDMA / "drive.json").read_text())["points"][0]["rails"]}
    assert sorted(window) == sorted(drive) == ["rxe_b0", "rxe_b1"]
    for name, r in window.items():
        assert (r.bytes, r.reads) == (drive[name]["bytes_read"], drive[name]["reads"])
        assert r.bytes > 0 and r.up is True and (r.downs, r.ups, r.completion_errors) == (0, 0, {})
    shares = promscrape.shares(window)
    assert abs(sum(shares.values()) - 1) < 1e-12
    assert shares["rxe_b0"] == pytest.approx(drive["rxe_b0"]["share"], abs=1e-4)


def test_the_index_gives_the_consumer_window_summed_over_processes(tmp_path):
    (w,) = promscrape.consumer_window(RDMA / "metrics" / promscrape.INDEX)
    assert (w.threads, w.processes, w.missing) == (2, 1, [])
    assert w.start < w.end and sorted(w.rails) == ["rxe_b0", "rxe_b1"]
    # a second process with the same files: every rail's figures double
    folder = tmp_path / "metrics"
    shutil.copytree(RDMA / "metrics", folder)
    index = json.loads((folder / promscrape.INDEX).read_text())
    more = [dict(e, process=1) for e in index["scrapes"] if e["role"] == "consumer"]
    index["scrapes"] += more
    (folder / promscrape.INDEX).write_text(json.dumps(index))
    (w2,) = promscrape.consumer_window(folder / promscrape.INDEX)
    assert w2.processes == 2 and {k: v.bytes for k, v in w2.rails.items()} == {k: 2 * v.bytes for k, v in w.rails.items()}


def test_a_process_with_one_edge_only_is_named(tmp_path):
    folder = tmp_path / "metrics"
    shutil.copytree(RDMA / "metrics", folder)
    index = json.loads((folder / promscrape.INDEX).read_text())
    index["scrapes"] = [e for e in index["scrapes"] if not (e["role"] == "consumer" and e["edge"] == "end")]
    (folder / promscrape.INDEX).write_text(json.dumps(index))
    with pytest.raises(ParseError, match="driver process 0 .threads 2. has a scrape at the start of its window only"):
        promscrape.consumer_window(folder / promscrape.INDEX)


def test_a_scrape_drive_could_not_take_is_carried_as_missing(tmp_path):
    folder = tmp_path / "metrics"
    shutil.copytree(RDMA / "metrics", folder)
    index = json.loads((folder / promscrape.INDEX).read_text())
    for e in index["scrapes"]:
        if e["role"] == "consumer" and e["edge"] == "end":
            e.pop("file")
            e["error"] = "driver process 0 serves no metrics endpoint of its own"
    (folder / promscrape.INDEX).write_text(json.dumps(index))
    # the process's start alone makes no delta: it is left out, and why is said
    (w,) = promscrape.consumer_window(folder / promscrape.INDEX)
    assert (w.rails, w.processes) == ({}, 0)
    assert w.missing == ["driver process 0 at the end: driver process 0 serves no metrics endpoint of its own"]


@pytest.mark.parametrize("change, says", [
    (lambda t: t.replace("# TYPE peercache_reads_total counter\n", ""), "sample peercache_reads_total outside its family"),
    (lambda t: t.replace('peercache_rail_up{rail="rxe_b0"} 1.0', 'peercache_rail_up{rail="rxe_b0"} up'),
     "not a sample line .*: could not convert string to float: 'up'"),
    (lambda t: t.replace('peercache_rail_up{rail="rxe_b1"} 1.0',
                         'peercache_rail_up{rail="rxe_b1"} 1.0\npeercache_rail_up{rail="rxe_b1"} 0.0'),
     "the same sample twice"),
    (lambda t: t.replace('{rail="rxe_b0"} 1.0', '{rail=rxe_b0} 1.0'), "not a sample line .*: Invalid labels: rail=rxe_b0"),
    (lambda t: t.replace('{rail="rxe_b0"} 1.0', '{rail="rxe_b0",rail="x"} 1.0'),
     'not a sample line .*: Invalid labels: rail="rxe_b0",rail="x"'),
    (lambda t: "# a remark\n" + t, "neither '# HELP name text' nor '# TYPE name type'"),
    (lambda t: t.replace("# TYPE peercache_rail_up gauge", "# TYPE peercache_rail_up flag"), "unknown metric type"),
    (lambda t: t + "# TYPE peercache_rail_up gauge\n", "family peercache_rail_up declared twice"),
    (lambda t: t + "peercache_rail_up\n", "not a sample line"),
    (lambda t: "\n\n", "empty scrape"),
])
def test_the_parser_refuses_what_is_not_a_scrape_naming_the_line(change, says):
    bad = change((RDMA / "metrics" / "consumer-p0-t2.end.prom").read_text())
    with pytest.raises(ParseError, match=says) as e:
        promscrape.parse(bad, "bad.prom")
    assert "bad.prom" in str(e.value)


def test_a_line_number_is_named():
    t = (RDMA / "metrics" / "consumer-p0-t2.end.prom").read_text()
    lines = t.splitlines()
    k = next(i for i, line in enumerate(lines) if line.startswith('peercache_rail_up{rail="rxe_b1"}'))
    lines[k] = 'peercache_rail_up{rail="rxe_b1"} x'
    with pytest.raises(ParseError) as e:
        promscrape.parse("\n".join(lines), "bad.prom")
    assert e.value.line_no == k + 1 and f"bad.prom, line {k + 1}" in str(e.value)


def test_a_scrape_of_another_program_is_not_peercache():
    s = promscrape.parse("# HELP up x\n# TYPE up gauge\nup 1\n", "other")
    with pytest.raises(ParseError, match="not a PeerCache scrape: no peercache_read_bytes_total"):
        promscrape.rails(s)


def test_window_refuses_ends_of_different_processes_or_counters_that_went_down():
    start, end = rdma("start"), rdma("end")
    with pytest.raises(ParseError, match="bytes, reads went down over the window"):
        promscrape.rail_window(end, start)
    other = promscrape.parse((RDMA / "metrics" / "consumer-p0-t2.end.prom").read_text()
                             .replace('node="drive-0"', 'node="drive-1"'), "other")
    with pytest.raises(ParseError, match="different nodes .drive-0 and drive-1."):
        promscrape.rail_window(start, other)
    fewer = promscrape.parse("\n".join(line for line in (RDMA / "metrics" / "consumer-p0-t2.end.prom").read_text()
                                       .splitlines() if 'rail="rxe_b1"' not in line), "fewer")
    with pytest.raises(ParseError, match=r"the rails differ between the window's ends \(\['rxe_b0', 'rxe_b1'\] and \['rxe_b0'\]\)"):
        promscrape.rail_window(start, fewer)


def test_errors_by_status_and_transitions_count_over_the_window():
    end_text = (RDMA / "metrics" / "consumer-p0-t2.end.prom").read_text()
    end_text = end_text.replace('peercache_rail_transitions_total{rail="rxe_b1",to="down"} 0.0',
                                'peercache_rail_transitions_total{rail="rxe_b1",to="down"} 1.0')
    end_text = end_text.replace("# TYPE peercache_completion_errors_total counter\n",
                                "# TYPE peercache_completion_errors_total counter\n"
                                'peercache_completion_errors_total{rail="rxe_b1",status="IBV_WC_RETRY_EXC_ERR"} 3.0\n')
    end_text = end_text.replace('peercache_rail_up{rail="rxe_b1"} 1.0', 'peercache_rail_up{rail="rxe_b1"} 0.0')
    w = promscrape.rail_window(rdma("start"), promscrape.parse(end_text, "end"))
    assert (w["rxe_b1"].downs, w["rxe_b1"].up, w["rxe_b1"].completion_errors) == (1, False, {"IBV_WC_RETRY_EXC_ERR": 3})
    assert (w["rxe_b0"].downs, w["rxe_b0"].up, w["rxe_b0"].completion_errors) == (0, True, {})


def test_shares_and_sums():
    a = {"r0": promscrape.RailCounters("r0", bytes=90.0, up=True), "r1": promscrape.RailCounters("r1", bytes=10.0, up=True)}
    b = {"r1": promscrape.RailCounters("r1", bytes=30.0, up=False)}
    total = promscrape.add(promscrape.add({}, a), b)
    assert {k: v.bytes for k, v in total.items()} == {"r0": 90.0, "r1": 40.0} and total["r1"].up is False
    assert promscrape.shares(total) == {"r0": 90 / 130, "r1": 40 / 130}
    assert promscrape.shares({"r0": promscrape.RailCounters("r0")}) is None      # nothing carried: no share
    assert promscrape.shares({}) is None


def test_split_document_moves_the_texts_to_files_and_keeps_errors():
    doc = {"points": [{"concurrency": 4, "threads": 8, "bytes": 1, "metrics_scrapes": [
        {"source": "drive", "process": 1, "edge": "start", "time": 1.0, "url": "u", "text": "A"},
        {"source": "drive", "process": 1, "edge": "end", "time": 2.0, "url": "u", "text": "B"},
        {"source": "serve", "process": None, "edge": "start", "error": "serve runs without --metrics-addr"}]}]}
    out, files, index = promscrape.split_document(doc)
    assert files == {"consumer-p1-t4.start.prom": "A", "consumer-p1-t4.end.prom": "B"}
    assert "text" not in json.dumps(out) and doc["points"][0]["metrics_scrapes"][0]["text"] == "A"   # pure
    assert [e.get("file") or e["error"] for e in index["scrapes"]] == [
        "consumer-p1-t4.start.prom", "consumer-p1-t4.end.prom", "serve runs without --metrics-addr"]
    assert index["scrapes"][2]["role"] == "producer" and all(e["threads"] == 4 for e in index["scrapes"])
    assert promscrape.split_document({"points": [{"bytes": 1}]})[2]["scrapes"] == []
    with pytest.raises(ParseError, match="source 'meta' and edge 'start'"):
        promscrape.split_document({"points": [{"metrics_scrapes": [{"source": "meta", "edge": "start", "text": "x"}]}]})


def test_a_bad_index_is_named(tmp_path):
    p = tmp_path / promscrape.INDEX
    p.write_text(json.dumps({"schema_version": 9, "scrapes": []}))
    with pytest.raises(ParseError, match="not a scrape index of schema_version 1"):
        promscrape.read_index(p)
    with pytest.raises(ParseError, match="cannot read the scrape index"):
        promscrape.read_index(tmp_path / "none.json")


def test_a_rail_set_down_in_the_window_shows_in_its_delta():
    """Soft-RoCE, pcg1b (rxe_b1's netdev) set down at the window's end, in the batch then in flight: the
    scrapes' delta says so, as drive's own rail figures do."""
    folder = FIX / "softroce_multi_rail_down"
    (w,) = promscrape.consumer_window(folder / "metrics" / promscrape.INDEX)
    drive = {r["rail"]: r for r in json.loads((folder / "drive.json").read_text())["points"][0]["rails"]}
    b1 = w.rails["rxe_b1"]
    assert (b1.downs, b1.ups, b1.up, b1.completion_errors) == (1, 0, False, {"IBV_WC_WR_FLUSH_ERR": 3})
    assert w.rails["rxe_b0"].up is True and w.rails["rxe_b0"].downs == 0
    for name, r in w.rails.items():
        assert (r.bytes, r.reads, r.downs) == (drive[name]["bytes_read"], drive[name]["reads"], drive[name]["downs"])
    assert promscrape.shares(w.rails)["rxe_b1"] == pytest.approx(0.3753, abs=1e-4)
