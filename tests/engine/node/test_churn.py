"""The churn benchmark: verified GETs while the producer overwrites and evicts.

The 10 M GET runs are ``slow`` (not in the default run; ``pytest -m slow
tests/engine/node/test_churn.py`` or the script by hand:
``python -m peercache.bench.churn --protocol tcp --gets 10000000``).
"""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import scaled
from peercache import tags
from peercache.bench import churn

CHURN = [sys.executable, "-m", "peercache.bench.churn"]
LINE = re.compile(r"^churn (\w+) gets=(\d+) hits=(\d+) misses=(\d+) errors=(\d+) wrong_bytes=(\d+) .*"
                  r"seconds=([\d.]+)", re.M)


def _line(out: str) -> dict:
    m = LINE.search(out)
    assert m, out
    proto, gets, hits, misses, errors, wrong, secs = m.groups()
    return {"protocol": proto, "gets": int(gets), "hits": int(hits), "misses": int(misses),
            "errors": int(errors), "wrong_bytes": int(wrong), "seconds": float(secs)}


@pytest.mark.parametrize("size", [1, 7, 8, 100, 4096])
def test_expected_pages_is_what_the_producer_writes(size):
    kh = np.array([tags.key_hash(b"a"), tags.key_hash(b"b"), 1], dtype=np.uint64)
    gen = np.array([1, 7, 2 ** 63], dtype=np.uint64)
    want = churn.expected_pages(kh, gen, size)
    for i in range(3):
        page = np.empty(size, np.uint8)
        tags.fill_pattern(page, int(kh[i]), int(gen[i]))
        assert np.array_equal(want[i], page)
    assert want.shape == (3, size)
    assert tags.verify_patterns(want.copy(), kh, gen).all()


def test_churn_smoke_runs_and_reports_the_line():
    """A short run of the script itself (the 10 M runs below are slow)."""
    r = subprocess.run([*CHURN, "--protocol", "tcp", "--gets", "20000", "--max-seconds", "60"],
                       capture_output=True, text=True, timeout=scaled(120))
    assert r.returncode == 0, r.stdout + r.stderr
    d = _line(r.stdout)
    assert d["gets"] == 20000 and d["hits"] > 0 and d["misses"] > 0
    assert d["errors"] == 0 and d["wrong_bytes"] == 0


def test_churn_refuses_a_run_without_eviction_or_cached_locations():
    for flags in (["--keys", "10", "--slots", "20"], ["--dir-cache-ttl", "0"], ["--gets", "0"]):
        r = subprocess.run([*CHURN, *flags], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, (flags, r.stderr)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_churn_ten_million_verified_gets_zero_wrong_bytes(protocol):
    r = subprocess.run([*CHURN, "--protocol", protocol, "--gets", "10000000", "--max-seconds", "1500"],
                       capture_output=True, text=True, timeout=scaled(1700))
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    d = _line(r.stdout)
    assert d["gets"] == 10_000_000 and d["wrong_bytes"] == 0 and d["errors"] == 0
    assert d["hits"] > 1_000_000 and d["misses"] > 0


# The producer with a broken seqlock: it rewrites a slot's payload (slowly, in two halves) while the
# old tag still reads as complete. The churn check must see wrong bytes, or it proves nothing.
_SABOTAGE = r"""
import sys, time
from peercache import pool, tags
from peercache.bench import churn

def bad_write(self, ref, data, fill):
    h = ref.offset // 8
    t = (ref.offset + tags.HEADER_BYTES + self.capacity) // 8
    seq = int(self.words[h + tags.SEQ])
    done = seq + 2 if seq % 2 == 0 else seq + 1
    start = ref.offset + tags.HEADER_BYTES
    payload = self.bytes[start: start + ref.length]
    tmp = payload.copy()
    fill(tmp, ref)
    half = ref.length // 2
    payload[:half] = tmp[:half]
    time.sleep(0.0002)
    payload[half:] = tmp[half:]
    self.words[h + tags.KEY_HASH] = ref.key_hash
    self.words[h + tags.GENERATION] = ref.generation
    self.words[h + tags.LENGTH] = ref.length
    self.words[t] = done
    self.words[h + tags.SEQ] = done

pool.Pool._write = bad_write
sys.exit(churn.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["tcp", "shm"])
def test_churn_catches_a_producer_that_breaks_the_seqlock(protocol):
    r = subprocess.run([sys.executable, "-c", _SABOTAGE, "--protocol", protocol, "--gets", "1000000",
                        "--put-pause", "0", "--max-seconds", "300"],
                       capture_output=True, text=True, timeout=scaled(400))
    d = _line(r.stdout)
    assert r.returncode == 1 and d["wrong_bytes"] > 0, r.stdout + r.stderr
