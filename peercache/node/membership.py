"""This node's membership in the cluster: its registration with the directory, the heartbeats
that keep it, and leaving."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

import numpy as np

from ..directory.ops import Registration
from ..errors import DiscoveryUnreachable, PeerCacheError, RpcError
from ..rpc import DEFAULT_LIMITS, Limits
from ..timeouts import DEFAULT, Timeouts

log = logging.getLogger("peercache.node")


def _nothing(*_args) -> None:
    return None


class Membership:
    """Registration (the node's id, the token that proves requests in its name, the directory's
    request limits), a heartbeat every ``heartbeat_interval`` on a connection of its own, and
    leaving.

    What registering means to the rest of the node is given as callables: ``on_registered(registration)``
    after each registration, ``on_forgotten()`` after registering again because the directory
    forgot this node, or after a heartbeat that says the directory lost entries this node published
    (its pages are published again; until that succeeds it is called again after each heartbeat),
    ``on_heartbeat()`` after each other heartbeat the directory answered knowing this node (publishes
    it refused are tried again).

    A directory that forgot this node -- it was dropped for silence, or the directory restarted and
    knows nobody -- answers its next heartbeat "unknown", so the node is back, with its pages, one
    heartbeat interval (plus the directory's answers) after the directory is. A restarted directory
    cannot check this node's old token, so it gives the node a new id (see
    :meth:`peercache.directory.service.Membership.join`): :attr:`node_id` changes then.

    A Redis directory that failed over to a replica which lacked the last writes may have kept this
    node's registration but lost some of its entries: the heartbeat's reply says so (``lost``, from
    the marks its publishes leave: :mod:`peercache.directory.redis.marks`), and the node publishes its
    pool again at once, one heartbeat interval after the new master answers (two on a cluster).
    """

    def __init__(self, directory, info: dict, heartbeat_interval: float, *,
                 on_registered: Callable[[Registration], None] = _nothing, on_forgotten: Callable[[], None] = _nothing,
                 on_heartbeat: Callable[[], None] = _nothing, timeouts: Timeouts = DEFAULT):
        #: the directory client (None once closed)
        self.directory = directory
        #: what this node registers as (name, host, pid, protocol, data and control endpoints, regions)
        self.info = info
        self.heartbeat_interval = heartbeat_interval
        #: the bounds of leaving and of the heartbeat thread's end
        self.timeouts = timeouts
        self.on_registered, self.on_forgotten, self.on_heartbeat = on_registered, on_forgotten, on_heartbeat
        self.node_id: str | None = None
        #: issued by discovery at registration; proves requests in this node's name
        self.token: str | None = None
        #: discovery's request limits (from its register reply); batches are split to fit
        self.limits: Limits = DEFAULT_LIMITS
        #: when the directory last answered this node (registration, then each heartbeat; monotonic s)
        self.answered = time.monotonic()
        #: registered again after the directory forgot this node, or told it lost some of its entries,
        #: and on_forgotten not yet done
        self.republish_due = False
        #: heartbeats whose directory said it had lost entries this node published (each one republished them)
        self.lost_reports = 0
        #: when the last of those came (monotonic s; None: never)
        self.lost_reported_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        """Register (again, with the id and token this node holds, after the directory forgot it)."""
        reg = self.directory.register(self.info, self.node_id, self.token)
        self.node_id = reg.node_id
        self.token = reg.token
        self.limits = Limits.from_dict(reg.limits)
        self.on_registered(reg)

    def slices(self, keys: Sequence[bytes], per_key: int):
        """(start, end) slices of ``keys`` that fit one request under discovery's limits.

        ``per_key`` is what each key adds to a request beyond its own bytes.
        One slice (maybe empty) when everything fits, the common case.
        """
        lim = self.limits
        budget = lim.max_message_bytes - (64 << 10)
        n = len(keys)
        if n <= lim.max_keys_per_request and sum(map(len, keys)) + per_key * n <= budget:
            yield 0, n
            return
        ends = np.cumsum(np.fromiter(map(len, keys), np.int64, n) + per_key)   # bytes up to each key
        start, before = 0, 0
        while start < n:
            fit = int(np.searchsorted(ends, before + budget, side="right"))
            end = min(n, start + lim.max_keys_per_request, max(fit, start + 1))
            yield start, end
            start, before = end, int(ends[end - 1])

    # -- heartbeats -----------------------------------------------------------------
    def start_heartbeats(self) -> None:
        self._thread = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._thread.start()

    def stop_heartbeats(self) -> None:
        """No more heartbeats (the node stays registered until the directory times it out)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.timeouts.thread_join_s)

    def silence(self) -> float:
        """Seconds since the directory last answered this node."""
        return time.monotonic() - self.answered

    def _heartbeat_loop(self) -> None:
        # A socket of its own: a heartbeat never waits for this node's other requests (a big
        # lookup in flight, or one waiting out its timeout) to release the shared client.
        hb = None
        while hb is None:
            disc = self.directory
            if disc is None:
                return
            try:
                hb = disc.clone()
            except PeerCacheError as e:
                log.warning("heartbeat: cannot reach the directory (%s); trying again", e)
                if self._stop.wait(self.heartbeat_interval):
                    return
        try:
            self._heartbeats(hb)
        finally:
            hb.close()

    def _heartbeats(self, hb) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                beat = hb.renew(self.node_id, self.token)
                self.answered = time.monotonic()
                if not beat.known:
                    was = self.node_id
                    self.register()
                    self.republish_due = True
                    log.warning("discovery forgot node %s; registered again as node %s", was, self.node_id)
                elif beat.lost:
                    self.lost_reports += 1
                    self.lost_reported_at = self.answered
                    self.republish_due = True
                    log.warning("the directory %s lost entries node %s published (%d of its publish marks "
                                "found behind: a failover to a replica that lacked the last writes?); "
                                "publishing its pool again", getattr(hb, "address", "?"), self.node_id, beat.lost)
                if self.republish_due:
                    # until it succeeds: a republish cut short (the directory gone again, a timeout)
                    # is done again on the next heartbeat, or the pages it missed stay unpublished
                    self.on_forgotten()
                    self.republish_due = False
                else:
                    self.on_heartbeat()
            except PeerCacheError as e:
                log.warning("heartbeat failed: %s", e)

    # -- leaving ------------------------------------------------------------------
    def close(self, leave: bool = True) -> None:
        """Stop the heartbeats and (``leave``) tell the directory this node is gone; the
        directory client stays open (its owner closes it)."""
        self.stop_heartbeats()
        disc = self.directory
        if leave and disc is not None and self.node_id:
            try:
                disc.leave(self.node_id, self.token, timeout=self.timeouts.leave_s)
            except (RpcError, DiscoveryUnreachable):
                pass
        self.directory = None
