"""NUMA binding of lab commands: ``numactl --cpunodebind=N --membind=N``.

The node comes from the testbed capture (a NIC's ``numa_node`` in sysfs).
The binding actually applied — or the reason none was — is a small record
that goes into the run's meta block (``RunMeta.numa_binding[side]``), so a
reader can tell a bound run from an unbound one.
"""
from __future__ import annotations

from typing import Any


def numa_binding(node: int | None, numactl_available: bool,
                 device: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """(argv prefix, record) binding CPUs and memory to ``node``, or no prefix with the reason."""
    record: dict[str, Any] = {"node": None, "device": device}
    if node is None or isinstance(node, bool) or not isinstance(node, int) or node < 0:
        # sysfs says -1 when the platform does not report locality (VMs,
        # single-socket boards); binding to a guess would be worse than none.
        record["reason"] = (f"NUMA node unknown ({node!r})"
                            + (f" for device {device}" if device else "")
                            + "; command not bound")
        return [], record
    if not numactl_available:
        record["reason"] = (f"numactl not installed on the host; command not bound to node "
                            f"{node} (apt-get install numactl)")
        return [], record
    prefix = ["numactl", f"--cpunodebind={node}", f"--membind={node}"]
    record.update(node=node, cpunodebind=node, membind=node, prefix=prefix)
    return prefix, record


def bind(argv: list[str], node: int | None, numactl_available: bool,
         device: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """``argv`` wrapped by :func:`numa_binding`, with the record."""
    prefix, record = numa_binding(node, numactl_available, device)
    return [*prefix, *argv], record
