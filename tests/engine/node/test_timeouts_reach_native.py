"""The engine's time bounds (peercache.timeouts) reach the native data path through a node's config."""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from conftest import free_port, scaled
from peercache.config import NodeConfig
from peercache.node import Node
from peercache.timeouts import Timeouts
from peercache.transport.base import make_ops


@pytest.fixture
def silent_peer():
    """A listening socket that accepts (the kernel's backlog does) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def _read_silent(node: Node, port: int) -> tuple[float, list]:
    ops = make_ops(1)
    ops[0] = (1, 0, 0, 0, 64, 0)
    dest = np.zeros(64, np.uint8)
    t0 = time.monotonic()
    try:
        status = node.transport.read_batch("silent", {"host": "127.0.0.1", "port": port}, ops, [dest]).tolist()
    except (ConnectionError, OSError) as e:
        status = [str(e)]
    return time.monotonic() - t0, status


@pytest.mark.parametrize("io_s, timeout", [(0.5, 6.0), (None, 2.0)], ids=["io_s=0.5", "io_s=None"])
def test_a_tcp_read_of_a_silent_peer_ends_within_the_configs_io_bound(silent_peer, io_s, timeout):
    cfg = NodeConfig(discovery_addr=f"127.0.0.1:{free_port()}", host_discovery=True, timeout=timeout,
                     timeouts=Timeouts(io_s=io_s))
    node = Node(**cfg.node_kwargs())
    try:
        bound = io_s if io_s is not None else timeout      # None: the whole read's bound, as before Timeouts
        assert node.transport.io_timeout == bound
        took, status = _read_silent(node, silent_peer)
    finally:
        node.close()
    assert status and status != [0], status                 # not a hit
    # the C client's socket calls waited for the bound given, not for the other one
    assert bound * 0.9 <= took < bound + scaled(2.0), (took, bound)
    assert io_s is None or took < timeout, (took, timeout)


def test_the_native_client_takes_no_bound_of_its_own():
    from peercache.transport.base import native_module
    mod, _ = native_module()
    with pytest.raises(ValueError, match="timeout_s must be a positive number of seconds, got 0"):
        mod.tcp_connect("127.0.0.1", 1, 1, 0.0)
