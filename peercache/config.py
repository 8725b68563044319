"""The node's options, declared once: :class:`NodeConfig`.

Each option is one dataclass field: its type, its default (the one :class:`~peercache.node.Node`
has), its unit, its one-line doc, the check of a value, and how each surface spells it: the
``peercache-bench`` flag (:class:`Flag`: name, the bench's own default, help) and the key of
HiCache's extra config. From these declarations come

* the flags (:func:`add_flag`) and their checks (:func:`checked` / :meth:`NodeConfig.from_args`),
* the extra-config keys and their checks (:meth:`NodeConfig.from_extra`),
* the keyword arguments of ``Node`` (:meth:`NodeConfig.node_kwargs`).

A bad value is refused with a ConfigError that names the option as its surface spells it
(``--max-channels ...``, ``extra config 'max_channels' ...``). Options of one surface alone
(the bench's thread counts, HiCache's tenant) are declared the same way, in that surface's module.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from . import checks, tags
from .address import Address
from .auth import check_secret, load_secret
from .directory.redis.url import PASSWORD_ENV, SENTINEL_FORM, is_redis, parse_url
from .directory.service import DEFAULT_HEARTBEAT_TIMEOUT
from .directory.table import DEFAULT_ENTRIES, DEFAULT_WAYS, LINE_BYTES
from .errors import ConfigError, TransportError
from .timeouts import DEFAULT as DEFAULT_TIMEOUTS, Timeouts
from .transport import PROTOCOLS
from .transport.tcp import poll_us_setting

#: Entries of a directory table beyond this are a typo (the memory checks refuse most sizes well before).
MAX_TABLE_ENTRIES = 1 << 32
#: Memory of one directory-table entry (a bucket line per ``ways`` entries, touched as it fills).
TABLE_BYTES_PER_ENTRY = LINE_BYTES * (DEFAULT_WAYS + 1) / DEFAULT_WAYS
#: An RDMA device name (mlx5_0, rxe0, ...).
DEVICE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class _Same:
    def __repr__(self) -> str:
        return "SAME"


#: A Flag's default or type when it is the option's own.
SAME: Any = _Same()


@dataclass(frozen=True)
class Flag:
    """How ``peercache-bench`` spells an option: the flag, and where it departs from the declaration."""

    name: str                           #: "--max-channels"
    default: Any = SAME                 #: the flag's default, when not the option's
    help: Optional[str] = None          #: the help, when not the option's doc
    #: the default as the help shows it: None = the value (none for None and booleans), "" = none
    shown: Optional[str] = None
    type: Any = SAME                    #: argparse's type, when not the field's (int, float or text)
    choices: Optional[Iterable] = None
    metavar: Optional[str] = None
    action: Optional[str] = None        #: "store_true" / "store_false" (booleans: store_true)
    dest: Optional[str] = None          #: the attribute of the parsed args, when not the name's


@dataclass(frozen=True)
class Option:
    """One option: its doc, unit and check, and its spelling on each surface (see the module doc)."""

    doc: str                            #: one line: what the value means
    unit: str = ""                      #: "s", "B", "µs", ... ("" when a count or a name)
    #: ``check(label, value) -> value``: the value as the field holds it, else a ConfigError naming ``label``
    check: Optional[Callable[[str, Any], Any]] = None
    #: ``parse(label, value) -> value`` before ``check``, for extra config (JSON: '4GiB', "a,b")
    parse: Optional[Callable[[str, Any], Any]] = None
    flag: Optional[Flag] = None         #: the ``peercache-bench`` flag (None: not a flag)
    key: Optional[str] = None           #: the HiCache extra-config key (None: not a key)
    # filled in from the field by options()
    name: str = ""
    default: Any = None
    type: str = ""

    @property
    def optional(self) -> bool:
        """May be unset (None): JSON null then means the default."""
        return self.type.startswith("Optional[")

    @property
    def dest(self) -> str:
        """The attribute argparse gives the flag's value."""
        assert self.flag is not None
        return self.flag.dest or self.flag.name.lstrip("-").replace("-", "_")

    @property
    def flag_default(self) -> Any:
        assert self.flag is not None
        return self.default if self.flag.default is SAME else self.flag.default

    def value(self, label: str, value: Any, *, parse: bool = False) -> Any:
        """``value`` checked (after ``parse`` with ``parse``); ConfigError naming ``label``."""
        if parse and self.parse is not None:
            value = self.parse(label, value)
        return self.check(label, value) if self.check is not None else value


