"""What a producer serves, published with its registration so that a consumer need not be told.

A producer that serves a fixed set of pages (``peercache-bench serve``) registers a :class:`Geometry`
in its node info under :data:`INFO_KEY`: its page size, layout, working set and key scheme. Every
directory hands node infos back unchanged (``members``), the embedded one and Redis alike, so a
consumer reads them there: drive (:mod:`peercache.bench.producer`) and the library
(:class:`peercache.Client`) take what they were not told from it, and :func:`settle` is the one check
of what they were told against it. A producer that publishes none (an older serve, a library
producer) leaves the consumer with its own settings and their defaults.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ..errors import ConfigError

#: The node-info key a producer's geometry is registered under.
INFO_KEY = "geometry"
#: The version of the published record (a consumer ignores a record of a version it does not know).
VERSION = 1
#: The settings a geometry fixes, in the order messages name them.
SETTINGS = ("page_size", "layout", "working_set")


@dataclass(frozen=True)
class Geometry:
    """The pages a producer serves: what a consumer must read them with."""

    #: bytes per object (B; with layout mha, each of a page's K and V objects)
    page_size: int
    #: mla (one object per page) or mha (two: K and V); None: objects under any key
    layout: Optional[str] = None
    #: pages published (under ``key_prefix``); None: no fixed set
    working_set: Optional[int] = None
    #: how its keys are named, e.g. ``pc/<i>``, ``pc/<i>/k|v``, ``pc/P/<i>``; None: any key
    keys: Optional[str] = None
    #: the prefix its keys carry (serve --key-prefix); None: none
    key_prefix: Optional[str] = None

    def to_info(self) -> dict:
        """The record as registered in the node info (msgpack-able)."""
        return {"version": VERSION, "page_size": self.page_size, "layout": self.layout,
                "working_set": self.working_set, "keys": self.keys, "key_prefix": self.key_prefix}

    @classmethod
    def from_info(cls, info: Any) -> Optional["Geometry"]:
        """The geometry a node info carries; None when it carries none, or one this version cannot read
        (a consumer then keeps its own settings, as with an older producer)."""
        rec = info.get(INFO_KEY) if isinstance(info, Mapping) else None
        if not isinstance(rec, Mapping) or rec.get("version") != VERSION:
            return None
        page, ws = rec.get("page_size"), rec.get("working_set")
        if not _count(page) or (ws is not None and not _count(ws)):
            return None
        text = {k: rec.get(k) for k in ("layout", "keys", "key_prefix")}
        if any(v is not None and not isinstance(v, str) for v in text.values()):
            return None
        return cls(page, text["layout"], ws, text["keys"], text["key_prefix"])

    def describe(self) -> str:
        """'131072-byte pages (layout mla, working set 2048, keys pc/<i>)'."""
        more = [f"layout {self.layout}" if self.layout else "",
                f"working set {self.working_set}" if self.working_set is not None else "",
                f"keys {self.keys}" if self.keys else ""]
        more = [m for m in more if m]
        return f"{self.page_size}-byte pages" + (f" ({', '.join(more)})" if more else "")


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


@dataclass(frozen=True)
class Surface:
    """How a consumer spells the geometry's settings in its messages: drive's flags, the library's keywords."""

    #: who holds the settings: "drive", "peercache.connect"
    who: str
    #: setting -> its name there ("--page-size" / "page_size")
    names: Mapping[str, str]
    #: between a name and its value: " " for a flag, "=" for a keyword
    sep: str
    #: how to leave a setting out: "drop {}" / "leave {} unset"
    unset: str

    def setting(self, name: str, value: Any) -> str:
        """'--page-size 4096' / 'page_size=4096'."""
        return f"{self.names[name]}{self.sep}{value}"


def mismatch(surface: Surface, name: str, given: Any, served: Geometry, producer: str) -> str:
    """The one message of a consumer's setting that disagrees with what a producer serves: both values,
    and the two ways out."""
    value = getattr(served, name)
    return (f"{surface.who} {surface.setting(name, given)} but {producer} serves {served.describe()}; "
            f"{surface.unset.format(surface.names[name])} or pass {surface.setting(name, value)}")


def settle(given: Mapping[str, Any], served: Optional[Geometry], surface: Surface, producer: str,
           defaults: Mapping[str, Any], at_least: tuple = ()) -> dict:
    """Each setting of ``given`` (None: not given): the one given, else the producer's (``served``), else
    its default. A setting given that differs from the producer's is a ConfigError (:func:`mismatch`);
    one of ``at_least`` may exceed it (room for an object: more than the producer's size is no mistake)."""
    out = {}
    for name, value in given.items():
        theirs = getattr(served, name) if served is not None else None
        if value is None:
            out[name] = theirs if theirs is not None else defaults[name]
            continue
        if theirs is not None and value != theirs and not (name in at_least and value > theirs):
            raise ConfigError(mismatch(surface, name, value, served, producer))
        out[name] = value
    return out


def published(nodes: Optional[Mapping[str, Any]]) -> dict:
    """node id -> :class:`Geometry` of the members (a ``members`` reply's ``nodes``) that publish one."""
    out = {}
    for node_id, info in (nodes or {}).items():
        g = Geometry.from_info(info)
        if g is not None:
            out[node_id] = g
    return out


def producer_text(info: Any) -> str:
    """'the producer at HOST:PORT' of a node info (its data endpoint, else its host), for messages."""
    info = info if isinstance(info, Mapping) else {}
    data = info.get("data") if isinstance(info.get("data"), Mapping) else {}
    if data.get("host") and data.get("port"):
        return f"the producer at {data['host']}:{data['port']}"
    return f"the producer on {info.get('host') or 'an unnamed host'}"
