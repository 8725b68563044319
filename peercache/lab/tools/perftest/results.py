"""perftest's parsed results: the bandwidth and latency records the text and JSON parsers fill.

Part of :mod:`peercache.lab.tools.perftest` (its docstring says the units, sides and formats).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

#: Bytes per second of one printed unit (see the package docstring).
BW_UNITS = {"MB/sec": 1048576.0, "MiB/sec": 1048576.0, "Gb/sec": 125_000_000.0}

#: Title line of the header block -> tool.
_TITLE_TOOL = {"RDMA_Read": "ib_read_bw", "RDMA_Write": "ib_write_bw", "Send": "ib_send_bw",
               "Atomic": "ib_atomic_bw"}
_LAT_TITLE_TOOL = {"RDMA_Read": "ib_read_lat", "RDMA_Write": "ib_write_lat", "Send": "ib_send_lat",
                   "Atomic": "ib_atomic_lat"}


@dataclass
class PerftestRow:
    """One printed result line, as printed and normalised."""

    table: str                   #: "main", or "local" / "remote" (--report-both)
    line_no: int                 #: 1-based line of the source it was read from
    size_bytes: int
    iterations: int
    raw_unit: str | None         #: "MB/sec", "MiB/sec", "Gb/sec"; None if the source did not say
    bw_average_raw: float
    bw_peak_raw: float | None    #: None: not measured (printed 0.00: duration mode or -N)
    msg_rate_mpps: float | None  #: None when the table has no MsgRate column (perftest 1.x)
    cpu_util_pct: float | None = None  #: None when the CPU_Util[%] column was not printed

    def _bytes_per_s(self, raw: float | None) -> float | None:
        if raw is None or self.raw_unit is None:
            return None
        return raw * BW_UNITS[self.raw_unit]

    @property
    def bw_average_Bps(self) -> float | None:
        """Average bandwidth in bytes/s (None when the unit is unknown)."""
        return self._bytes_per_s(self.bw_average_raw)

    @property
    def bw_peak_Bps(self) -> float | None:
        """Peak bandwidth in bytes/s (None when not measured or unit unknown)."""
        return self._bytes_per_s(self.bw_peak_raw)

    @property
    def bw_average_gbps(self) -> float | None:
        """Average bandwidth in Gbit/s."""
        b = self.bw_average_Bps
        return None if b is None else b * 8 / 1e9

    @property
    def bw_peak_gbps(self) -> float | None:
        """Peak bandwidth in Gbit/s."""
        b = self.bw_peak_Bps
        return None if b is None else b * 8 / 1e9

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with raw and normalised values."""
        d = dataclasses.asdict(self)
        d.update(bw_average_Bps=self.bw_average_Bps, bw_peak_Bps=self.bw_peak_Bps,
                 bw_average_gbps=self.bw_average_gbps, bw_peak_gbps=self.bw_peak_gbps)
        return d


@dataclass
class PerftestResult:
    """A parsed perftest bandwidth report: header block, result rows, and notes."""

    source: str
    test: str | None = None                          #: title, e.g. "RDMA_Read BW Test"
    header: dict[str, str] = field(default_factory=dict)  #: header block as printed
    rows: list[PerftestRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   #: warnings and lines kept but not parsed
    fmt: str = "text"                                #: "text" or "json"

    @property
    def tool(self) -> str | None:
        """ib_read_bw / ib_write_bw / ib_send_bw, from the title (None if not printed)."""
        if self.test:
            return _TITLE_TOOL.get(self.test.split()[0])
        return None

    @property
    def raw_unit(self) -> str | None:
        """The bandwidth label of the tables (None if unknown)."""
        units = {r.raw_unit for r in self.rows}
        return units.pop() if len(units) == 1 else None

    @property
    def bidirectional(self) -> bool:
        """True for a -b run (title says so, or --report-both tables are present)."""
        return bool(self.test and "Bidirectional" in self.test) or any(
            r.table != "main" for r in self.rows)

    def _header_int(self, key: str) -> int | None:
        v = self.header.get(key)
        if v is None:
            return None
        m = re.fullmatch(r"(-?\d+)(?:\[B\])?", v.strip())
        return int(m.group(1)) if m else None

    @property
    def info(self) -> dict[str, Any]:
        """Typed view of the header block (absent keys are None)."""
        h = self.header
        return {
            "test": self.test, "tool": self.tool,
            "device": h.get("Device"), "qps": self._header_int("Number of qps"),
            "transport": h.get("Transport type"), "connection": h.get("Connection type"),
            "using_srq": h.get("Using SRQ"), "dual_port": h.get("Dual-port"),
            "tx_depth": self._header_int("TX depth"), "rx_depth": self._header_int("RX depth"),
            "cq_moderation": self._header_int("CQ Moderation"),
            "mtu_bytes": self._header_int("Mtu"), "link_type": h.get("Link type"),
            "gid_index": self._header_int("GID index" if "GID index" in h else "Gid index"),
            "max_inline_bytes": self._header_int("Max inline data"),
            "outstand_reads": self._header_int("Outstand reads"),
            "rdma_cm": h.get("rdma_cm QPs"), "data_exchange": h.get("Data ex. method"),
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (header, info, rows with normalised values, notes)."""
        return {"source": self.source, "fmt": self.fmt, "info": self.info, "header": self.header,
                "rows": [r.to_dict() for r in self.rows], "notes": self.notes}


#: Latency columns -> (tidy metric, the column's printed name).
LAT_COLUMNS = {
    "t_min_us": ("latency_min", "t_min[usec]"), "t_max_us": ("latency_max", "t_max[usec]"),
    "t_typical_us": ("latency_typical", "t_typical[usec]"),  # the median
    "t_avg_us": ("latency_avg", "t_avg[usec]"), "t_stdev_us": ("latency_stdev", "t_stdev[usec]"),
    "p99_us": ("latency_p99", "99% percentile[usec]"),
    "p999_us": ("latency_p999", "99.9% percentile[usec]"),
}


@dataclass
class PerftestLatencyRow:
    """One printed latency result line (usec, as printed); None: the layout has no such column."""

    table: str
    line_no: int                 #: 1-based line of the source (0: from a JSON file)
    size_bytes: int
    iterations: int
    t_min_us: float | None = None
    t_max_us: float | None = None
    t_typical_us: float | None = None   #: the median
    t_avg_us: float | None = None
    t_stdev_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    tps: float | None = None            #: "tps average" (transactions/s), duration mode only
    cpu_util_pct: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the row."""
        return dataclasses.asdict(self)


@dataclass
class PerftestLatencyResult(PerftestResult):
    """A parsed perftest latency report: header block, result rows (usec), and notes."""

    rows: list[PerftestLatencyRow] = field(default_factory=list)  # type: ignore[assignment]

    @property
    def tool(self) -> str | None:
        """ib_read_lat / ib_write_lat / ib_send_lat, from the title (None if not printed)."""
        if self.test:
            return _LAT_TITLE_TOOL.get(self.test.split()[0])
        return None

    @property
    def raw_unit(self) -> str | None:
        """Latency tables are printed in usec."""
        return "usec"

    @property
    def bidirectional(self) -> bool:
        """Latency tests have no bidirectional mode."""
        return False
