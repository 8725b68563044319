"""peercache.address: HOST:PORT parsed, split and written in one place, and is_loopback (issue 37, item 1)."""
import pytest

from peercache import address as A
from peercache.address import Address, host_of, is_loopback, join, split


@pytest.mark.parametrize("text, host, port", [
    ("127.0.0.1:31998", "127.0.0.1", 31998),
    ("0.0.0.0:0", "0.0.0.0", 0),                      # port 0 is the caller's to refuse (a listener takes it)
    ("localhost:80", "localhost", 80),
    ("my-host.example.org:6379", "my-host.example.org", 6379),
    ("[::1]:9464", "::1", 9464),
    ("[::]:31998", "::", 31998),
    ("[fe80::1%eth0]:7000", "fe80::1%eth0", 7000),
    ("[::ffff:198.18.0.1]:5", "::ffff:198.18.0.1", 5),
    ("::1:80", "::1", 80),                            # unbracketed IPv6: split at the last colon, as always
    ("h:99999", "h", 99999),                          # no range check here (checks.host_port has it)
    ("h:0080", "h", 80),
])
def test_parse(text, host, port):
    a = Address.parse(text)
    assert (a.host, a.port) == (host, port)


@pytest.mark.parametrize("text, why", [
    ("127.0.0.1", "no port"),
    ("", "no port"),
    ("127.0.0.1:", "not a number"),
    ("127.0.0.1:http", "not a number"),
    ("127.0.0.1:-1", "not a number"),
    ("127.0.0.1:8 0", "not a number"),
    ("h:\u0663", "not a number"),                    # a non-ASCII digit
    (":80", "no host"),
    ("[]:80", "brackets"),
    ("[::1:80", "brackets"),
    ("[my-host]:80", "brackets"),
    ("::1]:80", "stray bracket"),
    ("[[::1]]:80", "brackets"),
])
def test_parse_refuses(text, why):
    with pytest.raises(ValueError, match=why):
        Address.parse(text)


def test_parse_refuses_what_is_not_text():
    for v in (None, 31998, b"127.0.0.1:1"):
        with pytest.raises(ValueError):
            Address.parse(v)


@pytest.mark.parametrize("text", ["127.0.0.1:31998", "[::1]:9464", "localhost:1", "[fe80::1%eth0]:7000",
                                  "0.0.0.0:0"])
def test_format_round_trips(text):
    assert str(Address.parse(text)) == text


def test_join_brackets_an_ipv6_host_only():
    assert join("::1", 80) == "[::1]:80"
    assert join("10.1.2.3", 7000) == "10.1.2.3:7000"
    assert join("redis.local", "6379") == "redis.local:6379"
    assert join("fe80::1", 7000) == "[fe80::1]:7000"
    assert str(Address("::", 1)) == "[::]:1"


def test_split_checks_nothing():
    assert split("[::1]:9464") == ("::1", "9464")
    assert split("127.0.0.53%lo:53") == ("127.0.0.53%lo", "53")
    assert split("*:22") == ("*", "22")
    assert split("nohost") == ("", "nohost")
    assert split("h:") == ("h", "")
    assert split("tcp://[::1]:1234")[1] == "1234"        # a ZeroMQ endpoint's port (RpcServer.port)


def test_host_of_url_or_host_port():
    assert host_of("tcp://[::1]:31998") == "::1"
    assert host_of("tcp://10.0.0.1:31998") == "10.0.0.1"
    assert host_of("[::1]:31998") == "::1"
    assert host_of("myhost:1") == "myhost"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.5", "127.255.255.254", "::1", "[::1]"])
def test_loopback(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "", "*", "10.1.2.3", "198.18.0.1", "myhost",
                                  "localhost.example.org", "LOCALHOST2", "fe80::1", "::ffff:10.0.0.1"])
def test_not_loopback(host):
    assert not is_loopback(host)


def test_address_is_loopback():
    assert Address.parse("[::1]:1").is_loopback and Address.parse("127.0.0.1:1").is_loopback
    assert not Address.parse("0.0.0.0:1").is_loopback and not Address.parse("myhost:1").is_loopback


def test_one_is_loopback_for_engine_and_lab():
    from peercache import auth
    from peercache.bench.drive import supervisor
    from peercache.lab import jupyter
    from peercache.metrics import endpoint
    assert auth.is_loopback is jupyter.is_loopback is endpoint.is_loopback is supervisor.is_loopback is A.is_loopback


def test_callers_keep_their_rules_and_messages():
    from peercache import checks, rpc
    from peercache.errors import ConfigError, PeerCacheError
    from peercache.metrics import for_process
    assert checks.host_port("--x", "[::1]:31998") == "[::1]:31998"
    assert checks.host_port("--x", "::1:31998") == "::1:31998"          # unbracketed IPv6, as before
    with pytest.raises(ConfigError, match=r"port 0 is outside 1\.\.65535"):
        checks.host_port("--x", "127.0.0.1:0")
    with pytest.raises(ConfigError, match=r"port 70000 is outside 1\.\.65535"):
        checks.host_port("--x", "127.0.0.1:70000")
    for bad in ("127.0.0.1", "[my-host]:1", "[::1:1", "h:x", ":1", "a b:1"):
        with pytest.raises(ConfigError, match="is not HOST:PORT"):
            checks.host_port("--x", bad)
    assert rpc.endpoint("[::1]:5") == "tcp://[::1]:5" and rpc.endpoint("*:0") == "tcp://*:0"
    assert rpc.endpoint("tcp://h:1") == "tcp://h:1"
    with pytest.raises(PeerCacheError, match="is not HOST:PORT"):
        rpc.endpoint("localhost")
    assert for_process("[::1]:9464", 2, 4) == "[::1]:9466" and for_process("0.0.0.0:0", 3, 4) == "0.0.0.0:0"
    assert for_process("127.0.0.1:9464", 1, 2) == "127.0.0.1:9465"


def test_ss_listeners_with_bracketed_hosts():
    from peercache.lab.launch.hosts import listening_on
    out = ("LISTEN 0 128 [::ffff:0.0.0.0]:7000 [::]:*\n"
           "LISTEN 0 128 [fe80::1%eth0]:7001 [::]:*\n"
           "LISTEN 0 128 [::]:7002 [::]:*\n"
           "LISTEN 0 128 [::1]:7003 [::]:*\n")
    assert listening_on(out, "10.0.0.1", 7000) and listening_on(out, "10.0.0.1", 7002)
    assert listening_on(out, "fe80::1", 7001) and not listening_on(out, "10.0.0.1", 7001)
    assert listening_on(out, "::1", 7003) and not listening_on(out, "127.0.0.1", 7003)


def test_same_endpoint():
    from peercache.node.peers import same_endpoint
    assert same_endpoint("0.0.0.0:31998", "10.0.0.1:31998") and same_endpoint("[::]:1", "[::1]:1")
    assert same_endpoint("[::1]:1", "[::1]:1") and not same_endpoint("[::1]:1", "[::1]:2")
    assert not same_endpoint("10.0.0.2:1", "10.0.0.1:1") and not same_endpoint("", "")
