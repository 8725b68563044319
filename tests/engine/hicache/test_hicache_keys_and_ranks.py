"""PeerCacheStore with several ranks and adversarial names (main venv, no torch): each rank's metrics endpoint
on the configured port plus its rank, and the generic path's keys apart from v1 pages' object keys, whatever
the names (ending in _k or _v, holding the separators, prefixes of each other, empty, unicode)."""
from __future__ import annotations

import socket
import urllib.request

import numpy as np
import pytest

from conftest import free_port, scaled
from hicache_fixtures import NumpyHostPool, indices
from peercache.errors import ConfigError
from peercache.hicache import PeerCacheStore, page_part

OBJ = 4096

#: names a client may give, chosen to meet each other's keys under a naive scheme: the object suffixes, the
#: rank suffixes, '/', '%' and its escapes, the generic space's mark, prefixes of each other, empty, unicode
NAMES = ["abc", "abc_k", "abc_v", "abc_0", "abc_1", "abc_0_k", "abc_0_v", "abc_1_k", "abc_pp1", "abc_pp1_k",
         "abc_0_pp1_k", "abc_2", "ab", "a", "", " ", "_", "_k", "k", "g", "g/abc", "g/abc_k", "g_k", "/", "//",
         "a/b", "a%2Fb", "a%5Fk", "%", "%25", "abc%5Fk", "abc\u00e9", "\u65e5\u672c", "a\x00b", "\ud800",
         "x" * 300, "deadbeef" * 8]


class Rank:
    """The fields of SGLang's HiCacheStorageConfig the store reads, for one rank."""

    def __init__(self, extra: dict, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, mla=False):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = tp_rank, tp_size, pp_rank, pp_size
        self.is_mla_model, self.model_name, self.extra_config = mla, "org/Model", extra
        self.is_storage_writer = not mla or tp_rank == 0


