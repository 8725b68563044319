"""SGLang's own HiCache cache controller, on the CPU, driving a storage backend (SGLang venv only).

:func:`controller` builds a real ``sglang.srt.managers.cache_controller.HiCacheController``
(its ``__init__`` and ``attach_storage_backend``, hence ``StorageBackendFactory.create_backend``
and, when the ``SGLANG_TEST_HICACHE_BACKEND_RANDOM_*`` switches are set, SGLang's
``HiCacheStorageFailureInjector`` around the backend) and starts its four storage threads
(prefetch, prefetch IO, prefetch sync, backup). :class:`Scheduler` plays the few steps of
``UnifiedRadixCache``'s storage drains the controller leaves to the scheduler thread: give a
storage hit its host pages and queue it for transfer, take ``completed_tokens`` from the prefetch
acks, take a backup's ``completed_tokens`` from its ack.

Why stand-ins: ``cache_controller`` imports, at module level, ``layers.dp_attention`` (GPU
all-reduce kernels: ``tvm_ffi``), ``mem_cache.l2_transfer`` and ``mem_cache.memory_pool``
(transformers, GPU pools), none installed in the CPU venv. The storage paths run here never call
them: the controller reads only ``is_dp_attention_enabled`` and ``isinstance`` checks against
the device pool classes, and builds an ``L2TransferEngine`` it uses for device<->host copies
only. Each such module that fails to import is replaced, while the controller is imported and
attached, by a module holding exactly those names; a venv with the full SGLang stack uses its
real modules. The device pool and allocator are small objects with the attributes ``__init__``
reads; the host pool is :class:`hicache_fixtures.NumpyHostPool` (see there why).
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import threading
import time
import types
from queue import Empty

from hicache_fixtures import NumpyHostPool

#: the modules cache_controller imports that need the GPU stack, and the names it takes from them
_GPU_MODULES = {
    "sglang.srt.layers.dp_attention": ("is_dp_attention_enabled",),
    "sglang.srt.mem_cache.l2_transfer": ("L2Transfer", "L2TransferEngine"),
    "sglang.srt.mem_cache.memory_pool": ("MLATokenToKVPool", "HybridLinearKVPool"),
    "sglang.srt.mem_cache.deepseek_v4_memory_pool": ("DeepSeekV4TokenToKVPool",),
}
CONTROLLER_MODULE = "sglang.srt.managers.cache_controller"
#: SGLang's injector logs each injected failure at DEBUG on this logger ("Inject failure in <api>")
INJECTOR_LOGGER = "sglang.srt.mem_cache.hicache_storage"


def _stand_in(name: str, names: tuple[str, ...]) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__doc__ = f"CPU stand-in for {name} (tests/hicache_controller.py): {', '.join(names)}"
    for n in names:
        if n == "is_dp_attention_enabled":
            mod.is_dp_attention_enabled = lambda: False   # no DP attention in a one-rank CPU test
        elif n == "L2TransferEngine":
            mod.L2TransferEngine = type("L2TransferEngine", (), {"__init__": lambda self, io_backend="": None})
        else:
            setattr(mod, n, type(n, (), {}))
    return mod


@contextlib.contextmanager
def sglang_controller_module(monkeypatch):
    """The real cache_controller module, importable on the CPU (see the module docstring)."""
    stood_in = []
    for name, names in _GPU_MODULES.items():
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            monkeypatch.setitem(sys.modules, name, _stand_in(name, names))
            stood_in.append(name)
    if stood_in:   # a module half-imported against the real modules must not be reused
        monkeypatch.delitem(sys.modules, CONTROLLER_MODULE, raising=False)
    try:
        mod = importlib.import_module(CONTROLLER_MODULE)
    except ImportError as e:
        raise AssertionError(f"SGLang's cache_controller does not import here even with CPU stand-ins for "
                             f"{stood_in} ({type(e).__name__}: {e}); a new GPU-only import needs a stand-in in "
                             "tests/hicache_controller.py _GPU_MODULES") from e
    try:
        yield mod, stood_in
    finally:
        if stood_in:
            sys.modules.pop(CONTROLLER_MODULE, None)


class HostPool(NumpyHostPool):
    """NumpyHostPool with the attributes SGLang's controller reads from a host KV pool."""

    storage_format_tag = None

    @property
    def size(self) -> int:
        return self.pages * self.page_size

    logical_size = size


class _DevicePool:
    device = "cpu"
    layer_num = 1

    def register_layer_transfer_counter(self, counter) -> None:
        self.layer_counter = counter


class _Allocator:
    def __init__(self, pool):
        self.pool = pool

    def get_kvcache(self):
        return self.pool


