"""The transport interface shared by tcp, shm and rdma.

A producer *exposes* regions (its pool); a consumer *registers* local
buffers and calls :meth:`Transport.read_batch` with an array of ops, each
``(remote region, rkey, remote offset, length, local region, local offset)``.
The result is one status per op. Batches are NumPy structured arrays, never
lists of Python objects.
"""
from __future__ import annotations

import abc
import enum
import importlib
from typing import Any

import numpy as np

from ..auth import NONE as NO_CREDENTIALS
from ..auth import Credentials
from ..errors import ConfigError
from ..tags import HEADER_BYTES, TAG_BYTES, TRAILER_BYTES, checksum_seed

OP_DTYPE = np.dtype([
    ("region", "<u4"),         # remote region id
    ("local_region", "<u4"),   # index into the local buffers of the call
    ("rkey", "<u8"),           # remote region key (capability)
    ("remote_offset", "<u8"),
    ("length", "<u8"),
    ("local_offset", "<u8"),
])


#: A cached directory location as the native path reads it (pc_loc in pc.h).
LOC_DTYPE = np.dtype([
    ("node", "<u4"),           # interned node index; ABSENT = no location
    ("region", "<u4"),
    ("rkey", "<u8"),
    ("offset", "<u8"),         # slot (header) offset in the region
    ("length", "<u8"),
    ("capacity", "<u8"),
    ("generation", "<u8"),
    ("key_hash", "<u8"),
])
ABSENT = 0xFFFFFFFF
#: Payload checks of a batch read (the same numbers as the native module's CHECK_*).
CHECK_PATTERN, CHECK_INTEGRITY = 1, 2

_native_cache: list = []


def native_module():
    """``(peercache._native, None)``, or ``(None, why it is unavailable)``."""
    if not _native_cache:
        try:
            mod = importlib.import_module("peercache._native")
            if not hasattr(mod, "read_slots"):
                # The source folder alone imports as an empty namespace package.
                raise ImportError("the extension is not built")
            if (mod.OP_ITEMSIZE != OP_DTYPE.itemsize or mod.LOC_ITEMSIZE != LOC_DTYPE.itemsize
                    or getattr(mod, "TAG_BYTES", None) != TAG_BYTES or getattr(mod, "CHECK_INTEGRITY", None)
                    != CHECK_INTEGRITY):
                raise ImportError(f"it was built from other sources (op {mod.OP_ITEMSIZE} B, "
                                  f"location {mod.LOC_ITEMSIZE} B, slot tags "
                                  f"{getattr(mod, 'TAG_BYTES', '?')} B)")
            _native_cache.append((mod, None))
        except ImportError as e:
            _native_cache.append((None, f"peercache._native is unavailable ({e}): run `make setup`, which "
                                        "builds the C extension (or `pip install -e .`; either needs a C "
                                        "compiler and python3-dev)"))
    return _native_cache[0]


def checksum(payload, khash: int, generation: int) -> int:
    """The slot checksum of ``payload`` (the tag's CHECKSUM word, with integrity on): XXH3-64 seeded
    by :func:`peercache.tags.checksum_seed`, never 0 (0 = none), computed by the native module
    (libxxhash, AVX2 when the CPU has it) as its read pass does; ConfigError saying how to build
    it when the module is missing. (tests/oracles/checksum.py computes it in Python, for the tests.)"""
    mod, why = native_module()
    if mod is None:
        raise ConfigError(f"payload checksums (integrity) need the native module: {why}")
    return mod.checksum(payload, checksum_seed(khash, generation))


class Status(enum.IntEnum):
    """Per-op result codes (shared with the native module)."""

    OK = 0
    BAD_REGION = 1      #: unknown remote region or wrong key
    OUT_OF_RANGE = 2    #: remote range outside the region
    ZERO_LENGTH = 3     #: length 0 is refused, not silently "read"
    LOCAL_RANGE = 4     #: destination outside the local buffer
    CONNECTION = 5      #: the channel failed during the batch
    PEER_GONE = 6       #: the producer cannot be reached / has exited
    TOO_LARGE = 7       #: op or batch larger than the server accepts
    REFUSED = 8         #: the server refused the whole request


STATUS_TEXT = {
    Status.OK: "ok",
    Status.BAD_REGION: "unknown remote region or wrong region key",
    Status.OUT_OF_RANGE: "remote range outside the registered region",
    Status.ZERO_LENGTH: "zero-length read",
    Status.LOCAL_RANGE: "destination range outside the local buffer",
    Status.CONNECTION: "data connection failed",
    Status.PEER_GONE: "producer unreachable or exited",
    Status.TOO_LARGE: "op or batch too large for the server",
    Status.REFUSED: "request refused by the server",
}


def make_ops(n: int) -> np.ndarray:
    """A zeroed op array of length ``n``."""
    return np.zeros(n, dtype=OP_DTYPE)


#: The local buffers of a slot read: the tag scratch (header + trailer of each key) and the destination.
SLOT_TAGS, SLOT_DEST = 0, 1