def option(default: Any, doc: str, *, unit: str = "", check: Optional[Callable] = None,
           parse: Optional[Callable] = None, flag: Optional[Flag] = None, key: Optional[str] = None,
           repr: bool = True) -> Any:
    """A dataclass field declaring one option (see :class:`Option`)."""
    return dataclasses.field(default=default, repr=repr, metadata={
        "option": Option(doc, unit, check, parse, flag, key)})


def with_default(cls: type, name: str, default: Any) -> Any:
    """The option ``name`` of ``cls`` again, with another default (a surface whose default differs)."""
    f = cls.__dataclass_fields__[name]
    return dataclasses.field(default=default, repr=f.repr, metadata=f.metadata)


def options(cls: type) -> dict[str, Option]:
    """The options declared by dataclass ``cls`` (and its bases), by field name, in declaration order."""
    out = {}
    for f in dataclasses.fields(cls):
        o = f.metadata.get("option")
        if o is not None:
            t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            out[f.name] = dataclasses.replace(o, name=f.name, default=f.default, type=t)
    return out


def extra_label(key: str) -> str:
    """How an error names an extra-config key."""
    return f"extra config {key!r}"


# -- the flags --------------------------------------------------------------------------------------
def _argtype(o: Option) -> Any:
    base = o.type[len("Optional["):-1] if o.optional else o.type
    return {"int": int, "float": float}.get(base)


def add_flag(parser: argparse.ArgumentParser, o: Option, *, help: Optional[str] = None) -> None:
    """Add option ``o``'s flag to ``parser`` (``help``: this parser's own help text)."""
    f = o.flag
    if f is None:
        raise ValueError(f"option {o.name!r} has no flag")
    default = o.flag_default
    shown = f.shown
    if shown is None:
        shown = "" if default is None or isinstance(default, bool) else "%(default)s"
    text = (help or f.help or o.doc) + (f" [{shown}]" if shown else "")
    kw: dict[str, Any] = {"default": default, "help": text}
    if f.dest:
        kw["dest"] = f.dest
    if f.action or o.type == "bool":
        kw["action"] = f.action or "store_true"
    else:
        t = _argtype(o) if f.type is SAME else f.type
        if t is not None:
            kw["type"] = t
        if f.choices is not None:
            kw["choices"] = f.choices
        if f.metavar:
            kw["metavar"] = f.metavar
    parser.add_argument(f.name, **kw)


def checked(decls: dict[str, Option], args: argparse.Namespace) -> dict[str, Any]:
    """The values of the flags of ``decls`` that ``args`` has (and that are not None), each checked;
    ConfigError names the flag."""
    out = {}
    for name, o in decls.items():
        if o.flag is None or not hasattr(args, o.dest):
            continue
        v = getattr(args, o.dest)
        if v is not None:
            out[name] = o.value(o.flag.name, v)
    return out


# -- checks of the node's options ---------------------------------------------------------------------
def _directory(label: str, v: Any) -> str:
    if isinstance(v, str) and is_redis(v):
        try:
            parse_url(v)
        except ConfigError as e:
            # parse_url names --directory itself; any other surface names its own option first
            raise (e if str(e).startswith(label) else ConfigError(f"{label}: {e}")) from None
        return v
    return checks.host_port(label, v)


def choice(*allowed: str) -> Callable[[str, Any], str]:
    """A check: one of ``allowed``."""
    def check(label: str, v: Any) -> str:
        if v not in allowed:
            raise ConfigError(f"{label}: {v!r} is not one of {list(allowed)}")
        return v
    return check


