"""A Redis directory URL, parsed without connecting (and without importing redis-py).

``redis://[USER:PASSWORD@]HOST:PORT/DB``, ``rediss://...`` (TLS; ``?ssl_cert_reqs=none``
for a self-signed server), ``?prefix=NAME`` and ``?cluster=yes|no``; without a password
in the URL, ``$PEERCACHE_REDIS_PASSWORD`` is used when set.

``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` names a Redis that
Redis Sentinel keeps highly available: the sentinels at the HOST:PORTs (26379 when a port is left
out) are asked which server is the master of SERVICE, and asked again after a failover. The
password is the master's and its replicas' (``sentinel auth-pass``); the sentinels are asked
without one unless ``?sentinel_auth=yes`` (sentinels whose ``requirepass`` is that same password).
``?prefix=NAME`` as above; ``?cluster`` and the TLS options do not apply.
"""
from __future__ import annotations

import functools
import os
import re
import urllib.parse
from dataclasses import dataclass, field

from ...address import Address, join
from ...errors import ConfigError
from ...redact import redact, remember

#: Environment variable holding the Redis password when the URL has none.
PASSWORD_ENV = "PEERCACHE_REDIS_PASSWORD"
_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,32}")
#: A Sentinel-managed Redis: the sentinels' addresses, then the master's service name.
SENTINEL_SCHEME = "redis+sentinel://"
REDIS_SCHEMES = ("redis://", "rediss://", SENTINEL_SCHEME)
#: A sentinel's port when a HOST of a redis+sentinel:// URL has none (Redis Sentinel's own default).
SENTINEL_DEFAULT_PORT = 26379
#: The form of a Sentinel URL, for messages.
SENTINEL_FORM = "redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]"
_SENTINEL_EXAMPLE = "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0"
#: Every form a Redis directory spec takes, for messages (one place: every "use ..." says the same).
FORMS = f"redis://HOST:PORT/DB, rediss://HOST:PORT/DB or {SENTINEL_FORM}"
# A sentinel's service (master) name: what `sentinel monitor` takes, short of spaces and URL syntax.
_SERVICE = re.compile(r"[^\s/?#@,]{1,128}")
#: How a yes/no URL parameter (``?cluster=``, ``?sentinel_auth=``) may be spelt.
_YES_NO = {"yes": True, "1": True, "true": True, "no": False, "0": False, "false": False}


def is_redis(spec: str | None) -> bool:
    """Whether ``spec`` names the Redis backend (redis://, rediss:// or redis+sentinel://)."""
    return isinstance(spec, str) and spec.lower().startswith(REDIS_SCHEMES)


@dataclass(frozen=True)
class RedisURL:
    """A parsed ``--directory redis://...`` (pure: nothing connects here)."""

    url: str = field(repr=False)   # may hold the password
    host: str
    port: int
    db: int
    username: str | None
    password: str | None = field(repr=False)
    ssl: bool
    prefix: str
    cluster: bool | None
    ssl_options: dict = field(default_factory=dict)
    #: redis+sentinel:// only: the sentinels' (host, port), in the URL's order (``host``/``port`` are the first's)
    sentinels: tuple = ()
    #: redis+sentinel:// only: the name the sentinels monitor the master under
    service: str | None = None
    #: redis+sentinel:// only: whether the sentinels are sent the password too (``?sentinel_auth=yes``)
    sentinel_auth: bool = False

    @property
    def safe(self) -> str:
        """The URL with its password masked (for messages and logs)."""
        auth = ""
        if self.username or self.password:
            quote = functools.partial(urllib.parse.quote, safe="")
            auth = f"{quote(self.username or '')}{':' + quote(self.password) if self.password else ''}@"
        if self.sentinels:
            hosts = ",".join(join(h, p) for h, p in self.sentinels)
            return redact(f"{SENTINEL_SCHEME}{auth}{hosts}/{urllib.parse.quote(self.service, safe='')}/{self.db}")
        return redact(f"{'rediss' if self.ssl else 'redis'}://{auth}{join(self.host, self.port)}/{self.db}")


