"""Publishing: the pages of this node's pool, in the directory."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError
from ..pool import Pool, SlotRef
from .membership import Membership

log = logging.getLogger("peercache.node")

#: the region id of the pool in this node's data server (directory locations name it)
POOL_REGION = 1


class Publisher:
    """Writes objects into the pool (``pool``, None on a node that stores nothing) and publishes
    their locations in the directory, in this node's name (``membership``); unpublishes the ones
    the pool evicts or removes.

    A key whose publish the directory refused (another node still owns its entry, e.g. a producer
    that vanished without leaving) is tried again on every heartbeat until that owner is gone.
    """

    def __init__(self, pool: Pool | None, directory, membership: Membership):
        self.pool = pool
        self.directory = directory
        self.membership = membership
        #: keys this node published that stayed with another node (their owner)
        self.refused_total = 0
        #: keys the directory took from this node (each publish, republish and retry counts)
        self.published_total = 0
        self._refused: set[bytes] = set()
        #: held across "which keys are still in the pool" + their publish RPC (see put_batch)
        self._lock = threading.Lock()

    def put_batch(self, keys: Sequence[bytes], values: Sequence | None = None,
                  fill: Callable[[np.ndarray, SlotRef], None] | None = None) -> list[SlotRef]:
        """Write objects into the pool and publish them with one directory RPC."""
        if self.pool is None:
            raise ConfigError("this node has no pool to put into; create it with a pool "
                              "(Client(pool_bytes=...) or peercache-bench serve)")
        refs, evicted = [], {}
        for i, k in enumerate(keys):
            ref, old = self.pool.put(k, None if values is None else values[i], fill)
            refs.append(ref)
            if old is not None:
                evicted[old.key] = None
        # A batch larger than the free slots evicts its own earlier keys, and a
        # repeated key leaves an older ref behind: publish exactly the refs that
        # are still current and unpublish every evicted key no longer in the
        # pool. The check and the RPC are one step under the lock, so a
        # concurrent put_batch/remove_batch cannot publish a key after its
        # eviction was unpublished.
        with self._lock:
            live = [r for r in refs if self.pool.ref(r.key) == r]
            gone = [k for k in evicted if self.pool.ref(k) is None]
            self._publish(live, gone)
        return refs

    def remove_batch(self, keys: Sequence[bytes]) -> int:
        """Remove objects from the pool and the directory."""
        removed = [k for k in keys if self.pool is not None and self.pool.remove(k) is not None]
        if removed:
            with self._lock:
                self._unpublish(removed)
        return len(removed)

    def republish(self) -> None:
        """Publish the whole pool again (the directory forgot this node, or lost some of its entries)."""
        if self.pool is None:
            return
        with self._lock:      # as put_batch: never republish a key just evicted
            self._publish(self.pool.refs(), [])

    def retry_refused(self) -> None:
        """Publish again the keys the directory refused that are still in the pool."""
        if self._refused and self.pool is not None:
            with self._lock:      # as put_batch: never republish a key just evicted
                retry = [r for k in list(self._refused) if (r := self.pool.ref(k)) is not None]
                self._refused &= {r.key for r in retry}   # evicted meanwhile: nothing to retry
                if retry:
                    self._publish(retry, [])

    def _loc(self, ref: SlotRef) -> list:
        return [self.membership.node_id, POOL_REGION, self.pool.rkey, ref.offset, ref.length,
                ref.capacity, ref.generation, ref.key_hash]

    def _publish(self, refs: Sequence[SlotRef], evicted: Sequence[bytes]) -> None:
        """Publish ``refs`` and unpublish ``evicted``: one RPC, or as many as discovery's limits need."""
        me = self.membership
        keys = [r.key for r in refs]
        locs = [self._loc(r) for r in refs]
        evicted = list(evicted)
        parts = list(me.slices(keys, 100 + len(me.node_id or "")))
        together = len(parts) == 1 and len(list(me.slices(evicted, 8))) == 1
        refused, example = 0, None
        self._refused.difference_update(keys)
        for a, b in parts:
            got = self.directory.publish(me.node_id, me.token, keys[a:b], locs[a:b],
                                         evicted if together else [])
            if got.refused:
                refused += got.refused
                example = example or (got.refused_keys or [None])[0]
                self._refused.update(keys[a + i] for i in got.refused_index)
        self.published_total += len(keys) - refused
        if evicted and not together:
            self._unpublish(evicted)
        if refused:
            self.refused_total += refused
            log.warning("%d key(s) (e.g. %r) were already published by another node and stay with it: "
                        "only the owner of a directory entry may overwrite it", refused, example)

    def _unpublish(self, keys: Sequence[bytes]) -> int:
        me = self.membership
        n = 0
        for a, b in me.slices(keys, 8):
            n += self.directory.unpublish(me.node_id, me.token, list(keys[a:b]))
        return n
