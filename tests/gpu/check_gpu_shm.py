"""GET into GPU memory over shm vs a pinned host-to-device copy of the same bytes, in one run.

Run on a GPU machine (PyTorch or CuPy with a CUDA device):

    .venv/bin/python tests/gpu/check_gpu_shm.py [--page-size 131072 --batch 32 --rounds 30]

A producer node (shm pool) and a consumer node run in this process. Each
round times one batch GET staged through pinned host memory and copied to
the GPU, and one plain pinned host-to-device copy of the same number of
bytes; the best round of each is kept. Prints ``ratio gpu_shm_vs_h2d <v>``
(GET-into-GPU GB/s over H2D GB/s). Exit 2 when there is no CUDA device.
"""
from __future__ import annotations

import argparse
import socket
import sys
import time

import numpy as np

from peercache import gpu, tags
from peercache.node import Get, Node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--page-size", type=int, default=131072)
    p.add_argument("--pages", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--device", type=int, default=0)
    a = p.parse_args(argv)
    lib, why = gpu.probe()
    if lib is None:
        print(why, file=sys.stderr)
        return 2
    addr = f"127.0.0.1:{free_port()}"
    prod = Node(addr, protocol="shm", host_discovery=True, pool_slots=a.pages, slot_capacity=a.page_size,
                name="gpu-check-producer")
    cons = None
    try:
        keys = [f"gpu/{i}".encode() for i in range(a.pages)]
        for i in range(0, a.pages, 256):
            prod.put_batch(keys[i:i + 256], fill=lambda v, ref: tags.fill_pattern(v, ref.key_hash, ref.generation))
        cons = Node(addr, protocol="shm", name="gpu-check-consumer")
        nbytes = a.batch * a.page_size
        buf = gpu.GpuBuffer(nbytes, a.device)
        host = buf.pinned(nbytes)
        offs = np.arange(a.batch, dtype=np.uint64) * a.page_size
        khash = np.fromiter((tags.key_hash(k) for k in keys), np.uint64, len(keys))
        # One verified batch first: the bytes that reach the GPU are the published pages.
        r = cons.get_batch_into(keys[:a.batch], host, offs)
        if not (r.status == Get.HIT).all():
            print(f"check batch missed: {r.error}", file=sys.stderr)
            return 1
        buf.upload(host, 0)
        back = buf.download(0, nbytes).reshape(a.batch, a.page_size)
        if not tags.verify_patterns(back, khash[:a.batch], r.generations).all():
            print("pages copied to the GPU do not match what was published", file=sys.stderr)
            return 1
        best_get, best_h2d = 0.0, 0.0
        for rnd in range(a.rounds):
            start = (rnd * a.batch) % max(1, a.pages - a.batch + 1)
            batch = keys[start:start + a.batch]
            t0 = time.perf_counter()
            r = cons.get_batch_into(batch, host, offs)
            buf.upload(host, 0)
            t1 = time.perf_counter()
            if not (r.status == Get.HIT).all():
                print(f"round {rnd}: {int((r.status != Get.HIT).sum())} keys missed: {r.error}", file=sys.stderr)
                return 1
            buf.upload(host, 0)
            t2 = time.perf_counter()
            best_get = max(best_get, nbytes / (t1 - t0) / 1e9)
            best_h2d = max(best_h2d, nbytes / (t2 - t1) / 1e9)
        print(f"gpu library {lib}, page {a.page_size} B, batch {a.batch}, {a.rounds} rounds (best of each)")
        print(f"get_shm_into_gpu GB/s {best_get:.3f}")
        print(f"pinned_h2d GB/s {best_h2d:.3f}")
        print(f"ratio gpu_shm_vs_h2d {best_get / best_h2d:.4f}")
        return 0
    finally:
        if cons is not None:
            cons.close()
        prod.close()


if __name__ == "__main__":
    sys.exit(main())
