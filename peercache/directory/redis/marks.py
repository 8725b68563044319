"""Publish marks: how a producer notices that Redis lost entries it published while its
registration survived (a failover to a replica that had not yet received the master's last writes).

Redis replicates asynchronously but in order: a replica holds a prefix of its master's writes. So
each publish ends, on every master it wrote entries to, by raising a small *mark* to the publish's
generation (a number this client hands out, one higher per publish). A master that holds a node's
mark at generation g holds every entry that node published there up to g. The client remembers the
generation each mark was acknowledged at; a mark that later reads lower (or is gone) means the
server answering for it now lacks some of the node's writes, and the node publishes its whole pool
again (:class:`~peercache.node.membership.Membership`, told by its heartbeat's ``lost``).

- Where: on one Redis (or the master Sentinel names) one mark per node, ``P:g:{<node id>}``. On a
  Redis Cluster one per node and master it published to, ``P:g:{<tag>}:<node id>``, in that master's
  first slot (``<tag>``: a short string of that slot, :func:`slot_tag`), so the mark moves with the
  master's entries when its replica takes over its slots.
- When: each publish reads what the marks it raises held before (one script per master, in the
  publish's round trip), and each heartbeat reads them all: on one Redis in the heartbeat's own
  round trip, on a cluster in a round trip of its own on a helper thread (a master that hangs must
  not hold up the heartbeat that keeps the node registered, nor fail it), reported by the next
  heartbeat. A loss is reported, and the republish starts, at the first heartbeat (cluster: the
  second) that reaches the new master, or the first publish there.
- Cost: one command per publish per master written to, and one per master per heartbeat; nothing per
  key. Memory: one mark per node and master, kept as long as the node's owned set (renewed by the
  reads), deleted when the node leaves.
- Not seen: entries deleted by anything but a lost write (an operator's DEL, a ``maxmemory`` eviction
  policy: give the directory's Redis ``noeviction``); slots moved by resharding between a publish and
  a failover (the next publish marks their new master).

Everything is republished, not only the keys written since the mark that survived: the node keeps no
log of its publishes (memory per key), its pool is the truth, a publish is idempotent (owner-checked),
the republish also repairs the node's owned set (``P:o:{<node id>}``, which the failover may have cut
short too), and failovers are rare.
"""
from __future__ import annotations

import functools
import threading
from typing import Sequence

from redis.crc import key_slot

from ...errors import PeerCacheError
from .connection import log

#: Hash tags tried per slot by :func:`slot_tag` at most (every slot has one among the first ~200000).
_TAG_TRIES = 1 << 22


def keep_ms(heartbeat_timeout: float) -> int:
    """How long a node's owned set and marks outlive its last heartbeat, in ms: 4 heartbeat timeouts,
    at least a minute (a node back after a long silence registers again and republishes anyway)."""
    return max(4 * int(heartbeat_timeout * 1000), 60000)


@functools.lru_cache(maxsize=None)
def slot_tag(slot: int) -> str:
    """The shortest hexadecimal string whose Redis Cluster hash slot is ``slot`` (a hash tag ``{tag}``
    puts a key there)."""
    for i in range(_TAG_TRIES):
        tag = format(i, "x")
        if key_slot(tag.encode()) == slot:
            return tag
    raise ValueError(f"no hash tag of slot {slot} among {_TAG_TRIES} tried; a slot is 0-16383")


class NodeMarks:
    """One node's marks as its clients wrote them."""

    def __init__(self):
        #: the last generation handed out
        self.gen = 0
        #: mark key -> the generation a publish raised it to and Redis acknowledged
        self.acked: dict[str, int] = {}
        #: marks found behind since the last heartbeat reported them
        self.lost = 0


