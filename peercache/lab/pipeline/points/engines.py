"""What the kinds of other engines share (``mooncake_te``, ``nixl``, ``peercache_pypi``): their declaration
(:class:`EngineRun`: a PeerCache point's page size, batch and threads, the testbed's first device over
rdma), where each engine's venv is on a host, and the skip, with its reason, of a point whose venv is
not there.

Each engine lives in a venv of its own made by ``make engines`` (so none of them is a dependency of
PeerCache): a relative path here is under this checkout on hosts of this machine, and the same path under
the checkout on a remote host (a shared install, as for a host's ``python``).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peercache.lab.pipeline.points.declare import Timed, sizes, timing
from peercache.lab.system.slowness import HOST_COMMAND_S

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: The checkout this package runs from (a kind uses the harness, not the pipeline's definitions module,
#: so it does not take experiments.CHECKOUT_ROOT; the same directory).
CHECKOUT_ROOT = Path(__file__).resolve().parents[4]


class EngineRun(Timed):
    """An engine's pair at a PeerCache point's shape: its point name (``prefix``, protocol, threads, page size,
    batch), its parameters (those of :attr:`shape`, one process, the first device over rdma, and the
    variables of :attr:`passed_on` where a part changes them) and the device its ports count on."""

    prefix = ""                                  #: point-name prefix ("mc", "nixl", "pcpypi")
    shape: tuple[str, ...] = ("protocol", "page_size", "batch_size", "threads")
    passed_on: tuple[str, ...] = ()              #: the kind's own variables, kept where a part sets them

    @classmethod
    def point_name(cls, one):
        return f"{cls.prefix}_{one['protocol']}_t{one['threads']}_s{sizes(one['page_size'])}_b{one['batch_size']}"

    @classmethod
    def params(cls, one, devices) -> dict[str, Any]:
        p = {**{k: one[k] for k in cls.shape}, "processes": 1,
             "devices": devices[:1] if one["protocol"] == "rdma" else []}
        p.update(cls.changed(one, *cls.passed_on))
        return {**p, **timing(one)}

    @classmethod
    def port_devices(cls, params, testbed_devices):
        return list(params.get("devices") or [])


def engine_path(rel: str) -> str:
    """The absolute path of ``rel`` (a file in an engine venv) under this checkout."""
    return str(CHECKOUT_ROOT / rel)


def missing_venv_reason(venv: str, binary: str, missing_on: list[str]) -> str:
    """The skip reason of a point whose engine venv lacks ``binary`` on the hosts ``missing_on`` (pure)."""
    return (f"engine venv {venv} missing: {binary} is not an executable on {', '.join(missing_on)}; "
            f"run `make engines` (it makes {venv})")


def venv_missing(pr: PointRun, th: TestbedHosts, venv: str, binary: str) -> str | None:
    """Why the point cannot run (the engine's executable absent on either host), or None."""
    path = engine_path(binary)
    missing = []
    for role in ("producer", "consumer"):
        host = th.host(role)
        r = host.run(["test", "-x", path], timeout=pr.scaled(HOST_COMMAND_S))
        if r.rc != 0:
            missing.append(f"{role} {host}")
    return missing_venv_reason(venv, path, missing) if missing else None


def skip_for(pr: PointRun, reason: str) -> None:
    """Record the point as skipped with ``reason`` (its headline row) and say so on stderr."""
    pr.point.skip_reason = reason
    pr.skip()
    print(f"{pr.run_id}: skipped: {reason}", file=sys.stderr, flush=True)


def engine_sides(pr: PointRun, th: TestbedHosts, venv: str, binary: str) -> tuple[list[str], str | None, str | None] | None:
    """An engine point's devices and each side's device (the first it has of them), or None when the point
    cannot run and was recorded skipped with why (the engine's venv missing on a host, or rdma without a
    device)."""
    why = venv_missing(pr, th, venv, binary)
    devs = list(pr.point.params.get("devices") or [])
    if why is None and pr.point.params["protocol"] == "rdma" and not devs:
        why = "protocol rdma and the testbed names no RDMA device"
    if why:
        skip_for(pr, why)
        return None
    return (devs, (pr.tb.role_devices("producer", devs) or [None])[0],
            (pr.tb.role_devices("consumer", devs) or [None])[0])
