"""peercache.directory.redis.url: the redis:// / rediss:// URL, parsed without importing redis-py."""
from __future__ import annotations

import subprocess
import sys

import pytest

from peercache.directory.redis.url import PASSWORD_ENV, SENTINEL_DEFAULT_PORT, SENTINEL_FORM, is_redis, parse_url
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


# --- redis+sentinel:// ------------------------------------------------------------------------------

def test_sentinel_url_forms():
    u = parse_url("redis+sentinel://:pw-in-the-url@10.0.0.1:26380,[::1]:26381,sentinel-c/mymaster/2?prefix=lab",
                  env={})
    assert u.sentinels == (("10.0.0.1", 26380), ("::1", 26381), ("sentinel-c", SENTINEL_DEFAULT_PORT))
    assert (u.service, u.db, u.password, u.username, u.prefix, u.cluster, u.ssl, u.sentinel_auth) == (
        "mymaster", 2, "pw-in-the-url", None, "lab", False, False, False)
    assert (u.host, u.port) == ("10.0.0.1", 26380)          # the first sentinel
    assert u.safe == "redis+sentinel://:***@10.0.0.1:26380,[::1]:26381,sentinel-c:26379/mymaster/2"
    assert "pw-in-the-url" not in repr(u)
    u = parse_url("REDIS+SENTINEL://h:1/m/", env={PASSWORD_ENV: "fromenv"})
    assert (u.service, u.db, u.password, u.safe) == ("m", 0, "fromenv", "redis+sentinel://:***@h:1/m/0")
    u = parse_url("redis+sentinel://alice:pw@h:1/m?sentinel_auth=yes", env={})
    assert (u.username, u.password, u.sentinel_auth) == ("alice", "pw", True)
    assert is_redis("redis+sentinel://h:1/m") and is_redis("Redis+Sentinel://h:1/m")


#: (URL, what the error says): the URL's shape wrong (the error shows the form), then its parameters.
BAD_SENTINEL_SHAPES = [
    ("redis+sentinel://h:1", "names no service"),
    ("redis+sentinel://h:1/", "names no service"),
    ("redis+sentinel:///m", "names no sentinel"),
    ("redis+sentinel://:pw@/m", "names no sentinel"),
    ("redis+sentinel://h:x/m", "port 'x' is not a number"),
    ("redis+sentinel://h:0/m", "outside 1-65535"),
    ("redis+sentinel://h:70000/m", "outside 1-65535"),
    ("redis+sentinel://h:1,,h:2/m", "an empty HOST:PORT"),
    ("redis+sentinel://[::1/m", "is not HOST:PORT"),
    ("redis+sentinel://h:1/my master", "is not a sentinel master name"),
    ("redis+sentinel://h:1/m/zero", "database 'zero' is not a number"),
    ("redis+sentinel://h:1/m/1/2", "more than a database number"),
]
BAD_SENTINEL_PARAMETERS = [
    ("redis+sentinel://h:1/m?cluster=yes", "?cluster does not apply"),
    ("redis+sentinel://h:1/m?ssl_cert_reqs=none", "TLS is not supported with Sentinel"),
    ("redis+sentinel://h:1/m?colour=red", "unknown parameter"),
    ("redis+sentinel://h:1/m?prefix=a{b}", "prefix"),
    ("redis+sentinel://h:1/m?sentinel_auth=maybe", "use sentinel_auth=yes"),
    ("redis+sentinel://h:1/m?sentinel_auth=yes", "no password"),
]


@pytest.mark.parametrize("url, message", BAD_SENTINEL_SHAPES + BAD_SENTINEL_PARAMETERS)
def test_bad_sentinel_urls_say_what_was_wrong_and_what_to_write(url, message):
    with pytest.raises(ConfigError, match="--directory") as e:
        parse_url(url, env={})
    assert message in str(e.value)
    if (url, message) in BAD_SENTINEL_SHAPES:
        assert SENTINEL_FORM in str(e.value), str(e.value)


def test_a_bad_sentinel_url_keeps_its_password_out_of_the_error():
    with pytest.raises(ConfigError) as e:
        parse_url("redis+sentinel://:hunter2-sekrit@h:1/m/zero", env={})
    assert "hunter2-sekrit" not in str(e.value) and "redis+sentinel://:***@h:1/m/zero" in str(e.value)


def test_every_surface_takes_the_sentinel_form():
    """The node's config (library, HiCache extra config) and the bench's --directory check it the same way."""
    from peercache import hicache
    from peercache.bench import cli, dirbench, growth, options
    from peercache.config import NodeConfig
    url = "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/0"
    assert NodeConfig.of(None, {"directory": url}, who="t").directory == url
    assert hicache.StoreConfig.from_extra({"directory": url}).directory == url
    with pytest.raises(ConfigError, match="extra config 'directory'.*names no service"):
        hicache.StoreConfig.from_extra({"directory": "redis+sentinel://127.0.0.1:26379"})
    assert dirbench.backend_of(url) == "redis"
    a = growth.build_parser().parse_args(["--curve", "directory", "--directory", "redis+sentinel://:pw-x1y2z3@h:1/m"])
    with pytest.raises(ConfigError, match="give the master's redis://HOST:PORT/DB") as e:
        growth.validate(a)
    assert "pw-x1y2z3" not in str(e.value)
    for sub in ("serve", "drive", "meta"):
        args = cli.build_parser().parse_args([sub, "--directory", url])
        options.check_directory(args)
        assert options.directory(args) == url
        with pytest.raises(ConfigError, match="--directory.*database '0x' is not a number"):
            options.check_directory(cli.build_parser().parse_args([sub, "--directory", url + "x"]))