class MarkBook:
    """The marks of the nodes that publish through one client, shared with its clones (the
    heartbeat's clone reads the marks the publishing client raised)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeMarks] = {}

    def next_gen(self, nid: str) -> int:
        """A generation higher than any handed out before for ``nid``."""
        with self._lock:
            n = self._nodes.setdefault(nid, NodeMarks())
            n.gen += 1
            return n.gen

    def raised(self, nid: str, keys: Sequence[str], gen: int, before: Sequence) -> None:
        """A publish raised ``keys`` to ``gen``; ``before``: what each held then (lower than acknowledged:
        lost)."""
        with self._lock:
            n = self._nodes.setdefault(nid, NodeMarks())
            for k, b in zip(keys, before):
                had = n.acked.get(k, 0)
                if int(b) < had:
                    n.lost += 1
                n.acked[k] = max(had, gen)

    def expected(self, nid: str) -> dict[str, int]:
        """Mark key -> the generation it must hold at least, for ``nid`` (a copy)."""
        with self._lock:
            n = self._nodes.get(nid)
            return dict(n.acked) if n is not None else {}

    def read(self, nid: str, want: dict[str, int], got: Sequence) -> None:
        """Marks of ``nid`` read back (``got``, in the order of ``want``): one lower than wanted is lost,
        and the republish it calls for starts from what it holds."""
        with self._lock:
            n = self._nodes.get(nid)
            if n is None:
                return
            for (k, w), g in zip(want.items(), got):
                if int(g) < w:
                    n.lost += 1
                    if n.acked.get(k) == w:     # no publish raised it since the read was sent
                        n.acked[k] = int(g)

    def take_lost(self, nid: str) -> int:
        """How many marks of ``nid`` were found behind since the last call (then 0)."""
        with self._lock:
            n = self._nodes.get(nid)
            if n is None:
                return 0
            lost, n.lost = n.lost, 0
            return lost

    def forget(self, nid: str) -> list[str]:
        """Drop ``nid``'s marks (it leaves); their keys."""
        with self._lock:
            n = self._nodes.pop(nid, None)
            return list(n.acked) if n is not None else []


class PublishMarks:
    """Raising and reading publish marks, mixed into :class:`~.backend.RedisDirectory` (whose
    ``__init__`` sets ``_marks``, a :class:`MarkBook` its clones share, and ``_mark_reader``)."""

    #: master name -> its first slot, and the slot map it was computed from
    _first_slots: tuple[object, dict[str, int]] = (None, {})

    def _mark_key(self, nid: str, slot: int | None = None) -> str:
        if slot is None:
            return f"{self._p}:g:{{{nid}}}"
        return f"{self._p}:g:{{{slot_tag(slot)}}}:{nid}"

    def _mark_keys(self, nid: str, keys: Sequence[bytes | str]) -> list[str]:
        """The marks that cover the stored keys ``keys`` of ``nid``: one on one Redis; on a cluster one
        per master owning a slot of them, in its first slot."""
        if not self.cluster:
            return [self._mark_key(nid)]
        slots = self.r.nodes_manager.slots_cache
        made, first = self._first_slots
        out: dict[int, None] = {}
        for k in keys:
            s = key_slot(k.encode() if isinstance(k, str) else k)
            try:
                name = slots[s][0].name
            except (KeyError, IndexError):      # no master known for it: the publish fails and says so
                out[s] = None
                continue
            f = first.get(name)
            at = slots.get(f) if f is not None else None
            if at is None or made is not slots or at[0].name != name:      # the map moved: find them again
                first = self._first_slots_of(slots)
                made = slots
                f = first.get(name, s)
            out[f] = None
        return [self._mark_key(nid, s) for s in out]

    def _first_slots_of(self, slots: dict) -> dict[str, int]:
        first: dict[str, int] = {}
        for s in sorted(slots):
            nodes = slots[s]
            if nodes:
                first.setdefault(nodes[0].name, s)
        self._first_slots = (slots, first)
        return first

    def _queue_mark_reads(self, p, want: dict[str, int]) -> None:
        ttl = keep_ms(self.heartbeat_timeout)
        for k in want:
            self._evalsha(p, "read_mark", [k], [ttl])

    def _read_marks_soon(self, nid: str) -> None:
        """A cluster's mark reads, on a helper thread (one at a time), reported by a later heartbeat."""
        if self._marks.expected(nid) and (self._mark_reader is None or not self._mark_reader.is_alive()):
            self._mark_reader = threading.Thread(target=self._read_marks_quietly, args=(nid,),
                                                 name="redis-marks", daemon=True)
            self._mark_reader.start()

    def _read_marks_quietly(self, nid: str) -> None:
        want = self._marks.expected(nid)
        try:
            got = self._pipe("heartbeat", lambda p: self._queue_mark_reads(p, want))
        except PeerCacheError as e:      # a master failing over: the next heartbeat reads them again
            log.debug("reading the publish marks of node %s through %s: %s", nid, self.address, e)
            return
        self._marks.read(nid, want, got)
