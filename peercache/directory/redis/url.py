"""A Redis directory URL, parsed without connecting (and without importing redis-py).

``redis://[USER:PASSWORD@]HOST:PORT/DB``, ``rediss://...`` (TLS; ``?ssl_cert_reqs=none``
for a self-signed server), ``?prefix=NAME`` and ``?cluster=yes|no``; without a password
in the URL, ``$PEERCACHE_REDIS_PASSWORD`` is used when set.
"""
from __future__ import annotations

import functools
import os
import re
import urllib.parse
from dataclasses import dataclass, field

from ...address import join
from ...errors import ConfigError
from ...redact import redact, remember

#: Environment variable holding the Redis password when the URL has none.
PASSWORD_ENV = "PEERCACHE_REDIS_PASSWORD"
_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,32}")
REDIS_SCHEMES = ("redis://", "rediss://")


def is_redis(spec: str | None) -> bool:
    """Whether ``spec`` names the Redis backend (redis:// or rediss://)."""
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

    @property
    def safe(self) -> str:
        """The URL with its password masked (for messages and logs)."""
        auth = ""
        if self.username or self.password:
            quote = functools.partial(urllib.parse.quote, safe="")
            auth = f"{quote(self.username or '')}{':' + quote(self.password) if self.password else ''}@"
        return redact(f"{'rediss' if self.ssl else 'redis'}://{auth}{join(self.host, self.port)}/{self.db}")


def parse_url(url: str, env: dict | None = None) -> RedisURL:
    """``redis://[USER:PASSWORD@]HOST:PORT/DB[?prefix=..&cluster=..]`` -> :class:`RedisURL`, or ConfigError."""
    env = os.environ if env is None else env
    what = f"--directory {redact(url)!r}"
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
    prefix = query.get("prefix", ["pc"])[-1]
    if not _PREFIX.fullmatch(prefix):
        raise ConfigError(f"{what}: prefix {prefix!r} must be 1-32 of A-Z a-z 0-9 _ . -")
    cluster = None
    if "cluster" in query:
        v = query["cluster"][-1].lower()
        if v not in ("yes", "no", "1", "0", "true", "false"):
            raise ConfigError(f"{what}: cluster={v!r}; use cluster=yes or cluster=no")
        cluster = v in ("yes", "1", "true")
    db = int(path or 0)
    if cluster and db:
        raise ConfigError(f"{what}: a Redis Cluster has only database 0")
    password = urllib.parse.unquote(u.password) if u.password is not None else None
    password = password or env.get(PASSWORD_ENV) or None
    remember(password)
    ssl_options = {}
    if "ssl_cert_reqs" in query:
        ssl_options["ssl_cert_reqs"] = query["ssl_cert_reqs"][-1]
    if "ssl_ca_certs" in query:
        ssl_options["ssl_ca_certs"] = query["ssl_ca_certs"][-1]
    return RedisURL(url, u.hostname, port, db, urllib.parse.unquote(u.username) if u.username else None,
                    password, u.scheme.lower() == "rediss", prefix, cluster, ssl_options)
