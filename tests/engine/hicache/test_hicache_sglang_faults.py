"""PeerCacheStore under SGLang's own fault injection, driven by SGLang's own cache controller.

SGLang 0.5.23's switches ``SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE`` (probability) and
``SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY`` (seconds, upper bound) are read by
``_maybe_wrap_hicache_storage_failure_injector`` in ``sglang/srt/mem_cache/hicache_storage.py``,
which ``StorageBackendFactory.create_backend`` (``sglang/srt/mem_cache/storage/backend_factory.py``)
applies to every backend it builds: ``HiCacheStorageFailureInjector`` then sleeps up to the delay
before each storage call and, with the probability, returns a failure without calling the backend
(``batch_get_v1``/``batch_set_v1``: all False; ``batch_exists``: 0).

Here a real ``HiCacheController`` (tests/hicache_controller.py) attaches PeerCacheStore through
that factory with the switches set, and runs its backup (``_page_backup``: ``batch_set_v1`` per
batch of ``STORAGE_BATCH_SIZE`` pages, stopping at the first failed batch) and prefetch
(``_storage_hit_query``: ``batch_exists`` per batch; ``_page_transfer``: ``batch_get_v1`` per
batch, no batch after a failed one) threads. Where the counts come from:

- injected failures: SGLang's injector, one DEBUG record per failure ("Inject failure in <api>");
- failed batches: SGLang's controller, one WARNING per failed batch (must equal the injected ones);
- what SGLang counts as done: its controller's ``completed_tokens`` (backup ack, prefetch acks);
- what reached our store: PeerCacheStore.get_stats() (an injected failure never reaches it).

Each operation's outcome is predicted from the injected failures and checked against both; every
page SGLang counts as prefetched is checked byte for byte against what was written, and every
other page of the operation's host range must still hold the poison it was filled with.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

try:
    from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE, HiCacheStorageFailureInjector
    from sglang.srt.mem_cache.utils import get_storage_hash_str
except Exception as e:  # noqa: BLE001 - any import failure means: not the SGLang venv
    pytest.skip(f"SGLang is not importable here ({type(e).__name__}: {e}); `make test-hicache` runs this "
                "module in .venv-sglang", allow_module_level=True)

from hicache_controller import (BACKUP_FAILED, PREFETCH_FAILED, HostPool, Scheduler, build_controller,
                                counting_injected_failures, sglang_controller_module, unwrap)
from hicache_fixtures import PAGE_TOKENS, free_port, indices, page_bytes
from peercache import tags
from peercache.node import Node

#: what tests/engine/hicache/test_hicache_sglang.py takes in (``make test-hicache`` runs that module)
__all__ = ["instances", "test_backup_survives_sglangs_injected_set_failures",
           "test_prefetch_survives_sglangs_injected_exists_and_get_failures",
           "test_backup_and_prefetch_at_once_under_random_delay_and_failure",
           "test_with_every_call_failing_nothing_reaches_the_store_and_both_paths_go_on",
           "test_the_page_check_catches_a_wrong_byte_and_a_stray_write"]

FAILURE_ENV = "SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE"
DELAY_ENV = "SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY"
OBJ = 4096
#: three batches per operation (128, 128, 4 pages): a failure can hit the first, a middle or the last
PAGES = 2 * STORAGE_BATCH_SIZE + 4
POISON = 0xA5
#: every loop of operations is bounded by this count and by DEADLINE_S
MAX_OPS = 60
DEADLINE_S = 120.0


def tokens_of(op: int, salt: int) -> list[int]:
    base = (salt * 1000 + op) * PAGES * PAGE_TOKENS
    return list(range(base, base + PAGES * PAGE_TOKENS))


def hashes_of(tokens: list[int]) -> list[str]:
    return get_storage_hash_str(tokens, None, page_size=PAGE_TOKENS)


def fill_pages(pool: HostPool, hashes, first_page: int = 0) -> None:
    for i, h in enumerate(hashes):
        for j, v in enumerate(pool.page_view(first_page + i)):
            v[:] = page_bytes(h, j, OBJ)


def poison(pool: HostPool, first_page: int = 0, pages: int | None = None) -> None:
    """Fill host pages ``first_page`` on (all when ``pages`` is None) with the poison byte."""
    for p in range(first_page, pool.pages if pages is None else first_page + pages):
        for v in pool.page_view(p):
            v[:] = POISON


def wrong_pages(pool: HostPool, hashes, done: int, first_page: int = 0) -> list[str]:
    """Pages of ``hashes`` (host pages from ``first_page``) that break the rule: the first ``done`` hold
    exactly what was written, every later one still holds the poison."""
    bad = []
    for i, h in enumerate(hashes):
        for j, v in enumerate(pool.page_view(first_page + i)):
            if i < done and not np.array_equal(v, page_bytes(h, j, OBJ)):
                bad.append(f"page {i} object {j}: prefetched, but not the bytes written")
            elif i >= done and not (v == POISON).all():
                bad.append(f"page {i} object {j}: not prefetched, yet written to")
    return bad


class Instance:
    """One SGLang instance's storage side: a host pool, a real controller, its scheduler drains."""

    def __init__(self, mod, disc_addr: str, mla: bool, host_pages: int, pool_pages: int):
        self.pool = HostPool(host_pages, OBJ, mla)
        halves = 1 if mla else 2
        extra = {"backend_name": "peercache", "module_path": "peercache.hicache", "class_name": "PeerCacheStore",
                 "interface_v1": 1, "discovery_addr": disc_addr, "protocol": "tcp", "dir_cache_ttl": 30.0,
                 "pool_bytes": pool_pages * halves * tags.slot_stride(OBJ)}
        self.ctl = build_controller(mod, self.pool, extra, mla=mla)
        self.sched = Scheduler(self.ctl)
        self.store = unwrap(self.ctl.storage_backend)

    def stats(self) -> dict:
        return self.store.get_stats()

    def close(self) -> None:
        self.ctl.detach_storage_backend()   # stops its four threads (bounded joins), closes the store


