"""Port counters around a run: an independent check of the bytes a tool reports.

Before and after each point that names RDMA devices, the consumer's
``port_rcv_data`` / ``port_xmit_data`` counters (4-byte units) and the
port's ``rate`` are read on the host that ran it — through the host, so an
SSH host is read remotely. The counters span the whole run (warm-up and
set-up included), so they bound the measured bytes from above: a figure
that claims more bytes than the port moved, or a rate above the summed line
rate, is flagged instead of reported silently.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from peercache.lab.system import portcounters
from peercache.lab.system.slowness import scaled
from peercache.lab.system.portcounters import (COUNTER_UNIT_BYTES, DEFAULT_TOLERANCE, PortCheck, PortSample,
                                               delta, parse_rate)
from peercache.sysfs import sysfs_path

if TYPE_CHECKING:                  # a host of peercache.lab.launch: any object with run(argv, timeout)
    from peercache.lab.launch.hosts import Host

#: Seconds reading a port's counters or rate from sysfs may take on a plain machine.
COUNTER_READ_S = 15.0


def _port_dir(device: str, port: int):
    return sysfs_path("class", "infiniband", device, "ports", str(port))


def _netdev_sample(host: Host, dev: str, port: int) -> PortSample | None:
    """Bytes of the port's netdev, for ports without data counters (Soft-RoCE); None if unreadable."""
    r = host.run(["cat", str(_port_dir(dev, port) / "gid_attrs" / "ndevs" / "0")], timeout=scaled(COUNTER_READ_S))
    ndev = r.stdout.strip()
    if r.rc != 0 or not ndev or "/" in ndev:
        return None
    stats = sysfs_path("class", "net", ndev, "statistics")
    r = host.run(["cat", str(stats / "rx_bytes"), str(stats / "tx_bytes")], timeout=scaled(COUNTER_READ_S))
    vals = r.stdout.split()
    if r.rc != 0 or len(vals) != 2 or not all(v.isdigit() for v in vals):
        return None
    return PortSample(dev, port, int(vals[0]), int(vals[1]), time.time(), unit_bytes=1, source=f"netdev:{ndev}")


def sample_ports(host: Host, devices: Sequence[str], port: int = 1) -> dict[str, PortSample]:
    """Read each device's counters on ``host`` now (unreadable -> values None with the reason).

    A port without ``counters/port_*_data`` (Soft-RoCE has none) is read
    through its netdev's byte counters instead, which the sample records.
    """
    out = {}
    for dev in devices:
        base = _port_dir(dev, port) / "counters"
        r = host.run(["cat", str(base / "port_rcv_data"), str(base / "port_xmit_data")], timeout=scaled(COUNTER_READ_S))
        vals = r.stdout.split()
        if r.rc == 0 and len(vals) == 2 and all(v.isdigit() for v in vals):
            out[dev] = PortSample(dev, port, int(vals[0]), int(vals[1]), time.time())
            continue
        out[dev] = _netdev_sample(host, dev, port) or PortSample(
            dev, port, None, None, time.time(),
            reason=f"cannot read counters of {dev}/{port} on {host}: {(r.stderr or r.stdout).strip()[:200]}")
    return out


def line_rates(host: Host, devices: Sequence[str], port: int = 1) -> dict[str, float | None]:
    """Line rate of each device's port in bytes/s (None when unreadable)."""
    rates: dict[str, float | None] = {}
    for dev in devices:
        r = host.run(["cat", str(_port_dir(dev, port) / "rate")], timeout=scaled(COUNTER_READ_S))
        try:
            rates[dev] = parse_rate(r.stdout.strip()) / 8 if r.rc == 0 else None
        except ValueError:
            rates[dev] = None
    return rates


def check(before: dict[str, PortSample], after: dict[str, PortSample], rates: dict[str, float | None],
          figure_Bps: float | None, window_s: float | None, direction: str = "rcv",
          tolerance: float = DEFAULT_TOLERANCE) -> PortCheck:
    """:func:`portcounters.check` of a figure over the samples taken around its run and the
    line rates of the ports (the summed rate is unknown when any port's is)."""
    ds = [delta(before[d], after[d]) for d in before if d in after]
    known = [r for r in rates.values() if r]
    line = sum(known) if known and len(known) == len(rates) else None
    return portcounters.check(ds, line, figure_Bps, window_s, direction, tolerance)


__all__ = ["sample_ports", "line_rates", "check", "PortCheck", "COUNTER_UNIT_BYTES"]
