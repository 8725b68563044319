"""Test oracle of the slot payload checksum: XXH3-64 of the payload seeded by
peercache.tags.checksum_seed, never 0 (0 means no checksum), through the ``xxhash`` package.

The engine computes it only in the native module (native/checksum.c, libxxhash, AVX2 when the
CPU has it; peercache.transport.base.checksum calls it); tests/engine/node/test_integrity.py
checks that it is this. No production path uses it.
"""
from __future__ import annotations

import xxhash

from peercache.tags import checksum_seed


def checksum(payload, khash: int, generation: int) -> int:
    """The checksum the native module must give ``payload`` written as (``khash``, ``generation``)."""
    return xxhash.xxh3_64_intdigest(memoryview(payload).cast("B"), checksum_seed(khash, generation)) or 1
