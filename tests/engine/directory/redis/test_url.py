"""peercache.directory.redis.url: the redis:// / rediss:// URL, parsed without importing redis-py."""
from __future__ import annotations

import subprocess
import sys

import pytest

from peercache.directory.redis.url import PASSWORD_ENV, is_redis, parse_url
from peercache.errors import ConfigError

def test_url_forms_and_password_sources():
    u = parse_url("redis://127.0.0.1:6390/3", env={})
    assert (u.host, u.port, u.db, u.password, u.ssl, u.prefix, u.cluster) == ("127.0.0.1", 6390, 3, None,
                                                                              False, "pc", None)
    u = parse_url("rediss://alice:p%40ss@cache.example:7000/0?prefix=lab1&cluster=no", env={})
    assert (u.username, u.password, u.ssl, u.prefix, u.cluster) == ("alice", "p@ss", True, "lab1", False)
    assert "p@ss" not in u.safe and "***" in u.safe and u.safe.startswith("rediss://alice:***@")
    assert parse_url("redis://h:1/0", env={PASSWORD_ENV: "fromenv"}).password == "fromenv"
    assert parse_url("redis://:inurl@h:1/0", env={PASSWORD_ENV: "fromenv"}).password == "inurl"
    assert parse_url("redis://h", env={}).port == 6379
    assert is_redis("redis://x:1/0") and is_redis("REDISS://x:1/0") and not is_redis("127.0.0.1:31998")


@pytest.mark.parametrize("url, message", [
    ("redis://127.0.0.1:1/zero", "is not a number"),
    ("redis://:1/0", "names no host"),
    ("redis://h:1/0?colour=red", "unknown parameter"),
    ("redis://h:1/0?prefix=a{b}", "prefix"),
    ("redis://h:1/2?cluster=yes", "only database 0"),
    ("redis://h:99999/0", "Redis URL"),
])
def test_bad_urls_are_config_errors_that_say_what_to_write(url, message):
    with pytest.raises(ConfigError, match="--directory") as e:
        parse_url(url, env={})
    assert message in str(e.value)


def test_tls_options_and_the_repr_keep_the_password_out():
    u = parse_url("rediss://:hunter2@h:1/0?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem", env={})
    assert u.ssl_options == {"ssl_cert_reqs": "none", "ssl_ca_certs": "/etc/ca.pem"}
    assert "hunter2" not in repr(u) and "hunter2" not in u.safe
    assert parse_url("redis://h:1/0?cluster=yes", env={}).cluster is True
    assert parse_url("redis://h:1/0?cluster=0", env={}).cluster is False
    with pytest.raises(ConfigError, match="use cluster=yes or cluster=no"):
        parse_url("redis://h:1/0?cluster=maybe", env={})
    with pytest.raises(ConfigError, match="is not redis or rediss"):
        parse_url("http://h:1/0", env={})


def test_parsing_a_url_does_not_import_redis_py():
    """The config and the bench's options parse --directory before any backend loads: redis-py
    (and hiredis) come only with the backend itself."""
    code = ("import sys; from peercache.directory.redis.url import parse_url, is_redis; "
            "parse_url('redis://h:1/0', env={}); is_redis('redis://h:1/0'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'hiredis')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
