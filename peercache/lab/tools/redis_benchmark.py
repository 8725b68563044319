"""redis-benchmark (Redis's own load tool): command builder and a strict parser of its ``--csv`` output.

The directory bench uses it as the raw limit of a Redis directory: batched
``MGET`` of ``batch`` keys on the same redis-server, ``-c`` connections (the
same concurrency as the Redis backend's client processes), no pipelining
(``-P 1``: one request in flight per connection, as each client has one
lookup in flight). redis-benchmark 7.0's ``--csv`` prints one header line
and one line per test::

    "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    "mget k0 k1 ...","18552.88","0.085","0.016","0.087","0.119","0.151","2.839"

(see tests/fixtures/lab/redis_benchmark/ for real captures). Sanity and
extraction are separate: :func:`classify_failure` says why a run did not
produce a result (it prints "Could not connect to Redis at H:P: ..." on
stderr and then keeps retrying, so the runner must bound it with a
timeout); :func:`parse_csv` reads the figures or raises :class:`ParseError`
naming the line.
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.tidy import Row

TOOL = "redis-benchmark"

#: The ``--csv`` header of redis-benchmark 7.x (6.x printed only "test","rps").
CSV_HEADER = ("test", "rps", "avg_latency_ms", "min_latency_ms", "p50_latency_ms", "p95_latency_ms",
              "p99_latency_ms", "max_latency_ms")


#: What redis-benchmark replaces, in each argument, by a random number below its ``-r`` keyspace,
#: written as 12 zero-padded digits (a new number for each occurrence, each request).
RAND = "__rand_int__"


def random_key(prefix: str, i: int) -> str:
    """The key redis-benchmark's ``-r`` makes of ``prefix + RAND`` for the number ``i``."""
    return f"{prefix}{i:012d}"


def mget_command(port: int, keys: list[str], *, host: str = "127.0.0.1", requests: int = 100000,
                 clients: int = 1, pipeline: int = 1, threads: int | None = None, keyspace: int | None = None,
                 binary: str = "redis-benchmark") -> list[str]:
    """argv of ``redis-benchmark ... --csv MGET k1 .. kN``: ``requests`` MGETs over ``clients`` connections.

    ``keyspace``: ``-r keyspace``, so each :data:`RAND` in a key is a new random number below it in
    every request (random batches out of that many keys, see :func:`random_key`); None: the same
    keys in every request."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{port!r} is not a TCP port")
    if not keys:
        raise ValueError("MGET needs at least one key")
    for name, v in (("requests", requests), ("clients", clients), ("pipeline", pipeline)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"redis-benchmark {name} must be an integer >= 1, got {v!r}")
    bad = [k for k in keys if not k or any(c.isspace() for c in k) or k.startswith("-")]
    if bad:
        raise ValueError(f"key {bad[0]!r} cannot be passed to redis-benchmark as one argument "
                         "(empty, whitespace, or starts with '-')")
    if keyspace is not None and (not isinstance(keyspace, int) or keyspace < 1):
        raise ValueError(f"redis-benchmark keyspace (-r) must be an integer >= 1, got {keyspace!r}")
    if keyspace is not None and not any(RAND in k for k in keys):
        raise ValueError(f"a keyspace (-r) randomises only keys that hold {RAND}; none of the keys does")
    argv = [binary, "-h", host, "-p", str(port), "-n", str(requests), "-c", str(clients), "-P", str(pipeline)]
    if keyspace is not None:
        argv += ["-r", str(keyspace)]
    if threads is not None:
        argv += ["--threads", str(threads)]
    return argv + ["--csv", "MGET", *keys]


def version_command(binary: str = "redis-benchmark") -> list[str]:
    """argv that prints redis-benchmark's version (``redis-benchmark 7.0.15``)."""
    return [binary, "--version"]


def parse_version(text: str) -> str:
    """``redis-benchmark 7.0.15`` (or ``... v=7.0.15``) -> ``7.0.15``."""
    m = re.search(r"redis-benchmark\s+(?:v=)?(\d+\.\d+(?:\.\d+)?)", text)
    if m is None:
        raise ParseError(TOOL, "no version in its --version output", line=text.strip()[:200])
    return m.group(1)


@dataclass
class BenchmarkResult:
    """One redis-benchmark test: requests per second and its latency summary (ms as printed)."""

    test: str                      #: the command as redis-benchmark names it ("mget k0 k1 ...")
    rps: float                     #: requests per second over the whole run
    avg_latency_ms: float
    min_latency_ms: float
    p50_latency_ms: float
    p95_latency_ms: float
    p99_latency_ms: float
    max_latency_ms: float

    @property
    def command(self) -> str:
        """The command name in upper case (``MGET``)."""
        return self.test.split()[0].upper() if self.test.split() else ""

    @property
    def keys_per_request(self) -> int:
        """Arguments after the command: for MGET, keys per request."""
        return len(self.test.split()) - 1