def parse_url(url: str, env: dict | None = None) -> RedisURL:
    """``redis://[USER:PASSWORD@]HOST:PORT/DB[?prefix=..&cluster=..]`` -> :class:`RedisURL`, or ConfigError."""
    env = os.environ if env is None else env
    what = f"--directory {redact(url)!r}"
    if url.lower().startswith(SENTINEL_SCHEME):
        return _parse_sentinel(url, env, what)
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port or 6379
    except ValueError as e:
        raise ConfigError(f"{what} is not a Redis URL ({e}); use redis://HOST:PORT/DB") from None
    if u.scheme.lower() not in ("redis", "rediss"):
        raise ConfigError(f"{what}: scheme {u.scheme!r} is not redis or rediss")
    if not u.hostname:
        raise ConfigError(f"{what} names no host; use redis://HOST:PORT/DB (for example redis://127.0.0.1:6379/0)")
    path = u.path.strip("/")
    if path and not path.isdigit():
        raise ConfigError(f"{what}: database {path!r} is not a number; use redis://HOST:PORT/DB")
    query = urllib.parse.parse_qs(u.query)
    known = {"prefix", "cluster", "ssl_cert_reqs", "ssl_ca_certs"}
    unknown = sorted(set(query) - known)
    if unknown:
        raise ConfigError(f"{what}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    prefix = _prefix(query, what)
    cluster = None
    if "cluster" in query:
        v = query["cluster"][-1].lower()
        if v not in _YES_NO:
            raise ConfigError(f"{what}: cluster={v!r}; use cluster=yes or cluster=no")
        cluster = _YES_NO[v]
    db = int(path or 0)
    if cluster and db:
        raise ConfigError(f"{what}: a Redis Cluster has only database 0")
    password = _password(u.password, env)
    ssl_options = {}
    if "ssl_cert_reqs" in query:
        ssl_options["ssl_cert_reqs"] = query["ssl_cert_reqs"][-1]
    if "ssl_ca_certs" in query:
        ssl_options["ssl_ca_certs"] = query["ssl_ca_certs"][-1]
    return RedisURL(url, u.hostname, port, db, urllib.parse.unquote(u.username) if u.username else None,
                    password, u.scheme.lower() == "rediss", prefix, cluster, ssl_options)


def _prefix(query: dict, what: str) -> str:
    """The ``?prefix=`` of a parsed query (default ``pc``), checked."""
    prefix = query.get("prefix", ["pc"])[-1]
    if not _PREFIX.fullmatch(prefix):
        raise ConfigError(f"{what}: prefix {prefix!r} must be 1-32 of A-Z a-z 0-9 _ . -")
    return prefix


def _password(quoted: str | None, env) -> str | None:
    """The URL's password (percent-decoded), else ``$PEERCACHE_REDIS_PASSWORD``, else None; remembered
    for redaction wherever it is printed from now on."""
    password = urllib.parse.unquote(quoted) if quoted is not None else None
    password = password or env.get(PASSWORD_ENV) or None
    remember(password)
    return password


def _parse_sentinel(url: str, env, what: str) -> RedisURL:
    """``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB][?prefix=..&sentinel_auth=..]``
    -> :class:`RedisURL` with ``sentinels`` and ``service`` set, or ConfigError saying what was wrong."""
    use = f"use {SENTINEL_FORM} (for example {_SENTINEL_EXAMPLE})"
    rest, _, query_text = url[len(SENTINEL_SCHEME):].partition("?")
    rest = rest.split("#", 1)[0]
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None     # a lone USER@ is a user, as in redis://
        password = pw if colon else None
    if not hosts:
        raise ConfigError(f"{what} names no sentinel; {use}")
    sentinels = []
    for item in hosts.split(","):
        if not item:
            raise ConfigError(f"{what}: an empty HOST:PORT in the sentinels' list {hosts!r}; {use}")
        if ":" not in item or item.endswith("]"):
            item = join(item.strip("[]"), SENTINEL_DEFAULT_PORT)
        try:
            a = Address.parse(item)
        except ValueError as e:
            raise ConfigError(f"{what}: sentinel {item!r} is not HOST:PORT ({e}); {use}") from None
        if not 1 <= a.port <= 65535:
            raise ConfigError(f"{what}: sentinel {item!r} has port {a.port}, outside 1-65535; {use}")
        sentinels.append((a.host, a.port))
    parts = path.split("/")
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()                             # a trailing slash
    service = urllib.parse.unquote(parts[0]) if parts else ""
    if not service:
        raise ConfigError(f"{what} names no service (the name the sentinels monitor the master under, "
                          f"as in `sentinel monitor NAME ...`); {use}")
    if not _SERVICE.fullmatch(service):
        raise ConfigError(f"{what}: service {service!r} is not a sentinel master name (1-128 characters, "
                          f"no spaces or / ? # @ ,); {use}")
    if len(parts) > 2:
        raise ConfigError(f"{what}: {'/'.join(parts[1:])!r} after the service is more than a database "
                          f"number; {use}")
    db_text = parts[1] if len(parts) == 2 else "0"
    if not db_text.isdigit():
        raise ConfigError(f"{what}: database {db_text!r} is not a number; {use}")
    query = urllib.parse.parse_qs(query_text, keep_blank_values=True)
    known = {"prefix", "sentinel_auth"}
    if "cluster" in query:
        raise ConfigError(f"{what}: ?cluster does not apply: the sentinels name one master, not a Redis "
                          "Cluster; drop it (a Redis Cluster fails over by itself: use redis://HOST:PORT/0)")
    if {"ssl_cert_reqs", "ssl_ca_certs"} & set(query):
        raise ConfigError(f"{what}: TLS is not supported with Sentinel here; drop the ssl options, or "
                          "use rediss://HOST:PORT/DB to the master itself")
    unknown = sorted(set(query) - known)
    if unknown:
        raise ConfigError(f"{what}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    auth_text = query.get("sentinel_auth", ["no"])[-1].lower()
    if auth_text not in _YES_NO:
        raise ConfigError(f"{what}: sentinel_auth={auth_text!r}; use sentinel_auth=yes (the sentinels "
                          "have the same requirepass) or sentinel_auth=no (the default: they have none)")
    sentinel_auth = _YES_NO[auth_text]
    password = _password(password, env)
    if sentinel_auth and not password:
        raise ConfigError(f"{what}: sentinel_auth=yes but no password, in the URL or in ${PASSWORD_ENV}; "
                          "give one (redis+sentinel://:PASSWORD@...) or drop sentinel_auth")
    host, port = sentinels[0]
    return RedisURL(url, host, port, int(db_text), username, password, False, _prefix(query, what), False,
                    sentinels=tuple(sentinels), service=service, sentinel_auth=sentinel_auth)
