"""The published pool: fixed-size slots in one contiguous region, LRU eviction.

The region is a memfd mapping, so the same bytes can be served over TCP,
mapped read-only by a consumer on the same host (shm transport), or
registered with an RDMA device. Writes follow the seqlock discipline of
:mod:`peercache.tags`; the pool's own bookkeeping (which key is in which
slot) lives in Python and is never consulted per read.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from . import tags
from .errors import ConfigError
from .transport.base import checksum


def sealed_region(name: str, size: int, what: str, hint: str) -> tuple[int, mmap.mmap]:
    """(fd, mapping) of a memfd of ``size`` bytes whose size is sealed; ConfigError naming ``what`` and ``hint``.

    Consumers on this host map such a region (shm transport): a size change
    would SIGBUS them, so the size is sealed for good.
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return fd, mmap.mmap(fd, size)
    except OSError as e:
        os.close(fd)
        raise ConfigError(f"cannot allocate a {size} byte {what}: {e}; {hint}") from e


@dataclass(frozen=True)
class SlotRef:
    """Where one object was written: enough for a directory entry."""

    key: bytes
    slot: int
    offset: int       #: byte offset of the slot (its header) in the region
    length: int       #: payload bytes
    capacity: int     #: payload capacity of the slot (trailer sits after it)
    generation: int
    key_hash: int


class Pool:
    """``slots`` slots of ``capacity`` payload bytes each in one memfd region."""

    def __init__(self, slots: int, capacity: int, region_id: int = 1, name: str = "peercache-pool",
                 integrity: bool = False):
        if slots <= 0:
            raise ConfigError(f"pool needs at least one slot, got {slots}")
        if capacity <= 0:
            raise ConfigError(f"slot capacity must be positive, got {capacity} bytes")
        self.slots = slots
        self.capacity = capacity
        #: write a checksum of each payload in its slot header (transport.base.checksum); 0 there otherwise
        self.integrity = bool(integrity)
        self.stride = tags.slot_stride(capacity)
        self.size = self.stride * slots
        self.region_id = region_id
        #: capability the data path checks before serving a range of this region
        self.rkey = secrets.randbits(63) | 1
        self.fd, self.mm = sealed_region(name, self.size, f"pool ({slots} slots x {capacity} B)",
                                         "lower --working-set or --page-size")
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.words = np.frombuffer(self.mm, dtype=np.uint64)
        self._generation = np.zeros(slots, dtype=np.uint64)
        self._lru: OrderedDict[bytes, int] = OrderedDict()  # key -> slot, oldest first
        self._free = list(range(slots - 1, -1, -1))
        self._refs: dict[bytes, SlotRef] = {}
        self._lock = threading.Lock()
        #: objects evicted (least recently used) to make room for new keys
        self.evictions = 0

    # -- writes -------------------------------------------------------------
    def put(self, key: bytes, data, fill=None) -> tuple[SlotRef, SlotRef | None]:
        """Store ``data`` (or let ``fill(view, ref)`` write it) under ``key``.

        Returns the new slot and the evicted object's old ref, if any.
        """
        length = len(data) if data is not None else self.capacity
        if length > self.capacity:
            raise ConfigError(f"object of {length} bytes for key {key!r} does not fit a "
                              f"{self.capacity} byte slot; raise the page size")
        with self._lock:
            evicted = None
            slot = self._lru.pop(key, None)
            if slot is not None:
                self._refs.pop(key, None)
            elif self._free:
                slot = self._free.pop()
            else:
                old_key, slot = self._lru.popitem(last=False)
                evicted = self._refs.pop(old_key)
                self.evictions += 1
            gen = int(self._generation[slot]) + 1
            self._generation[slot] = gen
            ref = SlotRef(key, slot, slot * self.stride, length, self.capacity, gen, tags.key_hash(key))
            self._write(ref, data, fill)
            self._lru[key] = slot
            self._refs[key] = ref
            return ref, evicted

    def _write(self, ref: SlotRef, data, fill) -> None:
        h = ref.offset // 8
        t = (ref.offset + tags.HEADER_BYTES + self.capacity) // 8
        seq = int(self.words[h + tags.SEQ])
        # Odd seq in header and trailer first: any reader overlapping us sees them differ.
        busy = seq + 1 if seq % 2 == 0 else seq + 2
        self.words[h + tags.SEQ] = busy
        self.words[t] = busy
        payload = self.bytes[ref.offset + tags.HEADER_BYTES: ref.offset + tags.HEADER_BYTES + ref.length]
        if fill is not None:
            fill(payload, ref)
        else:
            payload[:] = np.frombuffer(data, dtype=np.uint8)
        self.words[h + tags.KEY_HASH] = ref.key_hash
        self.words[h + tags.GENERATION] = ref.generation
        self.words[h + tags.LENGTH] = ref.length
        self.words[h + tags.CHECKSUM] = checksum(payload, ref.key_hash, ref.generation) if self.integrity else 0
        done = busy + 1
        self.words[t] = done
        self.words[h + tags.SEQ] = done

    def remove(self, key: bytes) -> SlotRef | None:
        """Drop ``key``: its slot's seq is invalidated and the slot freed."""
        with self._lock:
            slot = self._lru.pop(key, None)
            if slot is None:
                return None
            ref = self._refs.pop(key)
            h = ref.offset // 8
            self.words[h + tags.SEQ] = int(self.words[h + tags.SEQ]) + 1  # odd: never matches
            self._free.append(slot)
            return ref

    # -- local reads -----------------------------------------------------------
    def ref(self, key: bytes) -> SlotRef | None:
        """Current slot of ``key`` (producer-side bookkeeping)."""
        with self._lock:
            return self._refs.get(key)

    def refs(self) -> list[SlotRef]:
        """Every object currently in the pool (a snapshot)."""
        with self._lock:
            return list(self._refs.values())

    def __len__(self) -> int:
        return len(self._refs)

    def close(self) -> None:
        """Release the mapping and the memfd."""
        self.bytes = self.words = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a live memoryview keeps it; the fd close below still frees it at exit
        os.close(self.fd)