@pytest.fixture
def instances(monkeypatch):
    """make(writer_env, reader_env, mla) -> (writer, reader): two instances over one discovery node;
    each env dict is set only while that instance's backend is created (SGLang reads it there)."""
    made: list[Instance] = []
    addr = f"127.0.0.1:{free_port()}"
    disc = Node(addr, host_discovery=True, name="discovery")
    try:
        with sglang_controller_module(monkeypatch) as (mod, _):
            def build(env: dict, mla: bool, host_pages: int, pool_pages: int) -> Instance:
                for name in (FAILURE_ENV, DELAY_ENV):
                    monkeypatch.delenv(name, raising=False)
                for name, value in env.items():
                    monkeypatch.setenv(name, str(value))
                try:
                    inst = Instance(mod, addr, mla, host_pages, pool_pages)
                finally:
                    for name in (FAILURE_ENV, DELAY_ENV):
                        monkeypatch.delenv(name, raising=False)
                made.append(inst)
                wrapped = isinstance(inst.ctl.storage_backend, HiCacheStorageFailureInjector)
                assert wrapped == bool(env), (f"SGLang's failure injector is {'' if wrapped else 'not '}around "
                                              f"the backend with switches {env}")
                assert type(inst.store).__name__ == "PeerCacheStore"
                assert inst.store.is_mla == mla and inst.store.is_writer, "SGLang's controller configured the store"
                return inst

            def make(writer_env: dict, reader_env: dict, mla: bool = False):
                writer = build(writer_env, mla, 2 * PAGES, MAX_OPS * PAGES + PAGES)
                reader = build(reader_env, mla, PAGES, 0)
                return writer, reader
            try:
                yield make
            finally:
                for inst in made:
                    inst.close()
    finally:
        disc.close()


def read_back(reader: Instance, hashes, pages: int) -> None:
    """The first ``pages`` of ``hashes`` read by the reader's own store (no injector): all there, exact."""
    poison(reader.pool)
    if pages:
        got = reader.store.batch_get_v1(hashes[:pages], indices(range(pages), torch_indices=True))
        assert got == [True] * pages
    assert wrong_pages(reader.pool, hashes[:pages], pages) == []