def free_ports(n: int) -> int:
    """A port P with P..P+n-1 free on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n - 1 > 65535:
            continue
        try:
            held = []
            for p in range(base, base + n):
                t = socket.socket()
                held.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in held:
                t.close()
    raise AssertionError(f"no {n} consecutive free ports found")


def answers(url: str) -> bool:
    return urllib.request.urlopen(url, timeout=scaled(5)).status == 200


def test_each_rank_serves_its_metrics_on_the_port_plus_its_rank():
    base = free_ports(4)
    extra = {"metrics_addr": f"127.0.0.1:{base}"}
    # every rank of a tp 2 x pp 2 model with the one extra config SGLang gives them all
    stores = []
    try:
        for pp in range(2):
            for tp in range(2):
                stores.append(PeerCacheStore(Rank(extra, tp_rank=tp, tp_size=2, pp_rank=pp, pp_size=2), {}))
        assert [s.metrics_url for s in stores] == [f"http://127.0.0.1:{base + r}/metrics" for r in range(4)]
        assert all(answers(s.metrics_url) for s in stores)
    finally:
        for s in stores:
            s.close()
    # port 0: a free port each
    stores = [PeerCacheStore(Rank({"metrics_addr": "127.0.0.1:0"}, tp_rank=r, tp_size=2), {}) for r in range(2)]
    try:
        assert stores[0].metrics_url != stores[1].metrics_url and all(answers(s.metrics_url) for s in stores)
    finally:
        for s in stores:
            s.close()


def test_ranks_beyond_the_last_port_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"extra config 'metrics_addr' 127\.0\.0\.1:65534 with 4 ranks "
                                          r"\(tp_size x pp_size\) needs ports 65534\.\.65537 \(one each\), beyond "
                                          r"65535; give a lower port, or port 0"):
        PeerCacheStore(Rank({"metrics_addr": "127.0.0.1:65534"}, tp_size=2, pp_size=2), {})


#: one store of each kind of rank a model can have: MLA (shared by every tp rank) and MHA (per tp rank), with
#: and without pipeline stages
KINDS = {"mla": dict(mla=True), "mla-pp1": dict(mla=True, pp_rank=1, pp_size=2),
         "mha-tp0": dict(tp_size=2), "mha-tp1": dict(tp_rank=1, tp_size=2),
         "mha-tp0-pp1": dict(tp_size=2, pp_rank=1, pp_size=2)}


def test_no_two_names_ranks_or_spaces_share_a_key():
    owner: dict[bytes, tuple] = {}     # key -> the (kind of rank, space, name, object) that made it
    for kind, kw in KINDS.items():
        store = PeerCacheStore(Rank({}, **kw), {})       # no node yet: keys are all it gives
        objs = 1 if kw.get("mla") else 2
        for name in NAMES:
            for what, keys in (("generic", [store.generic_key(name)]),
                               ("v1", store.object_keys([name], objs)),
                               ("v1 of 3 objects", store.object_keys([name], 3))):
                for j, key in enumerate(keys):
                    who = (kind, what, name, j)
                    mine = owner.setdefault(key, who)
                    assert mine == who, f"{key!r} is both {mine} and {who}"
        store.close()
    # SGLang's page hashes (hex) are kept as they are in the keys: what earlier versions wrote is read back
    mha = PeerCacheStore(Rank({}, tp_size=2), {})
    assert mha.object_keys(["deadbeef01"], 2) == [b"default/org%2FModel/deadbeef01_0_k",
                                                  b"default/org%2FModel/deadbeef01_0_v"]
    assert mha.generic_key("abc_k") == b"default/org%2FModel/g/abc%5Fk_0"


def test_a_batch_of_names_gets_each_names_key_by_the_rule():
    """object_keys builds a batch of plain names (SGLang's hex hashes) with whole-batch string calls and any
    other batch name by name: both give <prefix><page_part(name)><suffix> for every name and object, in
    order, for every kind of rank; a newline in a name, the prefix or a suffix, a name that is not a str,
    unicode and names with escapes among plain ones all take the name-by-name rule."""
    hexes = [f"{i * 0x9E3779B97F4A7C15 % (1 << 64):016x}" * 4 for i in range(128)]
    batches = [hexes, NAMES, hexes[:5] + ["a\nb"] + hexes[5:9], ["a\n", "b"], hexes[:3] + [7, "8"],
               ["x"], ["", "a", ""], hexes[:4] + ["\u65e5"], ["a.b:c@d+e-f"]]
    for kind, kw in KINDS.items():
        store = PeerCacheStore(Rank({}, **kw), {})
        for prefix in (store.prefix, "t\n/"):
            store.prefix = prefix
            for batch in batches:
                for objs in (1, 2, 3):
                    want = [f"{prefix}{page_part(n)}{sfx}".encode() for n in batch for sfx in store._suffixes(objs)]
                    assert store.object_keys(batch, objs) == want, (kind, prefix, batch[:3], objs)
        store.close()


def test_a_page_first_pool_is_read_by_its_stride_and_any_other_by_its_own_meta():
    """A host pool whose pages lie at one stride (NumpyHostPool, MLA and MHA; SGLang's page_first) gets its
    batch offsets from one native call, the same as the pool's get_page_buffer_meta gives, for pages out of
    order and repeated; a pool whose pages do not lie at one stride (rows permuted, its first ten rows on
    a line) is asked every batch; a page past the buffer's end is refused."""
    class Shuffled(NumpyHostPool):
        def get_page_buffer_meta(self, idx):
            t = self.page_size
            moved = np.asarray(idx).reshape(-1, t)
            moved = (((moved[:, :1] // t) * 7 % self.pages) * t + np.arange(t)).reshape(-1)
            return super().get_page_buffer_meta(moved)

    pages = [5, 0, 63, 5, 17, 1, 62]
    for mla in (True, False):
        for pool, linear in ((NumpyHostPool(64, OBJ, mla), True), (Shuffled(64, OBJ, mla), False)):
            s = PeerCacheStore(Rank({"discovery_addr": f"127.0.0.1:{free_port()}", "host_discovery": True,
                                     "protocol": "tcp", "pool_bytes": 0}, mla=mla), {})
            try:
                s.register_mem_pool_host(pool)
                assert (s._linear is not None) == linear, (mla, type(pool).__name__)
                ptrs, sizes = pool.get_page_buffer_meta(indices(pages))
                offsets, got_sizes, objs = s._page_meta([str(p) for p in pages], indices(pages))
                assert offsets.tolist() == [p - pool.kv_buffer.ctypes.data for p in ptrs]
                assert got_sizes.tolist() == sizes and objs == (1 if mla else 2)
                if linear:      # the shuffled pool's page 64 is its page 0
                    with pytest.raises(ConfigError, match="outside its registered kv_buffer"):
                        s._page_meta(["x"], indices([64 if mla else 128]))
            finally:
                s.close()


@pytest.fixture
def store(port):
    """An MLA store hosting discovery in this process, with a pool and a registered host pool of 64 pages."""
    s = PeerCacheStore(Rank({"discovery_addr": f"127.0.0.1:{port}", "host_discovery": True, "protocol": "tcp",
                             "pool_bytes": 256 * (OBJ + 4096)}, mla=True), {})
    pool = NumpyHostPool(64, OBJ, True)
    s.register_mem_pool_host(pool)
    yield s, pool
    s.close()


def test_a_generic_value_is_never_read_as_a_v1_page(store):
    s, pool = store
    # 'abc_k' was the v1 object key of page 'abc': neither present nor read, and no host page is written
    assert s.set("abc_k", np.full(100, 7, np.uint8))
    assert s.batch_exists(["abc"]) == 0
    assert s.batch_get_v1(["abc"], indices([0])) == [False]
    assert not pool.kv_buffer.any()
    values = {name: np.full(64 + i, i + 1, np.uint8) for i, name in enumerate(NAMES)}
    assert s.batch_set(list(values), list(values.values()))
    # no name's v1 page is any other name's generic value
    for name in NAMES:
        assert s.batch_exists([name]) == 0, name
    assert s.batch_get_v1(NAMES[:32], indices(list(range(32)))) == [False] * 32
    assert not pool.kv_buffer.any()
    # every generic value reads back as its own
    got = s.batch_get(list(values))
    for (name, want), v in zip(values.items(), got):
        assert v is not None and np.array_equal(np.asarray(v), want), name
    # and the other way: v1 pages under the same names leave the generic values as they were
    for p, name in enumerate(NAMES[:32]):
        pool.page_view(p)[0][:] = 200 + p % 50
    assert s.batch_set_v1(NAMES[:32], indices(list(range(32)))) == [True] * 32
    assert s.batch_exists(NAMES[:32]) == 32
    got = s.batch_get(list(values))
    for (name, want), v in zip(values.items(), got):
        assert np.array_equal(np.asarray(v), want), name