def boolean(label: str, v: Any) -> bool:
    """A check: true or false (not 0 / 1, not a string)."""
    if not isinstance(v, bool):
        raise ConfigError(f"{label}: {v!r} is not true or false")
    return v


def device(label: str, v: Any) -> str:
    """A check: one RDMA device name."""
    if not isinstance(v, str) or not DEVICE_RE.fullmatch(v):
        raise ConfigError(f"{label}: {v!r} is not an RDMA device name (e.g. mlx5_0)")
    return v


def _devices(label: str, v: Any) -> tuple:
    d = v.split(",") if isinstance(v, str) else v
    names = tuple(x.strip() for x in d if not isinstance(x, str) or x.strip()) \
        if isinstance(d, (list, tuple)) else ()
    if not names or not all(isinstance(x, str) and DEVICE_RE.fullmatch(x) for x in names):
        raise ConfigError(f"{label}: {v!r} is not a list of RDMA device names "
                          "(e.g. [\"mlx5_0\", \"mlx5_1\"] or \"mlx5_0,mlx5_1\")")
    return names


def seconds(*, positive: bool = False, allow_inf: bool = False) -> Callable[[str, Any], float]:
    """A check: a duration (:func:`peercache.checks.seconds`)."""
    return lambda label, v: checks.seconds(label, v, positive=positive, allow_inf=allow_inf)


def whole(minimum: int, maximum: int, what: str = "", least: Optional[str] = None) -> Callable[[str, Any], int]:
    """A check: a whole number (:func:`peercache.checks.integer`)."""
    return lambda label, v: checks.integer(label, v, minimum=minimum, maximum=maximum, what=what, least=least)


def byte_text(minimum: int = 0) -> Callable[[str, Any], int]:
    """A parse: a byte count written as a number or as text ('4GiB', '512M')."""
    return lambda label, v: checks.byte_size(label, v, minimum=minimum)


def _pool_bytes(label: str, v: Any) -> int:
    return checks.fits_memory(label, checks.integer(label, v, minimum=0, maximum=checks.MAX_BYTES))


