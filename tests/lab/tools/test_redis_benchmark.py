"""tools.redis_benchmark: the MGET command builder and the strict --csv parser, on real captures
(tests/fixtures/lab/redis_benchmark/, see its README.md) and on a live redis-server."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from peercache.lab.errors import ParseError
from peercache.lab.launch import redis as rl
from peercache.lab.tools import redis_benchmark as rb

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "redis_benchmark"
KEYS = [f"pc/{i}" for i in range(128)]


def manifest() -> dict[str, tuple[str, str]]:
    out = {}
    for line in (FIX / "manifest.tsv").read_text().splitlines():
        if line.startswith("#") or line.startswith("file\t"):
            continue
        name, rc, cmd = line.split("\t")
        out[name] = (rc, cmd)
    return out


def test_mget_command_is_pure_and_exact():
    argv = rb.mget_command(6379, ["a", "b"], requests=500, clients=2)
    assert argv == ["redis-benchmark", "-h", "127.0.0.1", "-p", "6379", "-n", "500", "-c", "2", "-P", "1",
                    "--csv", "MGET", "a", "b"]
    assert "--threads" in rb.mget_command(6379, ["a"], threads=2)
    for bad in ({"requests": 0}, {"clients": -1}, {"pipeline": 0}):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            rb.mget_command(6379, ["a"], **bad)
    with pytest.raises(ValueError, match="one argument"):
        rb.mget_command(6379, ["a b"])
    with pytest.raises(ValueError, match="not a TCP port"):
        rb.mget_command(0, ["a"])
    with pytest.raises(ValueError, match="at least one key"):
        rb.mget_command(6379, [])
    # random batches: -r and keys holding __rand_int__; a keyspace for keys without it is refused
    argv = rb.mget_command(6379, ["p:" + rb.RAND] * 2, requests=5, keyspace=16384)
    assert argv[argv.index("-r") + 1] == "16384" and argv[-2:] == ["p:__rand_int__"] * 2
    assert rb.random_key("p:", 42) == "p:000000000042"
    with pytest.raises(ValueError, match="randomises only keys that hold __rand_int__"):
        rb.mget_command(6379, ["a"], keyspace=10)
    with pytest.raises(ValueError, match="keyspace"):
        rb.mget_command(6379, ["p:" + rb.RAND], keyspace=0)


def test_fixture_commands_are_what_the_builder_makes():
    """The captures were made with this builder: its argv, port aside, is the recorded command."""
    m = manifest()
    rc, cmd = m["mget_b128_c2.csv"]
    port = int(cmd.split()[4])
    assert rc == "0" and cmd == subprocess.list2cmdline(rb.mget_command(port, KEYS, requests=20000, clients=2))


@pytest.mark.parametrize("name,clients", [("mget_b128_c1", 1), ("mget_b128_c2", 2)])
def test_parse_real_mget_128(name, clients):
    res = rb.parse_csv((FIX / f"{name}.csv").read_text(), source=name)
    r = rb.mget_result(res, 128, source=name)
    assert r.command == "MGET" and r.keys_per_request == 128
    assert r.test.split()[1:4] == ["pc/0", "pc/1", "pc/2"]
    assert r.rps > 0 and 0 < r.min_latency_ms <= r.p50_latency_ms <= r.p95_latency_ms <= r.p99_latency_ms \
        <= r.max_latency_ms
    # the CSV's own numbers, read back exactly
    line = (FIX / f"{name}.csv").read_text().splitlines()[1]
    assert line.split('","')[1] == f"{r.rps:.2f}"
    assert rb.classify_failure((FIX / f"{name}.csv").read_text(), (FIX / f"{name}.stderr").read_text(), 0) is None
    rows = rb.to_rows(r, experiment="e", testbed="t", scenario="s", run_id="x", tool="redis-benchmark",
                      threads=clients)
    by = {row.metric: row for row in rows}
    assert by["keys_per_s"].value == pytest.approx(r.rps * 128) and by["keys_per_s"].unit == "ops/s"
    assert by["batches_per_s"].value == r.rps and by["batches_per_s"].raw_value == r.rps
    assert by["latency_p50"].value == pytest.approx(r.p50_latency_ms * 1000) and by["latency_p50"].unit == "us"


def test_batch_of_other_size_is_refused():
    res = rb.parse_csv((FIX / "mget_b8_c1.csv").read_text(), source="mget_b8_c1")
    assert rb.mget_result(res, 8).keys_per_request == 8
    with pytest.raises(ParseError, match="8 keys, not the 128 asked for"):
        rb.mget_result(res, 128)


def test_refused_connection_is_classified():
    rc, _ = manifest()["err_refused.csv"]
    assert rc == "killed-after-3s"
    out, err = (FIX / "err_refused.csv").read_text(), (FIX / "err_refused.stderr").read_text()
    te = rb.classify_failure(out, err, None, host="local")
    assert te is not None and te.kind == "cannot_connect" and "127.0.0.1:" in str(te)
    assert "start redis-server" in str(te)
    with pytest.raises(ParseError, match="empty output"):
        rb.parse_csv(out)


def test_parser_names_the_bad_line():
    text = (FIX / "mget_b128_c1.csv").read_text()
    header, line = text.splitlines()[:2]
    with pytest.raises(ParseError, match="line 2.*not a number"):
        rb.parse_csv(header + "\n" + line.replace('","', '","x', 1) + "\n")
    with pytest.raises(ParseError, match="line 1.*header"):
        rb.parse_csv('"test","rps"\n"MGET a","1.0"\n')
    with pytest.raises(ParseError, match="no test line"):
        rb.parse_csv(header + "\n")
    with pytest.raises(ParseError, match="fields, expected 8"):
        rb.parse_csv(header + '\n"MGET a","1.0"\n')
    with pytest.raises(ParseError, match="nothing completed"):
        rb.parse_csv(header + '\n"MGET a","0.00","0","0","0","0","0","0"\n')


def test_version():
    assert rb.parse_version("redis-benchmark 7.0.15\n") == "7.0.15"
    assert rb.parse_version("redis-benchmark v=7.2.4 sha=0") == "7.2.4"
    with pytest.raises(ParseError):
        rb.parse_version("nope")


@pytest.mark.skipif(not rl.available()[0], reason=rl.available()[1] or "redis ok")
def test_live_mget_on_a_real_server(redis_server):
    keys = KEYS[:16]
    r = subprocess.run(rl.cli_command(redis_server.port, "mset", *[x for k in keys for x in (k, "v")]),
                       capture_output=True, text=True, timeout=10)
    assert r.stdout.strip() == "OK"
    p = subprocess.run(rb.mget_command(redis_server.port, keys, requests=2000, clients=1),
                       capture_output=True, text=True, timeout=60)
    assert rb.classify_failure(p.stdout, p.stderr, p.returncode) is None
    res = rb.mget_result(rb.parse_csv(p.stdout), 16)
    assert res.rps > 0


@pytest.mark.skipif(not rl.available()[0], reason=rl.available()[1] or "redis ok")
def test_live_random_mget_reads_only_the_keys_stored_under_its_names(redis_server):
    """-r's names are random_key's: the server counts every key read as a hit, none as a miss."""
    redis_server.seed([rb.random_key("pc:e:pc/", i) for i in range(64)], "v" * 56)
    redis_server.keyspace_stats(reset=True)
    p = subprocess.run(rb.mget_command(redis_server.port, ["pc:e:pc/" + rb.RAND] * 8, requests=500, clients=1,
                                       keyspace=64), capture_output=True, text=True, timeout=60)
    assert rb.classify_failure(p.stdout, p.stderr, p.returncode) is None
    st = redis_server.keyspace_stats()
    assert st["keyspace_misses"] == 0 and st["keyspace_hits"] >= 500 * 8
    # and a keyspace larger than what is stored shows up as misses
    p = subprocess.run(rb.mget_command(redis_server.port, ["pc:e:pc/" + rb.RAND] * 8, requests=200, clients=1,
                                       keyspace=1000), capture_output=True, text=True, timeout=60)
    assert redis_server.keyspace_stats()["keyspace_misses"] > 0
