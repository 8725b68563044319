"""The producer's geometry: the record a producer registers, the one check of a consumer's setting against
it, and the library consumer that learns its page size from it (or is told both sizes when they differ)."""
import pytest

import peercache
from peercache.bench.serve import fill_page
from peercache.errors import ConfigError
from peercache.node import Geometry, Node
from peercache.node.geometry import INFO_KEY, Surface, published, settle

PAGE = 16384
SERVED = Geometry(PAGE, "mla", 8, "pc/<i>")
FLAGS = Surface("drive", {"page_size": "--page-size", "layout": "--layout", "working_set": "--working-set"},
                " ", "drop {}")
DEFAULTS = {"page_size": 131072, "layout": "mla", "working_set": 1024}


def test_the_record_round_trips_through_a_node_info_and_an_unreadable_one_is_none():
    info = {"host": "h", INFO_KEY: SERVED.to_info()}
    assert Geometry.from_info(info) == SERVED
    assert Geometry.from_info({"host": "h"}) is None                                  # an older producer
    assert Geometry.from_info({INFO_KEY: dict(SERVED.to_info(), version=99)}) is None
    assert Geometry.from_info({INFO_KEY: dict(SERVED.to_info(), page_size=0)}) is None
    assert Geometry.from_info({INFO_KEY: dict(SERVED.to_info(), layout=7)}) is None
    assert published({"a": info, "b": {"host": "h"}, "c": None}) == {"a": SERVED}
    assert SERVED.describe() == "16384-byte pages (layout mla, working set 8, keys pc/<i>)"


def test_settle_takes_the_producers_and_refuses_a_setting_that_differs_naming_both():
    none = {"page_size": None, "layout": None, "working_set": None}
    assert settle(none, SERVED, FLAGS, "the producer at X", DEFAULTS) == \
        {"page_size": PAGE, "layout": "mla", "working_set": 8}
    assert settle(none, None, FLAGS, "", DEFAULTS) == DEFAULTS                     # none published: the defaults
    assert settle(dict(none, page_size=4096), None, FLAGS, "", DEFAULTS)["page_size"] == 4096
    with pytest.raises(ConfigError) as e:
        settle(dict(none, page_size=4096), SERVED, FLAGS, "the producer at X", DEFAULTS)
    assert str(e.value) == ("drive --page-size 4096 but the producer at X serves 16384-byte pages (layout mla, "
                            "working set 8, keys pc/<i>); drop --page-size or pass --page-size 16384")
    with pytest.raises(ConfigError, match="--working-set 9 but .* drop --working-set or pass --working-set 8"):
        settle(dict(none, working_set=9), SERVED, FLAGS, "the producer at X", DEFAULTS)
    # room for an object: more than the producer's size is no mistake where the consumer says so
    assert settle({"page_size": 2 * PAGE}, SERVED, FLAGS, "p", DEFAULTS, at_least=("page_size",)) == \
        {"page_size": 2 * PAGE}
    with pytest.raises(ConfigError, match="--page-size 4096 but"):
        settle({"page_size": 4096}, SERVED, FLAGS, "p", DEFAULTS, at_least=("page_size",))


def _producer(addr: str, geometry):
    """A producer of PAGE-byte pages pc/0..7 (serve's keys and content), with or without its geometry."""
    node = Node(addr, host_discovery=True, protocol="tcp", pool_bytes=16 * (PAGE + 64), page_bytes=PAGE,
                geometry=geometry)
    node.put_batch([f"pc/{i}".encode() for i in range(8)], fill=fill_page)
    return node


def test_a_library_consumer_told_nothing_reads_the_producers_page_size(port):
    addr = f"127.0.0.1:{port}"
    with _producer(addr, SERVED):
        with peercache.connect(addr, protocol="tcp") as pc:
            assert pc.page_size == PAGE
            assert len(pc.get("pc/3")) == PAGE
        with peercache.connect(addr, protocol="tcp", page_size=2 * PAGE) as pc:   # more room: fine
            assert len(pc.get("pc/3")) == PAGE


def test_a_library_page_size_smaller_than_the_producers_is_one_error_naming_both(port):
    addr = f"127.0.0.1:{port}"
    with _producer(addr, SERVED):
        with pytest.raises(ConfigError) as e:
            peercache.connect(addr, protocol="tcp", page_size=4096)
    msg = str(e.value)
    assert msg.startswith("peercache.connect page_size=4096 but the producer at 127.0.0.1:")
    assert "serves 16384-byte pages (layout mla, working set 8, keys pc/<i>)" in msg
    assert msg.endswith("leave page_size unset or pass page_size=16384")


def test_a_producer_that_publishes_no_geometry_leaves_the_default_and_a_too_small_read_names_both_sizes(port):
    addr = f"127.0.0.1:{port}"
    with _producer(addr, None):
        with peercache.connect(addr, protocol="tcp") as pc:
            assert pc.page_size == peercache.client.DEFAULT_PAGE_SIZE              # as before
            assert len(pc.get("pc/1")) == PAGE
        with peercache.connect(addr, protocol="tcp", page_size=4096) as pc:
            with pytest.raises(ConfigError) as e:
                pc.get("pc/1")
            assert str(e.value) == ("reading b'pc/1': peercache.connect page_size=4096 but the producer of "
                                    "b'pc/1' serves 16384-byte pages; leave page_size unset or pass "
                                    "page_size=16384")
            with pytest.raises(ConfigError, match="the object is 16384 bytes, larger than the output buffer "
                                                  r"\(4096 bytes\); pass a buffer of 16384 bytes or more"):
                pc.get("pc/1", out=bytearray(4096))
            r = pc.node.get_batch_into([b"pc/1", b"pc/2"], bytearray(8192), [0, 4096], [4096, 4096])
            assert list(r.too_big) == [0, 1] and list(r.lengths) == [PAGE, PAGE]
            assert "b'pc/1' is a 16384-byte object, larger than the 4096 bytes of room" in r.error
