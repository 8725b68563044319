"""Discovery: membership with heartbeats and an epoch, plus the directory.

The service runs inside the node that owns ``--discovery-addr`` (or a
standalone meta process). Nodes register their endpoint info, heartbeat,
and are dropped with all their directory entries when they stop. Every
change of membership bumps the epoch, so clients can tell when to refresh
what they cached about peers.

Registration hands each node a random token (over the authenticated channel
when the cluster has a secret). Requests in a node's name -- heartbeat,
leave, publish, unpublish, and extra ops such as serve's ``reader_done`` --
must carry it, so no process can speak for another node, and only the owner
of a directory entry may overwrite or unpublish it. Every request is checked
against :class:`~peercache.rpc.Limits`, and published locations against the
region sizes the node registered.
"""
from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from ..rpc import DEFAULT_LIMITS, Limits, pack
from .location import Location
from .store import Directory
from .validate import (Refused, check_keys, check_location, check_regions, check_token, not_registered,
                       regions_of, requester)

log = logging.getLogger("peercache.directory")

#: A node that has not heartbeated for this long is dropped.
DEFAULT_HEARTBEAT_TIMEOUT = 5.0
#: Tokens of nodes that left or expired, kept so such a node can register again under its id.
RETIRED_TOKENS = 4096
#: A directory's first epoch is drawn at random below this (2**52: exact as a double, so in JSON
#: too), so a directory started again at the same address does not answer the epochs its previous
#: incarnation answered (see :class:`Membership`).
EPOCH_SPACE = 1 << 52

