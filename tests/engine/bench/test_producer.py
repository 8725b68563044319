"""drive learns serve's geometry from the directory: a flag left out is the producer's, a flag that differs is
one error naming both values, and a producer that publishes none (an older serve) leaves the flags as before."""
import json
import subprocess
import time

import pytest

import peercache
from conftest import BENCH
from peercache.bench import producer
from peercache.bench.cli import build_parser
from peercache.bench.serve import READY_LINE, fill_page
from peercache.errors import ConfigError
from peercache.node import Geometry, Node
from peercache.node.geometry import INFO_KEY

PAGE = 16384


def _member(g: Geometry | None, port: int = 4000, regions=True) -> dict:
    info = {"host": "h", "data": {"host": "10.0.0.2", "port": port}}
    if regions:
        info["regions"] = [[1, 1 << 20]]
    if g is not None:
        info[INFO_KEY] = g.to_info()
    return info


def _args(*argv: str):
    return build_parser().parse_args(["drive", *argv])


def test_flags_left_out_are_the_producers_and_one_that_differs_names_both_values():
    nodes = {"n1": _member(Geometry(PAGE, "mha", 64, "pc/<i>/k|v")), "drv": {"host": "h"}}
    args = _args()
    assert (args.page_size, args.layout, args.working_set) == (None, None, None)       # not given
    producer.apply(args, nodes)
    assert (args.page_size, args.layout, args.working_set) == (PAGE, "mha", 64)
    producer.apply(_args("--page-size", str(PAGE), "--layout", "mha", "--working-set", "64"), nodes)   # the lab's
    for argv, text in ((("--page-size", "4096"), "drive --page-size 4096 but the producer at 10.0.0.2:4000 serves "
                        "16384-byte pages (layout mha, working set 64, keys pc/<i>/k|v); drop --page-size or pass "
                        "--page-size 16384"),
                       (("--working-set", "4096"), "drop --working-set or pass --working-set 64"),
                       (("--layout", "mla"), "drive --layout mla but the producer at 10.0.0.2:4000 serves")):
        with pytest.raises(ConfigError) as e:
            producer.apply(_args(*argv), nodes)
        assert text in str(e.value) and "\n" not in str(e.value), argv


def test_drive_reads_the_producers_of_its_prefixes_and_refuses_producers_that_differ():
    a, b = Geometry(PAGE, "mla", 32, "pc/pA/<i>", "pA"), Geometry(4096, "mla", 32, "pc/pB/<i>", "pB")
    nodes = {"a": _member(a, 1), "b": _member(b, 2), "plain": _member(Geometry(8192, "mha", 8, "pc/<i>/k|v"), 3)}
    args = _args("--key-prefix", "pA")
    producer.apply(args, nodes)
    assert (args.page_size, args.working_set) == (PAGE, 32)
    args = _args()
    producer.apply(args, nodes)
    assert (args.page_size, args.layout) == (8192, "mha")                   # no prefix: the unprefixed producer
    with pytest.raises(ConfigError, match="the producers drive reads serve different geometries: the producer at "
                                          "10.0.0.2:1 serves 16384-byte pages .* start every serve with the same"):
        producer.apply(_args("--key-prefix", "pA,pB"), nodes)


def test_a_producer_that_publishes_no_geometry_leaves_the_flags_and_their_defaults():
    nodes = {"old": _member(None)}
    assert producer.older_producer(nodes) and not producer.older_producer({"drv": {"host": "h"}})
    args = _args("--page-size", "4096")
    assert producer.apply(args, nodes) is None
    assert (args.page_size, args.layout, args.working_set) == (4096, "mla", 1024)


