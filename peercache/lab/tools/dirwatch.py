"""How many of the producers' entries a directory resolves, over time: the ``directory_faults`` kind's view
of the directory while it fails and comes back.

Every ``--interval`` seconds it asks the directory, through the public client (``peercache.connect``
with no location cache), whether each key of the working sets ``serve --key-prefix`` publishes exists
(one ``exists_batch`` of them all), and prints one JSON line::

    {"t": 1796600000.123, "found": 512, "keys": 512, "s": 0.004, "by": {"pA": 256, "pB": 256}}
    # epoch s, entries resolved, of, the call's s, resolved per producer (key prefix)
    {"t": 1796600000.223, "error": "DiscoveryUnreachable: ..."}        # the directory did not answer

An entry counts when the directory answers for it now: on Redis an entry whose owner's registration is
gone is not found, as a consumer would not find it. It prints :data:`READY` once its first call was
answered and runs until SIGTERM or SIGINT; an error never ends it (the directory is expected to fail)::

    python -m peercache.lab.tools.dirwatch --directory 'redis://:PW@10.0.0.1:6379/0' --key-prefix pA,pB \\
        --working-set 256

The same key naming as serve and drive (``peercache.bench.options.page_keys``); passwords are masked in
what it prints (``peercache.redact``).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any

import peercache
from peercache.bench import options
from peercache.redact import redact

#: What it prints once the directory answered its first call (the lab's readiness pattern).
READY = "peercache dirwatch: watching"
#: Seconds between two calls (the drive timeline's bucket, so both have the same resolution).
INTERVAL_S = 0.1
#: A call's bound: a directory that hangs (a stopped Redis) costs a sample this long, no more.
CALL_TIMEOUT_S = 1.0
#: Characters of an error kept in its line.
ERROR_CHARS = 240


def command(python: list[str], directory: str, prefixes: list[str], working_set: int, layout: str = "mla",
            interval: float = INTERVAL_S) -> list[str]:
    """argv that watches ``directory`` for the working sets of ``prefixes`` (pure)."""
    return [*python, "-m", "peercache.lab.tools.dirwatch", "--directory", directory, "--key-prefix", ",".join(prefixes),
            "--working-set", str(working_set), "--layout", layout, "--interval", f"{interval:g}"]


def parse(text: str) -> list[dict[str, Any]]:
    """The samples of its output (pure): ``{"t", "found", "keys", "s", "by"}`` or ``{"t", "error"}``, in order;
    lines that are not samples (its ready line, a log line) are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("t"), (int, float)) and ("found" in rec or "error" in rec):
            out.append(rec)
    return out


def _print(rec: dict[str, Any]) -> None:
    print(json.dumps(rec), flush=True)


def watch(directory: str, keys: dict[str, list[bytes]], interval: float, stop: threading.Event) -> None:
    """Sample until ``stop``: connect (again, after a failed start), then one exists_batch of every prefix's
    keys (``keys``: prefix -> its keys) per interval."""
    every = [k for ks in keys.values() for k in ks]
    client = None
    ready = False
    try:
        while not stop.is_set():
            t = time.time()
            try:
                if client is None:
                    client = peercache.connect(directory=directory, dir_cache_ttl=0, timeout=CALL_TIMEOUT_S)
                there = client.exists_batch(every)
                by, at = {}, 0
                for prefix, ks in keys.items():
                    by[prefix], at = sum(there[at:at + len(ks)]), at + len(ks)
                _print({"t": round(t, 4), "found": sum(by.values()), "keys": len(every),
                        "s": round(time.time() - t, 4), "by": by})
                if not ready:
                    print(f"{READY} {len(every)} keys at {redact(directory)}", flush=True)
                    ready = True
            except Exception as e:  # noqa: BLE001 - the directory is expected to fail; say how, go on
                _print({"t": round(t, 4), "error": redact(f"{type(e).__name__}: {e}")[:ERROR_CHARS]})
            stop.wait(max(0.0, t + interval - time.time()))
    finally:
        if client is not None:
            try:
                client.node.close(leave=False)    # the directory may be gone: no farewell call to wait on
            except Exception:  # noqa: BLE001 - ending anyway
                pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.tools.dirwatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--directory", required=True, help="HOST:PORT (embedded) or a redis:// / redis+sentinel:// URL")
    p.add_argument("--key-prefix", required=True, help="P1,P2: the producers' key prefixes")
    p.add_argument("--working-set", type=int, required=True, help="pages each producer publishes")
    p.add_argument("--layout", default="mla", choices=sorted(options.LAYOUTS), help="page layout [%(default)s]")
    p.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between samples [%(default)s]")
    a = p.parse_args(argv)
    prefixes = [x for x in a.key_prefix.split(",") if x]
    if not prefixes or a.working_set < 1 or a.interval <= 0:
        p.error("give one or more --key-prefix, a --working-set of 1 or more and a positive --interval")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    watch(a.directory, {x: options.page_keys(a.working_set, a.layout, x) for x in prefixes}, a.interval, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