class Membership:
    """Registered nodes, their tokens, and the membership epoch.

    Each incarnation of the directory (a process that hosts it, started again at the same address
    after it died) starts knowing nobody: its tokens and members are in memory only. Two rules keep
    what nodes and consumers hold from the previous incarnation harmless:

    - Ids: a node gets its id back only with the token this incarnation issued for it (see
      :meth:`join`), so after a restart every node registers again under a fresh id.
    - Epochs: the first epoch is drawn at random from :data:`EPOCH_SPACE` (:attr:`incarnation`), so a
      consumer holding node infos as of an old epoch never meets the same number again and is sent
      the current infos with its next lookup, instead of trusting infos of an old membership.
    """

    def __init__(self, heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, clock=time.monotonic,
                 limits: Limits = DEFAULT_LIMITS):
        self.heartbeat_timeout = heartbeat_timeout
        self.clock = clock
        self.limits = limits
        #: this incarnation's first epoch (random: see the class doc); each change of membership adds one
        self.incarnation = secrets.randbelow(EPOCH_SPACE)
        self.epoch = self.incarnation
        self._nodes: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, float] = {}
        self._tokens: dict[str, str] = {}
        self._retired: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def join(self, info: dict[str, Any], node_id: str | None = None,
             token: str | None = None) -> tuple[str, str, int]:
        """Add a node; returns (node_id, token, epoch).

        ``node_id`` is kept only with the token this directory issued with it (a node registering
        again after it was dropped for silence, or after it left); otherwise the node gets a fresh
        id, so nobody can register in another node's name.

        The token is the only proof of an id, and only the directory that issued it can check it.
        A directory started again (a new incarnation, with no tokens) therefore cannot tell a node
        coming back with its own id and token from one presenting another's id with a guessed or
        copied token, nor from one claiming an id nobody held: it treats every such claim as
        unproven and gives a fresh id and token. That is always safe -- no old token lets anyone
        take an id, and a fresh id is never one a live member has -- and costs the node nothing it
        would not do anyway: the restarted directory holds none of its entries, so it republishes
        them all under the new id. (Binding ids to the cluster secret with an HMAC would let a
        restarted directory check old tokens, but every member holds that secret, so any member
        could forge any other's token: it would not keep one node from speaking for another.)
        """
        with self._lock:
            known = None
            if isinstance(node_id, str) and isinstance(token, str):
                known = self._tokens.get(node_id) or self._retired.get(node_id)
                if known is None or not hmac.compare_digest(known, token):
                    known = None
            if known is None:
                if len(self._nodes) >= self.limits.max_nodes:
                    raise self.limits.refuse("max_nodes", f"registration of node {len(self._nodes) + 1}",
                                             " registered nodes")
                node_id, token = secrets.token_hex(6), secrets.token_hex(16)
                while node_id in self._nodes or node_id in self._retired:
                    node_id = secrets.token_hex(6)
            self._retired.pop(node_id, None)
            self._nodes[node_id] = dict(info, node_id=node_id)
            self._tokens[node_id] = token
            self._seen[node_id] = self.clock()
            self.epoch += 1
            return node_id, token, self.epoch

    def register(self, info: dict[str, Any]) -> tuple[str, int]:
        """Add a node (its endpoint info) under a fresh id; returns (node_id, epoch)."""
        node_id, _, epoch = self.join(info)
        return node_id, epoch

    def token(self, node_id: str) -> str | None:
        """The token issued to ``node_id``; None when it is not registered."""
        with self._lock:
            return self._tokens.get(node_id)

    def heartbeat(self, node_id: str) -> bool:
        """Refresh a node; False when it is unknown (it must register again)."""
        with self._lock:
            if node_id not in self._nodes:
                return False
            self._seen[node_id] = self.clock()
            return True

    def _retire(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        self._seen.pop(node_id, None)
        token = self._tokens.pop(node_id, None)
        if token is not None:
            self._retired[node_id] = token
            while len(self._retired) > RETIRED_TOKENS:
                self._retired.popitem(last=False)

    def leave(self, node_id: str) -> bool:
        """Remove a node that is shutting down."""
        with self._lock:
            if node_id not in self._nodes:
                return False
            self._retire(node_id)
            self.epoch += 1
            return True

    def restart_countdowns(self) -> int:
        """Count every member's heartbeat timeout from now (after this process did not run, no one's
        heartbeat could arrive); returns how many members."""
        now = self.clock()
        with self._lock:
            for n in self._seen:
                self._seen[n] = now
            return len(self._seen)

    def expire(self) -> list[str]:
        """Drop nodes whose heartbeat is overdue; returns their ids."""
        now = self.clock()
        with self._lock:
            dead = [n for n, t in self._seen.items() if now - t > self.heartbeat_timeout]
            for n in dead:
                self._retire(n)
            if dead:
                self.epoch += 1
            return dead

    def get(self, node_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._nodes.get(node_id)

    def members(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)


class MetaService:
    """Discovery + directory as RPC handlers, with a reaper for dead nodes.

    ``table_entries`` > 0 gives the directory a one-sided table of that many entries
    (:mod:`peercache.directory.table`); the node that hosts this service exposes it through its data
    transport and calls :meth:`announce_table`, after which the register and members replies
    carry ``table`` (what a consumer needs to read it). Until then, or without a table, they
    carry none and consumers use the lookup RPC alone.

    ``reaper=False`` starts no reaper thread: the caller expires members with :meth:`reap_once`
    (a test that drives ``membership.clock`` by hand, which a reaper of its own would race).
    """

    def __init__(self, heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, limits: Limits | None = None,
                 table_entries: int = 0, reaper: bool = True):
        self.limits = limits or DEFAULT_LIMITS
        self.membership = Membership(heartbeat_timeout, limits=self.limits)
        self.directory = Directory(table_entries)
        self._table: dict | None = None
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="discovery-reaper", daemon=True)
        if reaper:
            self._reaper.start()

    def _reap(self) -> None:
        timeout = self.membership.heartbeat_timeout
        period = max(0.05, min(1.0, timeout / 4))
        clock = self.membership.clock
        last = clock()
        while not self._stop.wait(period):
            now = clock()
            if now - last > period + timeout / 2:
                # This process did not run (SIGSTOP, a suspended VM, starvation): heartbeats sent
                # meanwhile were not received, so silence says nothing about the members. Dropping
                # them all would delete every entry and read as misses until each republished.
                n = self.membership.restart_countdowns()
                log.warning("discovery did not run for %.1f s (stopped or starved?); the heartbeat timeout "
                            "of its %d member(s) counts from now instead of dropping them", now - last, n)
            self.reap_once()
            last = clock()

    def reap_once(self) -> list[str]:
        """Expire overdue nodes and drop their directory entries."""
        dead = self.membership.expire()
        for n in dead:
            self.directory.drop_node(n)
        if dead:
            self.directory.set_table_epoch(self.membership.epoch)
        return dead

    def announce_table(self, node_id: str, data: dict, directory: str) -> None:
        """Consumers of the directory at ``directory`` (HOST:PORT, where this service answers)
        read the table from ``node_id``'s data endpoint ``data`` from now on."""
        table = self.directory.table
        if table is not None:
            self._table = {**table.info(), "node_id": node_id, "data": dict(data), "directory": directory}

    def withdraw_table(self) -> None:
        """Announce no table any more (it could not be exposed)."""
        self._table = None
        self.directory.close()

    def table_info(self) -> dict | None:
        """The table as announced (None: no table)."""
        return self._table if self.directory.table is not None else None

    def stop(self) -> None:
        self._stop.set()
        self._table = None
        self.directory.close()

    def handlers(self) -> dict:
        """The RPC ops this service answers."""
        return {
            "register": self._register,
            "heartbeat": self._heartbeat,
            "leave": self._leave,
            "members": self._members,
            "publish": self._publish,
            "lookup": self._lookup,
            "unpublish": self._unpublish,
        }

    # -- who is asking -----------------------------------------------------------------
    def authorize(self, msg: dict, op: str) -> str:
        """The node a request speaks for, if it carries that node's token; else Refused."""
        node_id = requester(msg, op)
        stored = self.membership.token(node_id)
        if stored is None:
            raise Refused(not_registered(node_id))
        check_token(node_id, op, msg.get("token"), stored)
        return node_id

    def owner_only(self, op: str, fn: Callable[[dict], dict]) -> Callable[[dict], dict]:
        """``fn`` wrapped so that only a registered node, with its token, may call ``op``."""
        def wrapped(msg: dict) -> dict:
            self.authorize(msg, op)
            return fn(msg)
        return wrapped

    # -- validation ------------------------------------------------------------------
    def _keys(self, keys: Any, op: str, field: str = "keys") -> list:
        return check_keys(keys, op, self.limits, field)

    def _info(self, info: Any) -> dict:
        lim = self.limits
        if not isinstance(info, dict):
            raise TypeError("register needs an 'info' map")
        size = len(pack(info))
        if size > lim.max_node_info_bytes:
            raise lim.refuse("max_node_info_bytes", f"registration with {size} bytes of node info",
                             " bytes of node info")
        for k in ("name", "host", "protocol"):
            if k in info and not isinstance(info[k], str):
                raise TypeError(f"register: info[{k!r}] must be a string")
        if "data" in info and not isinstance(info["data"], (dict, type(None))):
            raise TypeError("register: info['data'] must be a map")
        check_regions(info.get("regions"))
        return {k: v for k, v in info.items() if k not in ("node_id", "token")}

    # -- handlers --------------------------------------------------------------------
    def _register(self, msg: dict) -> dict:
        info = self._info(msg["info"])
        node_id, token, epoch = self.membership.join(info, msg.get("node_id"), msg.get("token"))
        if msg.get("node_id") == node_id:
            self.directory.drop_node(node_id)   # a node back after being dropped republishes all
        self.directory.number(node_id)          # its member number, for the table's records
        self.directory.set_table_epoch(epoch)
        reply = {"node_id": node_id, "token": token, "epoch": epoch,
                 "heartbeat_timeout": self.membership.heartbeat_timeout, "limits": self.limits.as_dict()}
        table = self.table_info()
        if table is not None:
            reply["table"] = table
        return reply

    def _heartbeat(self, msg: dict) -> dict:
        node_id = msg["node_id"]
        if not isinstance(node_id, str):
            raise TypeError("heartbeat needs a 'node_id' string")
        stored = self.membership.token(node_id)
        if stored is not None:
            check_token(node_id, "heartbeat", msg.get("token"), stored)
        return {"known": stored is not None and self.membership.heartbeat(node_id),
                "epoch": self.membership.epoch}

    def _leave(self, msg: dict) -> dict:
        node_id = self.authorize(msg, "leave")
        left = self.membership.leave(node_id)
        self.directory.drop_node(node_id)
        self.directory.set_table_epoch(self.membership.epoch)
        return {"left": left, "epoch": self.membership.epoch}

    def _members(self, msg: dict) -> dict:
        """``{epoch, nodes}``; with a table also ``table`` and ``nums`` (member number -> node id,
        the numbers the table's records carry)."""
        epoch = self.membership.epoch
        nodes = self.membership.members()
        reply = {"epoch": epoch, "nodes": nodes}
        table = self.table_info()
        if table is not None:
            reply["table"] = table
            reply["nums"] = self.directory.numbers(nodes)
        return reply

    def _publish(self, msg: dict) -> dict:
        node_id = self.authorize(msg, "publish")
        keys, locs = self._keys(msg["keys"], "publish"), msg["locs"]
        if not isinstance(locs, list) or len(locs) != len(keys):
            raise TypeError(f"publish needs a 'locs' list as long as 'keys' ({len(keys)})")
        unpub = self._keys(msg.get("unpublish") or [], "publish", "unpublish")
        info = self.membership.get(node_id) or {}
        regions = regions_of(info)
        rows = [Location(node_id, *check_location(node_id, i, loc, regions)) for i, loc in enumerate(locs)]
        if len(self.directory) + len(keys) > self.limits.max_directory_entries:
            raise self.limits.refuse("max_directory_entries", f"publish of {len(keys)} keys into a "
                                     f"directory of {len(self.directory)} entries", " entries")
        n, refused = self.directory.publish_checked(node_id, keys, rows, takeover=False, members_only=True)
        removed = self.directory.unpublish(node_id, unpub)
        reply: dict[str, Any] = {"published": n, "unpublished": removed}
        if refused:
            reply.update(refused=len(refused), refused_keys=[keys[i] for i in refused[:8]], refused_index=refused,
                         refused_reason="published by another node; only the owner of an entry may "
                                        "overwrite it")
        return reply

    def _lookup(self, msg: dict) -> dict:
        """Locations of ``keys``.

        With ``recs`` true (what :class:`~peercache.node.Node` asks for) the reply is
        ``{recs: bytes, nids: {number: node_id}, epoch}``: one fixed LOC_DTYPE record per
        key found, in order (its ``node`` is the directory's number for the node), the
        node ids of the numbers present, ``missing`` (little-endian uint32 indices of the
        keys not found) when some were not, and ``nodes`` (the endpoint infos of the nodes
        present) only when the request's ``epoch`` is not the current one. Without it, or
        when an entry fits no record, the original ``{locs: [8-field list | None], nodes, epoch}``.
        """
        keys = self._keys(msg["keys"], "lookup")
        epoch = self.membership.epoch
        recs = self.directory.lookup_records(keys) if msg.get("recs") is True else None
        if recs is not None:
            blob, missing, nids = recs
            reply: dict[str, Any] = {"recs": blob, "nids": nids, "epoch": epoch}
            if missing:
                reply["missing"] = missing
            if msg.get("epoch") != epoch and nids:
                get = self.membership.get
                reply["nodes"] = {n: get(n) for n in nids.values()}
            return reply
        locs = self.directory.lookup_lists(keys)
        get = self.membership.get
        nodes = {n: get(n) for n in {loc[0] for loc in locs if loc is not None}}
        return {"locs": locs, "nodes": nodes, "epoch": epoch}

    def _unpublish(self, msg: dict) -> dict:
        node_id = self.authorize(msg, "unpublish")
        return {"unpublished": self.directory.unpublish(node_id, self._keys(msg["keys"], "unpublish"))}