def build_controller(mod, host_pool: HostPool, extra: dict, *, mla: bool, model_name: str = "m"):
    """A real HiCacheController with the 'dynamic' backend ``extra`` and its storage threads running."""
    from sglang.srt.runtime_context import get_parallel
    # The controller tells MLA (one writer rank, rank-shared keys) by the device pool's class; the
    # instance is built without its __init__, which would allocate GPU buffers where the class is real.
    mla_cls = sys.modules["sglang.srt.mem_cache.memory_pool"].MLATokenToKVPool
    device = object.__new__(type("DeviceMLAPool", (_DevicePool, mla_cls), {}) if mla else _DevicePool)
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1, attn_dcp_rank=0):
        return mod.HiCacheController(_Allocator(device), host_pool, host_pool.page_size, None, threading.Event(),
                                     storage_backend="dynamic", prefetch_threshold=host_pool.page_size,
                                     model_name=model_name, storage_backend_extra_config=dict(extra))


def unwrap(backend):
    """The PeerCacheStore inside SGLang's failure injector (itself when not wrapped)."""
    return getattr(backend, "_backend", backend)


#: the controller's own warning per failed storage batch (cache_controller._page_backup, _page_get_zero_copy)
CONTROLLER_LOGGER = "sglang.srt.managers.cache_controller"
BACKUP_FAILED, PREFETCH_FAILED = "controller: backup batch failed", "controller: prefetch batch failed"


class FailureLog(logging.Handler):
    """SGLang's own failure records, counted: each injected failure per storage API (its injector's
    DEBUG "Inject failure in <api>") and each batch its controller reports as failed (WARNINGs
    "Write page to storage: N pages failed." and "... failed to retrieve page ...")."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self._counts_lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Inject failure in "):
            what = msg[len("Inject failure in "):].strip()
        elif msg.startswith("Write page to storage:") and "failed" in msg:
            what = BACKUP_FAILED
        elif "failed to retrieve page" in msg:
            what = PREFETCH_FAILED
        else:
            return
        with self._counts_lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def get(self, what: str) -> int:
        with self._counts_lock:
            return self.counts.get(what, 0)


@contextlib.contextmanager
def counting_injected_failures():
    """A :class:`FailureLog` on SGLang's injector and controller loggers while the block runs."""
    handler = FailureLog()
    loggers = [logging.getLogger(INJECTOR_LOGGER), logging.getLogger(CONTROLLER_LOGGER)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
    loggers[0].setLevel(logging.DEBUG)   # the injector logs its failures at DEBUG
    try:
        yield handler
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(handler)
            lg.setLevel(level)


class Scheduler:
    """The scheduler thread's side of one controller's storage queues (UnifiedRadixCache's drains)."""

    def __init__(self, ctl, timeout: float = 30.0):
        self.ctl, self.timeout = ctl, timeout
        self._rid = 0

    def _get(self, queue, what: str):
        try:
            return queue.get(timeout=self.timeout)
        except Empty:
            raise AssertionError(f"SGLang's controller gave no {what} within {self.timeout} s: a storage call "
                                 "hangs or a controller thread died (see the log above)") from None

    def backup(self, host_indices, token_ids, hashes) -> int:
        """write_storage, then its ack: the tokens SGLang counts as backed up."""
        op_id = self.ctl.write_storage(host_indices, token_ids, hash_value=hashes)
        op = self._get(self.ctl.ack_backup_queue, f"backup ack for operation {op_id}")
        if op.id != op_id:
            raise AssertionError(f"backup ack for operation {op.id}, expected {op_id}")
        return op.completed_tokens

    def prefetch(self, token_ids, host_pages_of) -> tuple[int, int]:
        """(hit tokens, completed tokens) of a prefetch: the hit query, host pages for the hit, its acks.

        ``host_pages_of(hit_tokens)`` gives the host token indices (a torch tensor) for the hit.
        """
        self._rid += 1
        rid = f"req{self._rid}"
        op = self.ctl.prefetch(rid, token_ids)
        hit = self._get(self.ctl.prefetch_hit_queue, f"storage hit for {rid}")
        if hit is not op:
            raise AssertionError(f"storage hit for {hit.request_id}, expected {rid}")
        if op.storage_hit_count < self.ctl.prefetch_threshold:
            return op.storage_hit_count, 0   # the scheduler revokes a hit below the threshold
        op.host_indices = host_pages_of(op.storage_hit_count)
        self.ctl.prefetch_buffer.put(op)
        deadline = time.monotonic() + self.timeout
        completed = 0
        for _ in range(1 + len(op.hash_value)):   # one progress ack per batch at most, then completed_req
            ack = self._get(self.ctl.ack_prefetch_queue, f"prefetch ack for {rid}")
            if ack.rid != rid:
                raise AssertionError(f"prefetch ack for {ack.rid}, expected {rid}")
            if ack.completed_tokens is not None:
                if ack.completed_tokens < completed:
                    raise AssertionError(f"{rid}: completed tokens went back from {completed} to "
                                         f"{ack.completed_tokens}")
                completed = ack.completed_tokens
            if ack.completed_req:
                return op.storage_hit_count, completed
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"{rid}: no completed_req ack within {self.timeout} s or "
                             f"{1 + len(op.hash_value)} acks")
