"""A real serve/drive measurement on this machine over loopback TCP.

What ``make run`` runs until the Snakemake pipeline takes over: it starts
``peercache-bench serve`` and ``peercache-bench drive`` as two processes,
prints drive's table and writes the result document under bench-results/.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .serve import READY_LINE

SERVE_READY_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    out_dir = Path("bench-results")
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"local-tcp-{time.strftime('%Y%m%dT%H%M%S')}.json"
    addr = f"127.0.0.1:{_free_port()}"
    common = ["--discovery-addr", addr, "--protocol", "tcp", "--layout", "mla",
              "--page-size", "131072", "--working-set", "1024"]
    bench = [sys.executable, "-m", "peercache.bench.cli"]
    serve = subprocess.Popen([*bench, "serve", *common, "--readers", "1"], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVE_READY_TIMEOUT
        for line in serve.stdout:
            print(line, end="")
            if READY_LINE in line:
                break
            if time.monotonic() > deadline:
                break
        else:
            print("serve exited before it was ready", file=sys.stderr)
            return 1
        rc = subprocess.call([*bench, "drive", *common, "--batch-size", "32", "--concurrencies", "1,2",
                              "--duration", "5", "--warmup", "1", "--out", str(out)], timeout=300)
        print(f"\nresult document: {out}")
        return rc
    finally:
        if serve.poll() is None:
            try:
                serve.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGTERM)
                serve.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