def test_drive_and_the_library_told_nothing_read_serves_geometry_and_a_conflicting_flag_fails_at_once(
        procs, port, tmp_path):
    addr = f"127.0.0.1:{port}"
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, "--page-size", str(PAGE), "--layout", "mha",
                         "--working-set", "64", "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "d.json"
    base = [*BENCH, "drive", "--discovery-addr", addr, "--batch-size", "8", "--duration", "0.5", "--warmup", "0.2",
            "--ready-timeout", "10"]
    t0 = time.monotonic()
    r = subprocess.run([*base, "--page-size", "4096"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and time.monotonic() - t0 < 8, r.stderr          # no wait for a working set
    assert r.stderr.strip().splitlines()[-1].endswith(
        "drive --page-size 4096 but the producer at 127.0.0.1:" + r.stderr.split("127.0.0.1:")[1].split(" ")[0]
        + " serves 16384-byte pages (layout mha, working set 64, keys pc/<i>/k|v); drop --page-size or pass "
          "--page-size 16384")
    r = subprocess.run([*base, "--working-set", "128"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "drive --working-set 128 but" in r.stderr and "pass --working-set 64" in r.stderr
    with peercache.connect(addr) as pc:                                       # the library, told nothing
        assert pc.page_size == PAGE and len(pc.get("pc/5/v")) == PAGE
    with pytest.raises(ConfigError, match="page_size=4096 but .* pass page_size=16384"):
        peercache.connect(addr, page_size=4096)
    r = subprocess.run([*base, "--out", str(out)], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    assert "serves 16384-byte pages (layout mha, working set 64, keys pc/<i>/k|v)" in r.stderr
    doc = json.loads(out.read_text())
    m, p = doc["meta"], doc["points"][0]
    assert (m["page_size"], m["layout"], m["working_set"]) == (PAGE, "mha", 64)
    assert p["hit_rate"] == 1.0 and p["errors"] == 0 and p["verified"]
    assert serve.wait(timeout=10) == 0


def test_against_a_producer_that_publishes_no_geometry_a_wrong_page_size_is_named_at_its_first_read(port):
    """An older serve (here a node that registers no geometry): drive keeps its flags and defaults, and a
    --page-size that is not the objects' ends the point at its first batch, naming both sizes."""
    addr = f"127.0.0.1:{port}"
    with Node(addr, host_discovery=True, protocol="tcp", pool_bytes=16 * (PAGE + 64), page_bytes=PAGE) as node:
        node.put_batch([f"pc/{i}".encode() for i in range(8)], fill=fill_page)
        base = [*BENCH, "drive", "--discovery-addr", addr, "--working-set", "8", "--batch-size", "4", "--duration",
                "0.5", "--warmup", "0.2", "--ready-timeout", "10"]
        r = subprocess.run([*base, "--page-size", str(PAGE)], capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        assert "publishes no geometry (an older serve); reading with --layout mla" in r.stderr
        for page in ("4096", str(2 * PAGE)):
            r = subprocess.run([*base, "--page-size", page], capture_output=True, text=True, timeout=90)
            assert r.returncode == 1
            assert (f"drive --page-size {page} but the producer of b'pc/" in r.stderr
                    and "serves 16384-byte pages; drop --page-size or pass --page-size 16384" in r.stderr), r.stderr
            assert "key(s) of a batch failed" not in r.stderr


def test_drive_waits_for_a_producer_to_register_where_the_directory_is_anothers(procs, port, tmp_path):
    """meta hosts the directory: drive told nothing waits for serve to register its geometry (here one that
    joins later), and without one within --ready-timeout it says what to start or give."""
    addr = f"127.0.0.1:{port}"
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr])
    procs.wait_line(meta, "ready on")
    base = [*BENCH, "drive", "--discovery-addr", addr, "--batch-size", "4", "--duration", "0.5", "--warmup", "0.2"]
    r = subprocess.run([*base, "--ready-timeout", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"no producer registered at {addr} within 1 s" in r.stderr
    assert "start `peercache-bench serve` there, or give all three flags" in r.stderr
    out = tmp_path / "d.json"
    d = procs.start([*base, "--ready-timeout", "20", "--out", str(out)])
    time.sleep(1.0)
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, "--join", "--readers", "0", "--page-size",
                         "8192", "--working-set", "16"])
    procs.wait_line(serve, READY_LINE)
    assert d.wait(timeout=60) == 0, d.stderr.read()
    m = json.loads(out.read_text())["meta"]
    assert (m["page_size"], m["layout"], m["working_set"]) == (8192, "mla", 16)


def test_waiting_for_the_working_set_asks_again_after_a_lookup_that_timed_out(monkeypatch):
    """A reader's first lookups set up its directory connections and can outlast one call's bound on a slow
    host (the two-machine guests: 'exists_batch timed out ... the call has 8 s in all'): the wait asks again
    until its own timeout; it ends at once when every key is there, says why when it gives up, and any
    other error ends it."""
    from peercache.errors import DeadlineExceeded
    monkeypatch.setattr(producer, "POLL_S", 0.01)
    answers = iter([DeadlineExceeded("exists_batch timed out: the call has 8 s in all"), [True, False], [True, True]])

    def exists(keys):
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a
    assert producer.await_published(exists, ["a", "b"], 5.0) == ([True, True], "")

    def slow(keys):
        raise DeadlineExceeded("exists_batch timed out: the call has 8 s in all")
    present, why = producer.await_published(slow, ["a", "b"], 0.05)
    assert present == [False, False] and why.startswith("the last lookup timed out: exists_batch timed out")

    def wrong(keys):
        raise ConfigError("a mistake")
    with pytest.raises(ConfigError):
        producer.await_published(wrong, ["a"], 5.0)