@pytest.mark.parametrize("layout", ["mha", "mla"])
def test_backup_survives_sglangs_injected_set_failures(instances, layout):
    writer, reader = instances({FAILURE_ENV: 0.3}, {}, mla=layout == "mla")
    salt = int(time.time() * 1000) % 100000
    ops = injected_ops = clean_ops = clean_after_failure = 0
    with counting_injected_failures() as inj:
        deadline = time.monotonic() + DEADLINE_S
        for op in range(MAX_OPS):
            if (injected_ops >= 3 and clean_after_failure >= 2) or time.monotonic() > deadline:
                break
            tokens = tokens_of(op, salt)
            hashes = hashes_of(tokens)
            fill_pages(writer.pool, hashes)
            inj0, written0 = inj.get("batch_set_v1"), writer.stats()["pages_written"]
            done_tokens = writer.sched.backup(indices(range(PAGES), torch_indices=True), tokens, hashes)
            injected = inj.get("batch_set_v1") - inj0
            reached = writer.stats()["pages_written"] - written0
            done = done_tokens // PAGE_TOKENS
            assert done_tokens % PAGE_TOKENS == 0
            if injected == 0:    # no failure: SGLang counts every page, and our store wrote every page
                assert (done, reached) == (PAGES, PAGES), f"op {op}: no injected failure, yet {done} pages acked"
                clean_ops += 1
                clean_after_failure += injected_ops > 0
            else:                # SGLang stops at the failed batch: the acked prefix is what reached us
                assert injected == 1, f"op {op}: {injected} injected failures; SGLang stops at the first"
                assert done == reached < PAGES and done % STORAGE_BATCH_SIZE == 0, (done, reached)
                injected_ops += 1
            # the cluster holds exactly the acked prefix (later batches never reached the store), byte exact
            assert reader.store.batch_exists(hashes) == done
            read_back(reader, hashes, done)
            ops += 1
    assert injected_ops >= 3 and clean_after_failure >= 2, (
        f"with {FAILURE_ENV}=0.3 in {ops} operations: {injected_ops} had an injected set failure and "
        f"{clean_after_failure} succeeded after one; SGLang's injector did not run as expected")
    # SGLang's controller reported as failed exactly the batches its injector failed, no other
    assert inj.get(BACKUP_FAILED) == inj.get("batch_set_v1") == injected_ops, inj.counts
    s = writer.stats()
    assert s["write_errors"] == 0
    print(f"\nbackup {layout}: {ops} operations of {PAGES} pages, {inj.get('batch_set_v1')} injected "
          f"batch_set_v1 failures (SGLang's injector), {inj.get(BACKUP_FAILED)} failed batches (SGLang's "
          f"controller), {injected_ops} operations cut short, {clean_ops} whole; "
          f"pages written by PeerCacheStore: {s['pages_written']}")


