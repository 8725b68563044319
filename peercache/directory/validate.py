"""The directory's rules, once: which keys, locations and requesters it accepts.

Both backends check what a request carries with these functions (the embedded
service in :mod:`.service`, Redis in :mod:`.redis.backend`), and a consumer checks
what a lookup answers with :func:`read_location`, because a directory stores what
producers publish and a hostile one may answer anything.

A refusal raises :class:`Refused` (or the :class:`~peercache.rpc.Limits`' own
``LimitExceeded``) with a message that says what was wrong; each backend adds who
refused it.
"""
from __future__ import annotations

import hmac
from typing import Any

from .. import tags
from ..errors import PeerCacheError
from ..rpc import Limits
from .location import Location

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
#: The 8 fields of a location, in order.
LOC_FIELDS = Location._fields
#: The longest node id a directory accepts.
MAX_NODE_ID = 64
_BYTES = {bytes}


class Refused(PeerCacheError):
    """A request the directory will not carry out (not the owner, an invalid location, ...)."""


def check_keys(keys: Any, op: str, limits: Limits, field: str = "keys") -> list:
    """``keys`` when it is a list of byte strings within ``limits``; else Refused / LimitExceeded."""
    if not isinstance(keys, list):
        raise Refused(f"{op} needs a '{field}' list of byte strings")
    if len(keys) > limits.max_keys_per_request:
        raise limits.refuse("max_keys_per_request", f"{op} of {len(keys)} keys", " keys per request")
    longest = limits.max_key_bytes
    if not keys or (set(map(type, keys)) == _BYTES and max(map(len, keys)) <= longest):
        return keys   # the common case, checked without a Python loop body per key
    for i, k in enumerate(keys):
        if type(k) is not bytes:
            raise Refused(f"{op}: {field}[{i}] is {type(k).__name__}; keys are byte strings")
        if len(k) > longest:
            raise limits.refuse("max_key_bytes", f"{op} of a {len(k)} byte key ({field}[{i}])", " bytes per key")
    return keys


def regions_of(info: dict) -> dict[int, int] | None:
    """region id -> size in bytes as the node registered them (None when it registered none)."""
    regs = info.get("regions")
    if regs is None:
        return None
    return {int(r[0]): int(r[1]) for r in regs}


def check_regions(regs: Any) -> None:
    """A registration's ``regions``: a list of [region id, size] integer pairs; else Refused."""
    if regs is not None and (not isinstance(regs, list) or not all(
            type(r) is list and len(r) == 2 and all(type(x) is int and 0 <= x <= U64 for x in r) for r in regs)):
        raise Refused("register: info['regions'] must be a list of [region id, size] integer pairs")


def check_location(node_id: str, i: int, loc: Any, regions: dict[int, int] | None) -> tuple[int, ...]:
    """The 7 numbers of published location ``i`` (8 fields with ``node_id`` first, or the 7 after it)
    when it is a slot inside a region ``node_id`` registered; else Refused."""
    if type(loc) is not list or len(loc) not in (7, 8):
        raise Refused(f"publish refused: location {i} must be a list of the 8 fields {', '.join(LOC_FIELDS)}")
    if len(loc) == 8:
        if loc[0] != node_id:
            raise Refused(f"publish refused: location {i} names node {loc[0]!r}, not the publisher "
                          f"{node_id!r}; a node publishes only its own slots")
        loc = loc[1:]
    for name, v in zip(LOC_FIELDS[1:], loc):
        if type(v) is not int or not 0 <= v <= U64:
            raise Refused(f"publish refused: location {i} has {name}={v!r}; every field after "
                          "node_id is an integer in [0, 2**64)")
    region, _rkey, offset, length, capacity, _gen, _kh = loc
    if region > U32:
        raise Refused(f"publish refused: location {i} has region={region}, beyond 32 bits")
    if length > capacity:
        raise Refused(f"publish refused: location {i} has length {length} > capacity {capacity}")
    if regions is not None:
        size = regions.get(region)
        if size is None:
            raise Refused(f"publish refused: location {i} is in region {region}, which node "
                          f"{node_id!r} did not register (it registered {sorted(regions)})")
        end = offset + tags.TAG_BYTES + capacity
        if end > size:
            raise Refused(f"publish refused: location {i}'s slot [{offset}, {end}) lies outside "
                          f"region {region} of {size} bytes")
    return tuple(loc)


def requester(msg: dict, op: str) -> str:
    """The node id a request speaks for; Refused when it names none that could be registered."""
    node_id = msg.get("node_id")
    if not isinstance(node_id, str) or not node_id or len(node_id) > MAX_NODE_ID:
        raise Refused(f"{op} refused: it must name the registered node it comes from "
                      "(node_id and the token issued at registration)")
    return node_id


def not_registered(node_id: str) -> str:
    """Why a request in the name of a node the directory does not know is refused."""
    return (f"node {node_id!r} is not registered (it may have been dropped after missing heartbeats, "
            "or the directory lost its data); register again")


def check_token(node_id: str, op: str, token: Any, stored: str | bytes) -> None:
    """Refused unless ``token`` is the one the directory issued to ``node_id`` (``stored``)."""
    if isinstance(stored, str):
        stored = stored.encode()
    if not isinstance(token, str) or not hmac.compare_digest(stored, token.encode()):
        raise Refused(f"{op} refused: missing or wrong token for node {node_id!r}; only the node "
                      f"itself may {op} in its name")


def read_location(raw) -> tuple[Location | None, str | None]:
    """``(Location, None)`` from a directory reply's entry, or ``(None, why)`` when it cannot be a slot.

    The directory stores what producers publish; a corrupt or hostile publish
    (a negative offset, a length beyond the slot, a string where a number
    belongs) must become a per-key error, never a raw exception in the reader.
    """
    if not isinstance(raw, (list, tuple)) or len(raw) != len(LOC_FIELDS):
        return None, f"expected {len(LOC_FIELDS)} fields, got {str(raw)[:80]}"
    node_id, *nums = raw
    if not isinstance(node_id, str) or not node_id:
        return None, f"node id {str(node_id)[:40]!r} is not a string"
    for name, v in zip(LOC_FIELDS[1:], nums):
        if type(v) is not int:
            return None, f"{name} {str(v)[:40]!r} is not an integer"
        if not 0 <= v <= (U32 if name == "region" else U64):
            return None, f"{name} {v} is out of range"
    loc = Location(node_id, *nums)
    if loc.length > loc.capacity:
        return None, f"length {loc.length} exceeds the slot capacity {loc.capacity}"
    if loc.offset + tags.HEADER_BYTES + loc.capacity + tags.TRAILER_BYTES > U64:
        return None, f"slot at offset {loc.offset} with capacity {loc.capacity} overflows 64 bits"
    return loc, None
