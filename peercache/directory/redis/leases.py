"""Owner leases of the Redis directory: whether the member that owns an entry is alive.

An entry names its owner by member number only. A number is trusted for as long as its node
key's TTL said the node lives (a lease cached here, all dropped when the epoch moves), and is
checked again with one more round trip once that lease runs out: its node hash must still carry
that number. A number seen for the first time costs one more round trip, to learn its node id.
"""
from __future__ import annotations

import time

from ...rpc import unpack


class OwnerLeases:
    """Leases on owners' liveness, mixed into :class:`~.backend.RedisDirectory` (whose
    ``__init__`` sets the state used here: ``_leases``, ``_lease_epoch``, ``_ids`` and ``_lock``)."""

    def _owners(self, nums: list[int], epoch: int) -> dict[int, tuple[str, dict]]:
        """Member number -> (node id, info) of those of ``nums`` that are alive (leases cached)."""
        now = time.monotonic()
        self._epoch = epoch
        if len(nums) == 1 and epoch == self._lease_epoch:    # the common case, without the lock
            le = self._leases.get(nums[0])
            if le is not None and le[0] > now:
                return {} if le[1] is None else {nums[0]: le[1]}
        with self._lock:
            if epoch != self._lease_epoch:
                self._leases.clear()
                self._lease_epoch = epoch
            leases = self._leases
            need = [x for x in nums if (le := leases.get(x)) is None or le[0] <= now]
        if need:
            self._refresh_leases(need, now)
        leases = self._leases
        out = {}
        for x in nums:
            le = leases.get(x)
            if le is not None and le[1] is not None:
                out[x] = le[1]
        return out

    def _refresh_leases(self, nums: list[int], now: float) -> None:
        """Leases of the members ``nums``: the node id of a number seen for the first time (one round
        trip), then each node hash's info, number and TTL (one more). A number whose node hash is gone
        or carries another number now (a Redis restarted empty) is gone for a short while."""
        unknown = [x for x in nums if x not in self._ids]
        if unknown:
            got = self._pipe("lookup", lambda p: [p.hget(self.k_ids, x) for x in unknown])
            for x, nid in zip(unknown, got):
                if nid is not None:
                    self._ids[x] = nid.decode("utf-8", "replace")
        known = [x for x in nums if x in self._ids]
        keys = [self._node_key(self._ids[x]) for x in known]
        res = self._pipe("lookup", lambda p: [(p.hmget(k, ["info", "num"]), p.pttl(k)) for k in keys]) \
            if keys else []
        neg = min(0.25, self.heartbeat_timeout / 4)
        with self._lock:
            if len(self._leases) > 65536:
                self._leases.clear()
            if len(self._ids) > 65536:
                self._ids.clear()
            for x in nums:
                self._leases[x] = (now + neg, None)
            for j, x in enumerate(known):
                (info, num), pttl = res[2 * j], res[2 * j + 1]
                if info is None or pttl == -2 or num is None or num != str(x).encode():
                    if num is not None and num != str(x).encode():
                        self._ids.pop(x, None)      # the id holds another number now: ask again next time
                    continue
                ttl = pttl / 1000 if pttl >= 0 else self.heartbeat_timeout
                self._leases[x] = (now + ttl, (self._ids[x], unpack(info)))