@pytest.mark.parametrize("layout", ["mha", "mla"])
def test_prefetch_survives_sglangs_injected_exists_and_get_failures(instances, layout):
    writer, reader = instances({}, {FAILURE_ENV: 0.2}, mla=layout == "mla")
    salt = int(time.time() * 1000) % 100000
    cut = {"batch_exists": 0, "batch_get_v1": 0}
    ops = clean_ops = clean_after_failure = hits_total = 0
    with counting_injected_failures() as inj:
        deadline = time.monotonic() + DEADLINE_S
        for op in range(MAX_OPS):
            if (min(cut.values()) >= 2 and clean_after_failure >= 2) or time.monotonic() > deadline:
                break
            tokens = tokens_of(op, salt)
            hashes = hashes_of(tokens)
            fill_pages(writer.pool, hashes)
            assert writer.sched.backup(indices(range(PAGES), torch_indices=True), tokens, hashes) == len(tokens)
            poison(reader.pool)
            ex0, get0 = inj.get("batch_exists"), inj.get("batch_get_v1")
            r0 = reader.stats()
            hit_tokens, done_tokens = reader.sched.prefetch(
                tokens, lambda n: indices(range(n // PAGE_TOKENS), torch_indices=True))
            ex_inj, get_inj = inj.get("batch_exists") - ex0, inj.get("batch_get_v1") - get0
            r1 = reader.stats()
            hit, done = hit_tokens // PAGE_TOKENS, done_tokens // PAGE_TOKENS
            assert ex_inj <= 1 and get_inj <= 1, f"op {op}: SGLang went on past an injected failure"
            if ex_inj:           # the hit query stops at the failed batch: the hit is the batches before it
                assert hit < PAGES and hit % STORAGE_BATCH_SIZE == 0, f"op {op}: hit {hit} pages"
                cut["batch_exists"] += 1
            else:
                assert hit == PAGES, f"op {op}: every page is stored, no injected failure, yet a hit of {hit}"
            if get_inj:          # no batch after the failed one is read
                assert done < hit and done % STORAGE_BATCH_SIZE == 0, f"op {op}: {done} of {hit} pages done"
                cut["batch_get_v1"] += 1
            else:
                assert done == hit, f"op {op}: no injected read failure, yet {done} of {hit} pages done"
            if not ex_inj and not get_inj:
                clean_ops += 1
                clean_after_failure += sum(cut.values()) > 0   # the path went on after a failure
            # our store: every page it was asked for was a whole hit, and those are exactly SGLang's count
            assert r1["hits"] - r0["hits"] == done and r1["misses"] == r0["misses"], (r0, r1)
            assert r1["read_errors"] == 0
            hits_total += done
            # no wrong page in the host pool: SGLang's completed pages exact, every other page untouched
            assert wrong_pages(reader.pool, hashes, done) == []
            ops += 1
    assert min(cut.values()) >= 2 and clean_after_failure >= 2, (
        f"with {FAILURE_ENV}=0.2 in {ops} operations: operations cut by injected failures {cut}, "
        f"{clean_after_failure} whole after one; SGLang's injector did not run as expected")
    assert inj.get(PREFETCH_FAILED) == inj.get("batch_get_v1") == cut["batch_get_v1"], inj.counts
    print(f"\nprefetch {layout}: {ops} operations of {PAGES} pages, injected failures (SGLang's injector) "
          f"batch_exists {inj.get('batch_exists')}, batch_get_v1 {inj.get('batch_get_v1')}, failed batches "
          f"(SGLang's controller) {inj.get(PREFETCH_FAILED)}; operations cut "
          f"short {cut}, {clean_ops} whole; pages SGLang counted = PeerCacheStore hits = {hits_total}")


def test_backup_and_prefetch_at_once_under_random_delay_and_failure(instances):
    """Both switches on both instances; the writer backs up while both instances prefetch what it acked
    (the writer's own prefetch runs on the store its backup thread is writing through)."""
    env = {FAILURE_ENV: 0.2, DELAY_ENV: 0.01}
    writer, reader = instances(env, env)
    salt = int(time.time() * 1000) % 100000
    acked: dict[int, tuple[list[int], list[str], int]] = {}
    lock = threading.Lock()
    first_ack, stop = threading.Event(), threading.Event()
    errors: list[str] = []

    def backups():
        try:
            for op in range(MAX_OPS):
                if stop.is_set():
                    return
                tokens = tokens_of(op, salt)
                hashes = hashes_of(tokens)
                fill_pages(writer.pool, hashes)
                done = writer.sched.backup(indices(range(PAGES), torch_indices=True), tokens, hashes)
                with lock:
                    acked[op] = (tokens, hashes, done // PAGE_TOKENS)
                first_ack.set()
        except BaseException as e:  # reported by the main thread
            errors.append(f"backup thread: {type(e).__name__}: {e}")
            first_ack.set()

    # the reader prefetches into its host pages 0.., the writer into PAGES.. (its backup source is 0..)
    sides = [("reader", reader, 0), ("writer", writer, PAGES)]
    prefetched = {"writer": 0, "reader": 0}
    bad: list[str] = []
    with counting_injected_failures() as inj:
        t = threading.Thread(target=backups, name="backups", daemon=True)
        t.start()
        deadline = time.monotonic() + DEADLINE_S
        try:
            assert first_ack.wait(timeout=DEADLINE_S), f"no backup was acked within {DEADLINE_S} s"
            for n in range(2 * MAX_OPS):
                enough = (inj.get("batch_set_v1") >= 2 and inj.get("batch_get_v1") >= 2
                          and min(prefetched.values()) >= 2 * PAGES)
                if enough or errors or time.monotonic() > deadline:
                    break
                with lock:
                    ready = max(acked)
                    tokens, hashes, stored = acked[ready]
                name, inst, first = sides[n % 2]
                poison(inst.pool, first, PAGES)
                hit_tokens, done_tokens = inst.sched.prefetch(
                    tokens, lambda k: indices(range(first, first + k // PAGE_TOKENS), torch_indices=True))
                hit, done = hit_tokens // PAGE_TOKENS, done_tokens // PAGE_TOKENS
                if not done <= hit <= stored:   # nothing past the backed-up prefix can be hit
                    bad.append(f"{name} op {ready}: done {done}, hit {hit}, stored {stored}")
                bad += [f"{name} op {ready}: {w}" for w in wrong_pages(inst.pool, hashes, done, first)]
                prefetched[name] += done
        finally:
            stop.set()
            t.join(timeout=DEADLINE_S)
    assert not t.is_alive(), "the backup thread did not finish: a backup hangs"
    assert errors == [] and bad == []
    counts = {api: inj.get(api) for api in ("batch_set_v1", "batch_exists", "batch_get_v1")}
    # every batch SGLang's controller saw fail was one its injector failed (ours failed none)
    assert (inj.get(BACKUP_FAILED), inj.get(PREFETCH_FAILED)) == (counts["batch_set_v1"], counts["batch_get_v1"]), \
        inj.counts
    assert counts["batch_set_v1"] >= 1 and counts["batch_get_v1"] + counts["batch_exists"] >= 1, (
        f"with {FAILURE_ENV}=0.2 no failure was injected on a path: {counts}")
    assert min(prefetched.values()) > 0, f"no page was prefetched on an instance: {prefetched}"
    for inst in (writer, reader):
        s = inst.stats()
        assert s["read_errors"] == 0 and s["write_errors"] == 0, s
    print(f"\nat once, delay <= 0.01 s: {len(acked)} backups, injected failures (SGLang's injector) {counts}; "
          f"pages prefetched {prefetched}")


def test_with_every_call_failing_nothing_reaches_the_store_and_both_paths_go_on(instances):
    """Failure probability 1: each backup fails at its first batch, each hit query at its first, every
    operation still completes (acked, no hang) and PeerCacheStore is never called."""
    writer, reader = instances({FAILURE_ENV: 1.0}, {FAILURE_ENV: 1.0})
    salt = int(time.time() * 1000) % 100000
    with counting_injected_failures() as inj:
        for op in range(3):
            tokens = tokens_of(op, salt)
            hashes = hashes_of(tokens)
            fill_pages(writer.pool, hashes)
            assert writer.sched.backup(indices(range(PAGES), torch_indices=True), tokens, hashes) == 0
            poison(reader.pool)
            assert reader.sched.prefetch(tokens, lambda n: indices(range(n // PAGE_TOKENS), torch_indices=True)) \
                == (0, 0)
            assert wrong_pages(reader.pool, hashes, 0) == []
    assert (inj.get("batch_set_v1"), inj.get(BACKUP_FAILED), inj.get("batch_exists")) == (3, 3, 3), inj.counts
    for inst in (writer, reader):
        s = inst.stats()
        assert s["pages_written"] == s["pages_read"] == s["hits"] == s["misses"] == 0, s


def test_the_page_check_catches_a_wrong_byte_and_a_stray_write():
    pool = HostPool(4, OBJ, False)
    hashes = hashes_of(list(range(4 * PAGE_TOKENS)))
    poison(pool)
    fill_pages(pool, hashes[:2])
    assert wrong_pages(pool, hashes, 2) == []
    pool.page_view(1)[1][7] ^= 1
    pool.page_view(3)[0][0] = 0
    assert wrong_pages(pool, hashes, 2) == ["page 1 object 1: prefetched, but not the bytes written",
                                            "page 3 object 0: not prefetched, yet written to"]