def _tcp_poll_us(label: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{label} must be a whole number of µs, got {v!r}")
    try:
        return poll_us_setting(v)
    except TransportError as e:
        raise ConfigError(str(e)) from None


def _secret(label: str, v: Any) -> bytes:
    if not isinstance(v, (str, bytes)) or not v:
        raise ConfigError(f"{label} is not a non-empty string (the cluster secret)")
    return check_secret(v.encode() if isinstance(v, str) else v, label)


def _metrics_addr(label: str, v: Any) -> str:
    """HOST:PORT to serve the metrics on (port 0: any free port)."""
    try:
        a = Address.parse(v)
        ok = bool(a.port <= 65535 and "://" not in v and checks.host(label, a.host))
    except (ValueError, ConfigError):
        ok = False
    if not ok:
        raise ConfigError(f"{label} {v!r} is not HOST:PORT for the metrics endpoint; give e.g. 127.0.0.1:9464 "
                          "(127.0.0.1: read from this machine only; port 0: any free port)")
    return v


def path(label: str, v: Any) -> str:
    """A check: a file path (a non-empty string)."""
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{label}: {v!r} is not a file path")
    return v


@dataclass(frozen=True)
class NodeConfig:
    """The options of one node; defaults are :class:`~peercache.node.Node`'s own."""

    discovery_addr: str = option(
        "127.0.0.1:31998", "HOST:PORT of discovery, the embedded directory", check=checks.host_port,
        flag=Flag("--discovery-addr", help="HOST:PORT of discovery (serve binds it; drive connects to it)"),
        key="discovery_addr")
    directory: Optional[str] = option(
        None, "where the directory lives: HOST:PORT = the embedded one (the same as --discovery-addr), or "
              "redis://[USER:PASSWORD@]HOST:PORT/DB / rediss://... (Redis or Redis Cluster) / "
              f"{SENTINEL_FORM} (the master Redis Sentinel names); the password also from "
              f"${PASSWORD_ENV}", check=_directory,
        flag=Flag("--directory", metavar="SPEC", shown="the embedded directory at --discovery-addr"),
        key="directory")
    protocol: str = option(
        "tcp", "data transport", check=choice(*PROTOCOLS), flag=Flag("--protocol", choices=PROTOCOLS),
        key="protocol")
    devices: tuple = option(
        (), "comma-separated RDMA devices, one rail each (rdma)", check=_devices,
        flag=Flag("--devices", default=None), key="devices")
    ib_port: int = option(
        1, "RDMA port of each device (rdma)", check=whole(1, 255, " (a port of the RDMA device)"),
        flag=Flag("--ib-port"), key="ib_port")
    gid_index: Optional[int] = option(
        None, "GID table index (rdma; RoCE v2 IPv4 entry found automatically when omitted)",
        check=whole(0, 255, " (an entry of the GID table)"), flag=Flag("--gid-index"), key="gid_index")
    tcp_poll_us: Optional[int] = option(
        None, "tcp: poll this long before sleeping, a consumer for each reply and the data server for the "
              "next request after serving one (0: sleep at once; each backs off against slow peers)", unit="µs",
        check=_tcp_poll_us,
        flag=Flag("--tcp-poll-us", metavar="US", shown="$PEERCACHE_TCP_POLL_US, else 50"))
    pool_bytes: int = option(
        0, "memory of the pool this node publishes pages from (0: a reader that stores nothing)", unit="B",
        check=_pool_bytes, parse=byte_text(), key="pool_bytes")
    page_bytes: Optional[int] = option(
        None, "bytes per object: the payload of one pool slot", unit="B",
        check=whole(1, checks.MAX_BYTES, least="positive"), parse=byte_text(1),
        flag=Flag("--page-size", default=131072, help="bytes per object"), key="page_bytes")
    bind: str = option(
        "127.0.0.1", "address of the data endpoint", check=checks.host,
        flag=Flag("--bind", default=None, shown="host of --discovery-addr"), key="bind")
    host_discovery: bool = option(
        False, "this node hosts the embedded directory at discovery_addr", check=boolean, key="host_discovery")
    dir_cache_ttl: float = option(
        0.0, "seconds a looked-up location is reused (0 = off)", unit="s", check=seconds(),
        flag=Flag("--dir-cache-ttl"), key="dir_cache_ttl")
    max_channels: int = option(
        8, "data channels per peer", check=whole(1, checks.MAX_CHANNELS, least="positive"),
        flag=Flag("--max-channels"), key="max_channels")
    timeout: float = option(
        DEFAULT_TIMEOUTS.directory_s, "seconds a directory request, or a whole read, may take", unit="s",
        check=seconds(positive=True), key="timeout")
    heartbeat_interval: float = option(
        1.0, "seconds between heartbeats to the directory", unit="s", check=seconds(positive=True))
    heartbeat_timeout: float = option(
        DEFAULT_HEARTBEAT_TIMEOUT, "drop nodes silent for this long", unit="s", check=seconds(positive=True),
        flag=Flag("--heartbeat-timeout"))
    dir_table_entries: int = option(
        DEFAULT_ENTRIES, f"entries of the directory table drivers read one-sided (embedded directory only): "
                         f"about {TABLE_BYTES_PER_ENTRY:.0f} B of memory each, "
                         f"{DEFAULT_ENTRIES * TABLE_BYTES_PER_ENTRY / 2**20:.0f} MiB at the default, touched "
                         "as it fills (pinned whole under rdma); keys beyond it are answered by the lookup RPC; "
                         "0 = no table", unit="entries",
        check=whole(0, MAX_TABLE_ENTRIES, " (0 = no directory table)"), flag=Flag("--dir-table-entries"))
    auth_key: Optional[bytes] = option(
        None, "the cluster secret (never shown)", check=_secret, key="auth_key", repr=False)
    auth_key_file: Optional[str] = option(
        None, "file holding the cluster secret: only processes with the same secret can use the control plane",
        check=path, key="auth_key_file",
        flag=Flag("--auth-key-file", metavar="PATH", shown="$PEERCACHE_AUTH_KEY if set, else no authentication"))
    metrics_addr: Optional[str] = option(
        None, "HOST:PORT of this process's Prometheus endpoint (GET /metrics; port 0: any free port); off when "
              "unset. Loopback keeps it to this machine: another address logs who can then read the metrics",
        check=_metrics_addr, flag=Flag("--metrics-addr", metavar="HOST:PORT", shown="off"), key="metrics_addr")
    integrity: bool = option(
        False, "write a checksum (XXH3-64) of each page in its slot header, and check it before a read "
               "counts as a hit (a mismatch is a miss and a counter)", check=boolean,
        flag=Flag("--integrity", shown="off", help="serve: write a checksum (XXH3-64) of each page in its slot "
                  "header; drive: check it before a read counts as a hit (a mismatch is a miss and a counter)"),
        key="integrity")
    #: the engine's other time bounds (:mod:`peercache.timeouts`); not a flag nor a key: ``timeout`` above
    #: is the one a user sets
    timeouts: Timeouts = DEFAULT_TIMEOUTS

    @classmethod
    def options(cls) -> dict[str, Option]:
        """This class's options by field name (see :func:`options`)."""
        return options(cls)

    @classmethod
    def check(cls, name: str, value: Any, label: Optional[str] = None) -> Any:
        """``value`` of option ``name`` checked; ConfigError naming ``label`` (default: its flag, else its key)."""
        o = cls.options()[name]
        if label is None:
            label = o.flag.name if o.flag else extra_label(o.key or name)
        return o.value(label, value)

    @classmethod
    def of(cls, base: "NodeConfig | str | None", keywords: dict[str, Any], *, who: str,
           spellings: Optional[dict[str, str]] = None) -> "NodeConfig":
        """``base`` (a config, a discovery address, or None: the defaults) with ``keywords`` set: the
        keyword form of ``Node`` and ``Client``, whose defaults are this class's. ``spellings`` maps a
        keyword ``who`` spells its own way to the field (``bind_host`` -> ``bind``); a field's own name
        is taken too. A keyword of None leaves a field whose default is not None as it is; an unknown
        keyword is a TypeError naming it, as Python's own."""
        spellings = spellings or {}
        if isinstance(base, cls):
            config = base
        elif base is None or isinstance(base, str):
            config = cls() if base is None else cls(discovery_addr=base)
        else:
            raise TypeError(f"{who}() takes a NodeConfig or a discovery address (HOST:PORT or a redis:// URL) "
                            f"first, got {type(base).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        for key, value in keywords.items():
            name = spellings.get(key, key)
            if name not in fields:
                raise TypeError(f"{who}.__init__() got an unexpected keyword argument {key!r}")
            if name in kw:
                raise TypeError(f"{who}.__init__() got {name!r} twice (as {key!r} too); give one of them")
            if value is None and fields[name].default is not None:
                continue
            kw[name] = value
        return dataclasses.replace(config, **kw) if kw else config

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> "NodeConfig":
        """The options among parsed flags ``args``, each checked (ConfigError names the flag); ``fields``
        set more (unchecked); options without a flag there keep their defaults."""
        return cls(**{**checked(cls.options(), args), **fields})

    @classmethod
    def from_extra(cls, extra: Optional[dict], *, ignore: Iterable[str] = ()) -> "NodeConfig":
        """Validate ``extra`` (HiCache's extra config, keys of :meth:`options`; ``ignore``: keys read by
        others); ConfigError names the key. A null value of an optional option means its default."""
        extra = dict(extra or {})
        ignore = list(ignore)
        by_key = {o.key: o for o in cls.options().values() if o.key}
        unknown = sorted(set(extra) - set(by_key) - set(ignore))
        if unknown:
            raise ConfigError(f"extra config {unknown[0]!r} is not a PeerCacheStore setting; known: "
                              f"{sorted(by_key)}" + (f" (and SGLang's {ignore})" if ignore else ""))
        kw: dict[str, Any] = {}
        for key, o in by_key.items():
            if key in extra and not (extra[key] is None and o.optional):
                kw[o.name] = o.value(extra_label(key), extra[key], parse=True)
        if "auth_key" in kw and "auth_key_file" in kw:
            raise ConfigError("extra config 'auth_key' and 'auth_key_file' are both set; give one of them")
        if "auth_key_file" in kw:
            kw["auth_key"] = load_secret(kw["auth_key_file"], option=extra_label("auth_key_file"))
        if kw.get("devices") and kw.get("protocol", cls.options()["protocol"].default) != "rdma":
            raise ConfigError("extra config 'devices' is set but 'protocol' is not \"rdma\"; devices are RDMA "
                              "rails: set protocol to rdma or drop devices")
        return cls(**kw)

    def pool_slots(self, page_bytes: int) -> int:
        """Slots of ``page_bytes`` objects in ``pool_bytes`` (each with its tag)."""
        return self.pool_bytes // tags.slot_stride(page_bytes) if self.pool_bytes and page_bytes else 0

    def transport_options(self) -> dict:
        """Options of the transport named by ``protocol`` (rdma: devices, port, GID index; tcp: poll time)."""
        if self.protocol == "rdma":
            return {"devices": list(self.devices), "ib_port": self.ib_port, "gid_index": self.gid_index}
        if self.protocol == "tcp" and self.tcp_poll_us is not None:
            return {"poll_us": self.tcp_poll_us}
        return {}

    def secret(self) -> Optional[bytes]:
        """The cluster secret: ``auth_key``, else the one in ``auth_key_file``; None: the node takes
        $PEERCACHE_AUTH_KEY's, if any."""
        if self.auth_key is not None or not self.auth_key_file:
            return self.auth_key
        return load_secret(self.auth_key_file)

    def node_kwargs(self, *, page_bytes: Optional[int] = None, name: Optional[str] = None,
                    pool_slots: Optional[int] = None, transport_options: Optional[dict] = None) -> dict[str, Any]:
        """The arguments of ``Node(**kwargs)`` for this config (``discovery_addr`` among them): a pool of
        ``pool_bytes`` in slots of ``page_bytes`` (default: the option's), or of ``pool_slots`` slots when
        given; ``name`` the node's; ``transport_options`` added to the config's own (a bench's timeouts)."""
        page = self.page_bytes if page_bytes is None else page_bytes
        slots = self.pool_slots(page or 0) if pool_slots is None else pool_slots
        return dict(discovery_addr=self.discovery_addr, protocol=self.protocol, bind_host=self.bind,
                    host_discovery=self.host_discovery, pool_slots=slots,
                    slot_capacity=page or 0, max_channels=self.max_channels, dir_cache_ttl=self.dir_cache_ttl,
                    heartbeat_interval=self.heartbeat_interval, heartbeat_timeout=self.heartbeat_timeout,
                    rpc_timeout=self.timeout, name=name,
                    transport_options={**self.transport_options(), **(transport_options or {})},
                    auth_key=self.secret(), integrity=self.integrity, directory=self.directory,
                    dir_table_entries=self.dir_table_entries, timeouts=self.timeouts)

    def extra_config(self) -> dict[str, Any]:
        """This config as HiCache's extra config (what :meth:`from_extra` reads back): each option that has
        a key and a value; the devices only under rdma, the secret's file only when the secret is not given."""
        out: dict[str, Any] = {}
        for name, o in type(self).options().items():
            v = getattr(self, name)
            if o.key is not None and v is not None:
                out[o.key] = list(v) if isinstance(v, tuple) else v
        if self.protocol != "rdma" or not self.devices:
            out.pop("devices", None)
        if self.auth_key is not None:
            out.pop("auth_key_file", None)
        return out