def slot_ops(region, rkey, offset, length, capacity, tag_offset, dest_offset,
             dest_local=None) -> tuple[np.ndarray, np.ndarray]:
    """The reads of slots, one entry per key in each argument, in the order the seqlock check needs:
    header, payload, trailer; header and trailer land at ``tag_offset`` of the tag scratch
    (local buffer SLOT_TAGS, header then trailer), the payload at ``dest_offset`` of the
    destination (SLOT_DEST); an empty object has no payload op.

    ``dest_local`` (per key, optional): the payload lands at ``dest_offset`` of local buffer
    SLOT_DEST + ``dest_local`` instead (one buffer per key, as read_slots takes a list of them).

    This is the one Python definition of the layout (``pc_slot_ops`` in native/pc.h is the C one).
    Returns the ops and, for each op, the index of its key.
    """
    offset, length = np.asarray(offset, np.uint64), np.asarray(length, np.uint64)
    capacity, tag_offset = np.asarray(capacity, np.uint64), np.asarray(tag_offset, np.uint64)
    dest_offset = np.asarray(dest_offset, np.uint64)
    full = length > 0
    nops = np.where(full, 3, 2)
    first = np.cumsum(nops) - nops
    ops = np.zeros(int(nops.sum()), dtype=OP_DTYPE)
    key = np.repeat(np.arange(len(offset)), nops)
    ops["region"], ops["rkey"] = np.repeat(np.asarray(region, np.uint32), nops), np.repeat(np.asarray(rkey, np.uint64), nops)
    head, pay, trail = first, first[full] + 1, first + nops - 1
    for idx, local, remote, ln, loff in (
            (head, SLOT_TAGS, offset, HEADER_BYTES, tag_offset),
            (pay, SLOT_DEST, offset[full] + HEADER_BYTES, length[full], dest_offset[full]),
            (trail, SLOT_TAGS, offset + HEADER_BYTES + capacity, TRAILER_BYTES, tag_offset + HEADER_BYTES)):
        ops["local_region"][idx] = local
        ops["remote_offset"][idx] = remote
        ops["length"][idx] = ln
        ops["local_offset"][idx] = loff
    if dest_local is not None:
        ops["local_region"][pay] = SLOT_DEST + np.asarray(dest_local, np.uint32)[full]
    return ops, key


class Transport(abc.ABC):
    """One data-path transport in one process (both roles).

    Everything a node uses is declared here; abilities a transport lacks
    have harmless defaults (no control ops, no buffer registration), so the
    node never probes for them.
    """

    name: str = ""

    #: The cluster credentials the node gave with :meth:`use_credentials` (none by default).
    credentials: Credentials = NO_CREDENTIALS

    def use_credentials(self, credentials: Credentials) -> None:
        """Authenticate with ``credentials`` from now on: the data connections' handshake (tcp),
        the control endpoint's CURVE keys (rdma). Called before :meth:`start`."""
        self.credentials = credentials

    def control_handlers(self) -> dict | None:
        """Ops this transport serves on the node's control endpoint (None: it needs none).

        A producer whose transport needs set-up per consumer (rdma: the QP exchange) serves
        them on an endpoint of its own, on the bind host, with the node's credentials."""
        return None

    def prepare_local(self, buf) -> None:
        """Make ``buf`` a destination reads can land in at full speed (rdma: register it)."""

    # -- producer side --------------------------------------------------------
    @abc.abstractmethod
    def expose(self, region_id: int, buffer, rkey: int, **info: Any) -> None:
        """Make ``buffer`` readable by peers as ``region_id`` guarded by ``rkey``."""

    @abc.abstractmethod
    def start(self, bind_host: str) -> dict[str, Any]:
        """Start serving exposed regions; returns the endpoint info peers connect with."""

    # -- consumer side --------------------------------------------------------
    @abc.abstractmethod
    def read_batch(self, peer: str, info: dict[str, Any], ops: np.ndarray,
                   local: list) -> np.ndarray:
        """Execute ``ops`` against ``peer`` into the ``local`` buffers; int32 status per op."""

    #: True when :meth:`native_peer` gives handles the native batch path can use.
    native: bool = False

    #: True when reads land only in memory registered with the device (rdma, beyond 64 B; see
    #: :meth:`prepare_local`): a node reads into scratch it keeps registered, never into scratch
    #: of a native call's own (such as the directory table read of ``native_peer`` handles).
    needs_registered_memory: bool = False

    def native_peer(self, peer: str, info: dict[str, Any]):
        """A connected ``peercache._native.Peer`` for ``peer`` (native transports only)."""
        return None

    def forget(self, peer: str) -> None:
        """Drop any connection state for ``peer`` (it left or restarted)."""

    # -- counters (read by the metrics endpoint at scrape time, never per op) ----------
    #: The counts of one rail in rail_stats() (each cumulative; besides them: rail, state, completion_errors).
    RAIL_COUNTS = ("bytes_read", "reads", "qp_resets", "downs", "ups")

    def rail_stats(self) -> list[dict[str, Any]]:
        """One dict per rail, cumulative: ``rail`` (device name), ``state`` ("up"/"down"),
        ``bytes_read``, ``reads``, ``completion_errors`` (ibv_wc_status name -> count),
        ``qp_resets``, ``downs``, ``ups``. Empty for a transport without rails (tcp, shm)."""
        return []

    def server_stats(self) -> dict[str, Any]:
        """Counters of this transport's data server (tcp: accepted and open connections, requests
        served, refusals by kind; see ``peercache.transport.tcp.STAT_NAMES``); empty without one."""
        return {}

    @abc.abstractmethod
    def close(self) -> None:
        """Stop serving and drop every connection."""
