"""The library's surface: one native batch for get_batch(keys, outs), typed errors that name the fix,
stats(), __repr__, and a host that does not resolve."""
import inspect

import numpy as np
import pytest

import peercache
from peercache import errors
from peercache.errors import ConfigError, HostNotFound, InvalidArgument, PeerCacheError

PAGE = 4096


@pytest.fixture(params=["native", "transport"])
def cluster(request, port):
    addr = f"127.0.0.1:{port}"
    producer = peercache.Client(addr, host_discovery=True, pool_bytes=64 * 4160, page_size=PAGE, protocol="shm")
    consumer = peercache.Client(addr, dir_cache_ttl=30.0, page_size=PAGE, protocol="shm")
    if request.param == "transport":     # the read path of a transport without native handles
        consumer.node.reader.native = None
    yield addr, producer, consumer
    consumer.close()
    producer.close()


def _pages(n):
    return [bytes([i + 1]) * (100 + 37 * i) for i in range(n)]


def test_get_batch_with_outs_is_one_batch_with_each_payload_in_its_own_buffer(cluster, monkeypatch):
    _, prod, cons = cluster
    keys = [f"k{i}" for i in range(6)]
    prod.put_batch(keys, _pages(6))
    calls = []
    inner = cons.node.get_batch_into
    monkeypatch.setattr(cons.node, "get_batch_into", lambda *a, **k: calls.append(a) or inner(*a, **k))
    outs = [bytearray(PAGE) for _ in range(7)]
    outs[3] = np.zeros(PAGE, dtype=np.uint8)             # any writable contiguous buffer
    got = cons.get_batch([*keys[:5], "missing", keys[5]], outs)
    assert len(calls) == 1                               # one batch, not one call per key
    assert got == [100 + 37 * i for i in range(5)] + [None, 100 + 37 * 5]
    for j, i in enumerate([0, 1, 2, 3, 4, None, 5]):
        if i is not None:
            assert bytes(outs[j][:got[j]]) == bytes([i + 1]) * got[j], j
            assert not any(bytes(outs[j][got[j]:got[j] + 8])), "bytes beyond the object were written"
    assert cons.get_batch(keys, None) == _pages(6)       # the copying form agrees


def test_an_output_buffer_too_small_names_the_key_both_sizes_and_the_fix(cluster):
    _, prod, cons = cluster
    prod.put_batch(["a", "b"], [b"x" * 300, b"y" * 50])
    with pytest.raises(ConfigError) as e:
        cons.get_batch(["b", "a"], [bytearray(PAGE), bytearray(100)])
    msg = str(e.value)
    assert "reading b'a'" in msg and "300 bytes" in msg and "(100 bytes)" in msg and "pass a buffer of 300" in msg


@pytest.mark.parametrize("call", ["get", "put", "exists", "remove", "get_batch", "get_outs"])
def test_a_key_that_is_not_str_or_bytes_is_invalid_argument_naming_it_and_the_fix(cluster, call):
    _, prod, cons = cluster
    run = {"get": lambda: cons.get(17), "put": lambda: prod.put(17, b"v"), "exists": lambda: cons.exists(17),
           "remove": lambda: prod.remove(17), "get_batch": lambda: cons.get_batch(["a", 17]),
           "get_outs": lambda: cons.get_batch(["a", 17], [bytearray(8), bytearray(8)])}[call]
    with pytest.raises(InvalidArgument) as e:
        run()
    assert isinstance(e.value, TypeError) and isinstance(e.value, PeerCacheError)   # compatible with before
    msg = str(e.value)
    assert "is int 17" in msg and "must be str or bytes" in msg and "pass str(17)" in msg, msg


def test_a_str_value_is_invalid_argument_naming_the_key_and_encode(cluster):
    _, prod, _ = cluster
    with pytest.raises(InvalidArgument, match=r"value of key 'k' is a str.*pass value\.encode\(\)"):
        prod.put("k", "text")


def test_a_non_contiguous_value_or_buffer_is_invalid_argument_naming_it_and_the_fix(cluster):
    _, prod, cons = cluster
    strided = np.zeros((64, 64), dtype=np.uint8)[:, ::2]
    with pytest.raises(InvalidArgument, match=r"value of key 'k' \(ndarray\) is not a C-contiguous.*"
                                              r"numpy\.ascontiguousarray"):
        prod.put("k", strided)
    prod.put("k", b"v" * 10)
    with pytest.raises(InvalidArgument, match=r"output buffer 0 \(ndarray\) is not a C-contiguous writable.*"
                                              r"numpy\.ascontiguousarray"):
        cons.get("k", out=strided)
    with pytest.raises(ConfigError, match=r"output buffer 0 \(bytes\) is read-only; pass a bytearray"):
        cons.get_batch(["k"], [b"\0" * 64])


def test_stats_are_the_metrics_counters(cluster):
    _, prod, cons = cluster
    prod.put_batch(["a", "b"], [b"1" * 10, b"2" * 20])
    cons.get_batch(["a", "b", "zz"])
    cons.get_batch(["a"], [bytearray(64)])
    s = cons.stats()
    assert s["peercache_get_keys_total"] == 4 and s["peercache_get_hits_total"] == 3
    assert s["peercache_get_bytes_total"] == 40 and s["peercache_get_batch_duration_seconds_count"] == 2
    assert 'peercache_directory_lookups_total{tier="cache",result="hit"}' in s
    assert "peercache_stale_locations_total" in s
    assert prod.stats()["peercache_pool_slots_used"] == 2


def test_repr_says_what_the_client_is_connected_to(cluster):
    addr, prod, cons = cluster
    r = repr(cons)
    assert f"discovery_addr='{addr}'" in r and "protocol='shm'" in r and "page_size=4096" in r and "consumer" in r
    assert "producer of a" in repr(prod) and cons.node.node_id in r
    cons.close()
    assert "closed" in repr(cons)


@pytest.mark.parametrize("where", [{"config": "no-such-host.invalid:31998"},
                                   {"directory": "redis://no-such-host.invalid:6379/0"}])
def test_a_host_that_does_not_resolve_says_so(where):
    with pytest.raises(HostNotFound) as e:
        peercache.connect(where.get("config"), directory=where.get("directory"), timeout=0.5)
    msg = str(e.value)
    assert "'no-such-host.invalid' does not resolve" in msg and "give an IP address" in msg, msg
    assert "no reply" not in msg
    assert isinstance(e.value, errors.DiscoveryUnreachable)


def test_every_error_a_caller_can_cause_is_exported():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, PeerCacheError)]
    assert {"InvalidArgument", "InvalidLocation", "HostNotFound", "DeadlineExceeded"} <= {c.__name__ for c in classes}
    for c in classes:
        assert getattr(peercache, c.__name__) is c and c.__name__ in peercache.__all__, c.__name__


def test_connect_lists_its_keywords_and_the_package_is_typed():
    params = inspect.signature(peercache.connect).parameters
    assert {"page_size", "pool_bytes", "protocol", "directory", "timeout", "integrity"} <= set(params)
    assert peercache.connect.__name__ == "connect" and "``page_size``" in peercache.connect.__doc__
    from importlib import resources
    assert resources.files("peercache").joinpath("py.typed").is_file()