def classify_failure(stdout: str, stderr: str, returncode: int | None, host: str = "") -> ToolError | None:
    """Why a run produced no result (a ToolError to raise), or None when its output looks like a result."""
    text = f"{stdout}\n{stderr}"
    m = re.search(r"Could not connect to Redis at (\S+): (.+)", text)
    if m:
        return ToolError(host=host, tool=TOOL, kind="cannot_connect", returncode=returncode,
                         detail=f"could not connect to Redis at {m.group(1)} ({m.group(2).strip()})",
                         check="start redis-server on that address first, or fix -h/-p")
    if returncode == 127 or "redis-benchmark: not found" in text or "No such file" in text and TOOL in text:
        return ToolError(host=host, tool=TOOL, kind="not_installed", returncode=returncode,
                         detail="redis-benchmark is not installed",
                         check="apt-get install redis-tools (Debian's redis-server depends on it)")
    m = re.search(r"Unrecognized option or bad number of args for: '([^']*)'", text)
    if m:
        return ToolError(host=host, tool=TOOL, kind="unknown_option", returncode=returncode,
                         detail=f"it rejected option {m.group(1)!r}", check="see redis-benchmark --help")
    if returncode not in (0, None):
        last = (stderr.strip() or stdout.strip()).splitlines()[-1:] or ["no output"]
        return ToolError(host=host, tool=TOOL, kind="failed", returncode=returncode,
                         detail=f"exited without a result: {last[0][:200]!r}", check="read its log")
    return None


def _num(value: str, field: str, source: str, line_no: int, line: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise ParseError(TOOL, f"field {field!r} is {value!r}, not a number", source=source,
                         line_no=line_no, line=line) from None
    if v < 0 or v != v:
        raise ParseError(TOOL, f"field {field!r} is {value!r}, not a non-negative number", source=source,
                         line_no=line_no, line=line)
    return v


def parse_csv(text: str, source: str = "<text>") -> list[BenchmarkResult]:
    """Every test of redis-benchmark 7.x ``--csv`` output; ParseError naming the line on anything else."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ParseError(TOOL, "empty output (did it run? with --csv it prints a header and one line per test)",
                         source=source)
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if tuple(rows[0]) != CSV_HEADER:
        raise ParseError(TOOL, f"first line is not the 7.x --csv header {','.join(CSV_HEADER)}",
                         source=source, line_no=1, line=lines[0])
    out = []
    for i, (row, line) in enumerate(zip(rows[1:], lines[1:]), start=2):
        if len(row) != len(CSV_HEADER):
            raise ParseError(TOOL, f"{len(row)} fields, expected {len(CSV_HEADER)}", source=source,
                             line_no=i, line=line)
        vals = [_num(v, f, source, i, line) for f, v in zip(CSV_HEADER[1:], row[1:])]
        out.append(BenchmarkResult(row[0], *vals))
    if not out:
        raise ParseError(TOOL, "a header but no test line (the run was cut short?)", source=source,
                         line_no=1, line=lines[0])
    for r in out:
        if r.rps <= 0:
            raise ParseError(TOOL, f"test {r.command} reports {r.rps} requests per second: nothing completed",
                             source=source)
    return out


def mget_result(results: list[BenchmarkResult], batch: int, source: str = "<text>") -> BenchmarkResult:
    """The one MGET test of ``batch`` keys among ``results`` (sanity: the tool ran what was asked)."""
    found = [r for r in results if r.command == "MGET"]
    if len(found) != 1:
        raise ParseError(TOOL, f"expected one MGET test, found {[r.command for r in results]}", source=source)
    if found[0].keys_per_request != batch:
        raise ParseError(TOOL, f"the MGET test has {found[0].keys_per_request} keys, not the {batch} asked for",
                         source=source)
    return found[0]


def to_rows(result: BenchmarkResult, **ctx) -> list[Row]:
    """Tidy rows of one MGET test: keys/s and batches (requests)/s, both in the tidy unit ``ops/s``
    (an op is one key, resp. one MGET), and the p50/p99 latencies in µs."""
    n = result.keys_per_request
    extra = dict(ctx.pop("extra", {}) or {}, test_keys=n, avg_latency_ms=result.avg_latency_ms,
                 max_latency_ms=result.max_latency_ms)
    rows = [Row(metric="keys_per_s", value=result.rps * n, unit="ops/s", raw_value=result.rps,
                raw_unit="ops/s", extra=dict(extra, op="key"), **ctx),
            Row(metric="batches_per_s", value=result.rps, unit="ops/s", raw_value=result.rps,
                raw_unit="ops/s", extra=dict(extra, op="MGET"), **ctx)]
    for q, v in (("p50", result.p50_latency_ms), ("p99", result.p99_latency_ms)):
        rows.append(Row(metric=f"latency_{q}", value=v * 1000.0, unit="us", raw_value=v, raw_unit="ms",
                        extra=extra, **ctx))
    return rows
