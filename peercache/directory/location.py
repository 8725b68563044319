"""A location: where a published page lives, as the directory stores and answers it.

A location is the tuple ``(node_id, region, rkey, offset, length, capacity,
generation, key_hash)``: everything a consumer needs to issue a one-sided
read of the slot and check its tag afterwards.
"""
from __future__ import annotations

import struct
from typing import NamedTuple, Sequence

from ..transport.base import LOC_DTYPE


class Location(NamedTuple):
    """Where a published object lives."""

    node_id: str
    region: int
    rkey: int
    offset: int
    length: int
    capacity: int
    generation: int
    key_hash: int


#: One location as the directory stores it and a fast lookup reply carries it: a LOC_DTYPE
#: record whose ``node`` is the directory's own number for the node (see :meth:`Directory.node_ids`).
RECORD = struct.Struct("<IIQQQQQQ")
assert RECORD.size == LOC_DTYPE.itemsize == 56


def encode_record(num: int, loc: Sequence) -> bytes:
    """The stored form of a location (7 fields, or 8 with the node id first) owned by member ``num``."""
    return RECORD.pack(num, *(loc[1:] if len(loc) == 8 else loc))


def decode_record(v: bytes) -> tuple | None:
    """(member number, region, rkey, offset, length, capacity, generation, key_hash) of a stored
    entry; None for a value that is not a record (an older PeerCache's, or garbage)."""
    return RECORD.unpack(v) if len(v) == RECORD.size else None
