"""The ``hicache`` kind: the ``peercache`` pair with drive's loop reading every batch through SGLang HiCache's
v1 path (``PeerCacheStore.batch_get_v1`` into a page_first host KV pool: peercache.bench.hicache_drive).

Declaration only (:class:`HiCacheRun`): its run, sanity and rows are the ``peercache`` kind's
(:mod:`peercache.lab.pipeline.points.peercache`), with its own drive module, point names and tool.
"""
from __future__ import annotations

from typing import ClassVar

from peercache.lab.pipeline.points.peercache import PeerCacheRun


class HiCacheRun(PeerCacheRun):
    """``serve`` on the producer; on the consumer drive's loop with every batch read through SGLang HiCache's
    v1 path (``PeerCacheStore.batch_get_v1`` into a page_first host KV pool: peercache.bench.hicache_drive)."""

    name = "hicache"
    #: the consumer's tool: drive's flags and result document, the read through the HiCache store
    drive_module: ClassVar[str] = "peercache.bench.hicache_drive"
    tool_column = "peercache-hicache"

    @classmethod
    def point_name(cls, one):
        return PeerCacheRun.point_name(one).replace("pc_", "hc_", 1)
