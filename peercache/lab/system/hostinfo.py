"""Testbed capture: the fields of a published testbed table, as one JSON document.

``capture(root)`` runs a row of small ``collect_*`` functions, each filling
one section from one kind of source: sysfs and /proc (always through
:mod:`peercache.sysfs`, so ``root`` can be a fixture tree), pyverbs
when importable, and commands (through a runner, so a fixture can replay
them).

Missing values. A field that could not be read is ``null`` and its section
carries a ``"_missing"`` map from the field name to the reason, e.g.::

    {"fw_ver": null, ..., "_missing": {"fw_ver": "/sys/class/infiniband/mlx5_0/fw_ver does not exist"}}

Nothing is guessed. The one derived value is the active MTU of a RoCE port
when pyverbs cannot be asked: it is computed from the netdev MTU with the
kernel's own rule (``iboe_get_mtu``) and the port says so in
``active_mtu_source``.

An RDMA device's NUMA node is read from its parent device; a virtual one (rxe)
has none, so its netdev's device answers (and a virtio-net device's PCI
function above it), and ``numa_source`` beside ``numa_node`` says which
(``"rdma device"``, ``"netdev eth1 (rxe parent), its parent PCI function
0000:11:00.0"``).

When ``root`` is not ``/`` the live sources (pyverbs, commands) describe this
machine, not the fixture, so they are not used: commands come from
``<root>/commands.json`` when present (see :class:`ReplayRunner`), and
pyverbs is skipped with a reason.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from peercache.sysfs import gid_table, is_live, parse_list, proc_path, read_attr, sysfs_path

#: 2: the capture lists its sources (the commands it ran, the files it read); 1 did not.
SCHEMA_VERSION = 2
_COMMAND_TIMEOUT_S = 10


# --- command runners ------------------------------------------------------------

@dataclass
class CommandResult:
    """Exit status and output of one command."""

    returncode: int
    stdout: str
    stderr: str = ""


class Runner(Protocol):
    """Where capture gets command output from."""

    def which(self, name: str) -> str | None: ...
    def run(self, argv: list[str]) -> CommandResult | None: ...


class LiveRunner:
    """Runs commands on this machine (bounded by a timeout)."""

    def which(self, name: str) -> str | None:
        """Path of *name* on PATH, or None."""
        return shutil.which(name)

    def run(self, argv: list[str]) -> CommandResult | None:
        """Run *argv*; None when it is not installed or timed out."""
        if shutil.which(argv[0]) is None:
            return None
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return CommandResult(p.returncode, p.stdout, p.stderr)


class ReplayRunner:
    """Answers commands from a JSON file: {"which": {name: path}, "run": {"argv joined": {...}}}."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path is not None else None
        data = json.loads(self.path.read_text()) if self.path and self.path.exists() else {}
        self._which: dict[str, str] = data.get("which", {})
        self._run: dict[str, dict[str, Any]] = data.get("run", {})

    def which(self, name: str) -> str | None:
        """Recorded path of *name*, or None."""
        return self._which.get(name)

    def run(self, argv: list[str]) -> CommandResult | None:
        """Recorded result of *argv*, or None when it was not recorded."""
        r = self._run.get(" ".join(argv))
        if r is None:
            return None
        return CommandResult(int(r.get("rc", 0)), r.get("stdout", ""), r.get("stderr", ""))


# --- helpers --------------------------------------------------------------------

class _Section(dict):
    """A dict section that records why a field is null in its "_missing" map."""

    def put(self, key: str, value: Any, reason: str | None = None) -> None:
        self[key] = value
        if value is None:
            self.setdefault("_missing", {})[key] = reason or "not available"

    def put_attr(self, key: str, path: Path, convert: Callable[[str], Any] = str) -> Any:
        text, why = read_attr(path)
        if text is None:
            self.put(key, None, why)
            return None
        try:
            value = convert(text)
        except ValueError:
            self.put(key, None, f"{path}: unexpected content {text!r}")
            return None
        self.put(key, value)
        return value


def _natural_key(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _list_dir(path: Path) -> list[str]:
    try:
        return sorted((p.name for p in path.iterdir()), key=_natural_key)
    except OSError:
        return []


@dataclass
class _Ctx:
    root: Path
    runner: Runner
    live: bool


# --- collectors -----------------------------------------------------------------

def collect_host(ctx: _Ctx) -> dict[str, Any]:
    """Host name and kernel (from /proc)."""
    s = _Section()
    s.put_attr("hostname", proc_path("sys", "kernel", "hostname", root=ctx.root))
    s.put_attr("kernel", proc_path("sys", "kernel", "osrelease", root=ctx.root))
    s.put_attr("kernel_version", proc_path("version", root=ctx.root))
    arch = proc_path("sys", "kernel", "arch", root=ctx.root)
    if arch.exists() or not ctx.live:
        s.put_attr("arch", arch)
    else:  # /proc/sys/kernel/arch is new (Linux 6.1); older kernels: ask uname
        s.put("arch", os.uname().machine)
    return s


def collect_cpu(ctx: _Ctx) -> dict[str, Any]:
    """CPU model, sockets, cores and threads (from /proc/cpuinfo)."""
    s = _Section()
    path = proc_path("cpuinfo", root=ctx.root)
    text, why = read_attr(path)
    if text is None:
        for k in ("model", "sockets", "cores", "threads"):
            s.put(k, None, why)
        return s
    blocks = [b for b in re.split(r"\n\s*\n", text) if "processor" in b]
    procs = []
    for b in blocks:
        fields = {}
        for line in b.splitlines():
            k, sep, v = line.partition(":")
            if sep:
                fields[k.strip()] = v.strip()
        procs.append(fields)
    s.put("threads", len(procs) or None, f"no processor entries in {path}")
    models = {p.get("model name") for p in procs if p.get("model name")}
    s.put("model", models.pop() if len(models) == 1 else None,
          f"{path} has no 'model name'" if not models else f"several CPU models: {sorted(models)}")
    if procs and all("physical id" in p for p in procs):
        s.put("sockets", len({p["physical id"] for p in procs}))
        if all("core id" in p for p in procs):
            s.put("cores", len({(p["physical id"], p["core id"]) for p in procs}))
        else:
            s.put("cores", None, f"{path} has no 'core id' fields")
    else:
        s.put("sockets", None, f"{path} has no 'physical id' fields (VM or non-x86 kernel)")
        s.put("cores", None, f"{path} has no 'physical id' fields")
    return s


def collect_memory(ctx: _Ctx) -> dict[str, Any]:
    """Total memory (from /proc/meminfo)."""
    s = _Section()
    path = proc_path("meminfo", root=ctx.root)
    text, why = read_attr(path)
    m = re.search(r"^MemTotal:\s+(\d+) kB", text or "", re.M)
    s.put("total_bytes", int(m.group(1)) * 1024 if m else None,
          why or f"no MemTotal line in {path}")
    return s


def collect_numa(ctx: _Ctx) -> dict[str, Any]:
    """NUMA nodes with CPUs, memory and distances (from /sys/devices/system/node)."""
    s = _Section()
    base = sysfs_path("devices", "system", "node", root=ctx.root)
    names = [n for n in _list_dir(base) if re.fullmatch(r"node\d+", n)]
    if not names:
        s.put("nodes", None, f"no node* entries under {base} (kernel without NUMA support?)")
        return s
    nodes = []
    for name in names:
        n = _Section(node=int(name[4:]))
        cpus = n.put_attr("cpulist", base / name / "cpulist")
        n.put("cpu_count", len(parse_list(cpus)) if cpus is not None else None,
              "cpulist not readable")
        text, why = read_attr(base / name / "meminfo")
        m = re.search(r"MemTotal:\s+(\d+) kB", text or "")
        n.put("memory_bytes", int(m.group(1)) * 1024 if m else None,
              why or "no MemTotal in node meminfo")
        n.put_attr("distances", base / name / "distance", lambda t: [int(x) for x in t.split()])
        nodes.append(n)
    s.put("nodes", nodes)
    return s


def _rate(text: str) -> dict[str, Any]:
    m = re.fullmatch(r"(?P<g>\d+(?:\.\d+)?) Gb/sec \((?P<w>\d+)X(?: (?P<s>\w+))?\)", text)
    r = _Section(text=text)
    if not m:
        for k in ("gbps", "width", "speed", "lane_gbps"):
            r.put(k, None, f"unrecognised rate text {text!r}")
        return r
    g, w = float(m.group("g")), int(m.group("w"))
    r.put("gbps", g)
    r.put("width", w)
    r.put("speed", m.group("s"), "rate text names no lane speed")
    r.put("lane_gbps", g / w)
    return r


def _iboe_mtu(netdev_mtu: int) -> int | None:
    # Kernel rule (include/rdma/ib_addr.h iboe_get_mtu): netdev MTU minus GRH, UDP, BTH,
    # XRC, AtomicETH and ICRC headers (96 bytes), rounded down to an IB MTU.
    payload = netdev_mtu - (40 + 8 + 12 + 4 + 28 + 4)
    for ib in (4096, 2048, 1024, 512, 256):
        if payload >= ib:
            return ib
    return None


def _pyverbs_ports(ctx: _Ctx) -> tuple[dict[tuple[str, int], dict[str, Any]], str | None]:
    """Port attributes from pyverbs, keyed by (device, port); or ({}, reason)."""
    if not ctx.live:
        return {}, "not used: capture root is a fixture tree, not this machine"
    try:
        import pyverbs.device as d  # optional: rdma-core's Python binding
    except ImportError as e:
        return {}, f"pyverbs not importable ({e}); install python3-pyverbs"
    try:
        devices = d.get_device_list()
    except Exception as e:  # pyverbs raises PyverbsRDMAError when there is no device at all
        return {}, f"pyverbs found no devices ({e})"
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for dev in devices[:64]:
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        try:
            with d.Context(name=name) as c:
                attr = c.query_device()
                for port in range(1, int(attr.phys_port_cnt) + 1):
                    pa = c.query_port(port)
                    out[(name, port)] = {"active_mtu": 128 << int(pa.active_mtu),
                                         "fw_ver": attr.fw_version}
        except Exception as e:  # a device that cannot be opened is reported, not fatal
            out[(name, 0)] = {"error": f"{type(e).__name__}: {e}"}
    return out, None


#: PCIe transfer rate (GT/s) -> (generation, usable GB/s per lane after line coding:
#: 8b/10b up to Gen2, 128b/130b for Gen3-5, FLIT 242/256 for Gen6).
PCIE_LANE = {2.5: (1, 0.25), 5.0: (2, 0.5), 8.0: (3, 8 * 128 / 130 / 8), 16.0: (4, 16 * 128 / 130 / 8),
             32.0: (5, 32 * 128 / 130 / 8), 64.0: (6, 64 * 242 / 256 / 8)}


def pcie_link(speed: str, width: str, max_speed: str | None = None, max_width: str | None = None) -> dict[str, Any]:
    """A PCIe link from sysfs text ("32.0 GT/s PCIe", "16"): generation, width, usable GB/s per direction."""
    def parse(sp: str) -> float:
        try:
            return float(sp.split()[0])
        except (ValueError, IndexError):
            raise ValueError(f"PCIe link speed {sp!r} is not '<N> GT/s ...'") from None
    gt = parse(speed)
    if gt not in PCIE_LANE or not str(width).strip().isdigit():
        raise ValueError(f"PCIe link {speed!r} x{width!r}: unknown speed or width")
    gen, per_lane = PCIE_LANE[gt]
    out = {"gen": gen, "width": int(width), "gt_per_s": gt, "GBps": round(per_lane * int(width), 3)}
    if max_speed and max_width and str(max_width).strip().isdigit():
        out["max_gen"] = PCIE_LANE.get(parse(max_speed), (None,))[0]
        out["max_width"] = int(max_width)
        out["degraded"] = out["max_gen"] is not None and (out["max_gen"], out["max_width"]) != (gen, int(width))
    return out


def _device_numa(ctx: _Ctx, devdir: Path) -> tuple[str | None, str | None, str | None]:
    """(numa_node text, the ancestor it was read from or None, why none) of the sysfs device ``devdir``.

    A PCI function has ``numa_node``; a device on another bus may not (virtio-net's ``device`` is
    ``virtioN``, whose parent is the PCI function): then the nearest ancestor under
    ``/sys/devices`` that has one answers, and is named.
    """
    text, why = read_attr(devdir / "numa_node")
    if text is not None:
        return text, None, None
    try:
        real = devdir.resolve(strict=True)
    except OSError:
        return None, None, why
    top = sysfs_path("devices", root=ctx.root).resolve()
    p = real.parent
    while p != top and top in p.parents:
        text, _ = read_attr(p / "numa_node")
        if text is not None:
            return text, p.name, None
        p = p.parent
    return None, None, f"{why}, nor in any parent device of {devdir} under {top}"


def _rdma_numa(ctx: _Ctx, name: str, ddir: Path, port_netdevs: list[str | None]
               ) -> tuple[str | None, str | None, str | None]:
    """(numa_node text, where it was read, why none) of RDMA device ``name``.

    Its parent device (``<dev>/device``) when it has one; a virtual device (rxe, some bond
    devices) has none, and then its netdev's device answers: the netdev its ``parent`` file names
    (rxe), else the one its ports' GID table names (``gid_attrs/ndevs``).
    """
    if (ddir / "device").exists():
        text, via, why = _device_numa(ctx, ddir / "device")
        return text, "rdma device" + (f", {_ancestor(via)}" if via else ""), why
    parent, _ = read_attr(ddir / "parent")
    if parent:
        netdev, how = parent, "rxe parent"
    else:
        netdev, how = next((n for n in port_netdevs if n), None), "GID table"
    if netdev is None:
        return None, None, (f"{ddir / 'device'} does not exist (a virtual RDMA device) and it names no "
                            "netdev (no parent file, no GID netdev)")
    ndev = sysfs_path("class", "net", netdev, "device", root=ctx.root)
    if not ndev.exists():
        return None, None, (f"{ddir / 'device'} does not exist (a virtual RDMA device) and its netdev "
                            f"{netdev} ({how}) has no device either ({ndev} does not exist: a virtual "
                            "netdev such as veth or a bridge)")
    text, via, why = _device_numa(ctx, ndev)
    return text, f"netdev {netdev} ({how})" + (f", {_ancestor(via)}" if via else ""), why


def _ancestor(name: str) -> str:
    kind = "PCI function" if re.fullmatch(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", name) else "device"
    return f"its parent {kind} {name}"


def collect_rdma(ctx: _Ctx) -> dict[str, Any]:
    """RDMA devices and ports (sysfs, pyverbs when importable)."""
    s = _Section()
    base = sysfs_path("class", "infiniband", root=ctx.root)
    pv, pv_reason = _pyverbs_ports(ctx)
    s["pyverbs"] = {"used": not pv_reason, "reason": pv_reason}
    pv_errors = {dev: v["error"] for (dev, port), v in pv.items() if port == 0 and "error" in v}
    if pv_errors:
        s["pyverbs"]["errors"] = pv_errors  # devices pyverbs could not open or query
    if not base.is_dir():
        s["devices"] = []
        s["note"] = f"{base} does not exist: no RDMA driver loaded, no RDMA devices"
        return s
    devices = []
    for name in _list_dir(base):
        ddir = base / name
        dev = _Section(name=name)
        for attr in ("board_id", "fw_ver", "hca_type", "node_desc", "node_guid"):
            if dev.put_attr(attr, ddir / attr) == "":
                # e.g. rxe's fw_ver: the file exists and the driver writes nothing into it
                dev.put(attr, None, f"{ddir / attr} is empty (the driver reports no value)")
        speed, why_s = read_attr(ddir / "device" / "current_link_speed")
        width, why_w = read_attr(ddir / "device" / "current_link_width")
        if speed is None or width is None:
            dev.put("pcie", None, why_s or why_w)          # virtual devices (rxe) have no PCIe link
        else:
            try:
                dev.put("pcie", pcie_link(speed, width, *(read_attr(ddir / "device" / f)[0]
                                                          for f in ("max_link_speed", "max_link_width"))))
            except ValueError as e:
                dev.put("pcie", None, str(e))
        ports = []
        for pname in [p for p in _list_dir(ddir / "ports") if p.isdigit()]:
            pdir = ddir / "ports" / pname
            port = _Section(port=int(pname))
            port.put_attr("state", pdir / "state")
            port.put_attr("phys_state", pdir / "phys_state")
            link = port.put_attr("link_layer", pdir / "link_layer")
            rate_text, why = read_attr(pdir / "rate")
            port.put("rate", _rate(rate_text) if rate_text is not None else None, why)
            gids, problems = gid_table(name, int(pname), ctx.root)
            port["gids"] = gids
            v2 = [g["index"] for g in gids if g.get("type") == "RoCE v2" and g.get("ipv4")]
            port.put("roce_v2_ipv4_gid_index", v2[0] if v2 else None,
                     "no GID of type 'RoCE v2' with an IPv4 address" if link == "Ethernet"
                     else f"link layer is {link}: no RoCE GIDs")
            # netdev: the one the RoCE v2 IPv4 GID sits on, else any GID's, else device/net.
            ndevs = [g.get("ndev") for g in gids if g.get("ndev")]
            v2_ndev = [g.get("ndev") for g in gids if g["index"] in v2[:1] and g.get("ndev")]
            netdev = (v2_ndev or ndevs or _list_dir(ddir / "device" / "net") or [None])[0]
            port.put("netdev", netdev, "no GID netdev and no device/net entry")
            if netdev is not None:
                ndir = sysfs_path("class", "net", netdev, root=ctx.root)
                slaves, why = read_attr(ndir / "bonding" / "slaves")
                if slaves is not None:
                    port.put("bond_members", slaves.split())
                elif (ndir / "bonding").exists() or not ndir.exists():
                    port.put("bond_members", None, why)
                else:
                    port.put("bond_members", [])  # the netdev exists and is not a bond
                ndev_mtu, why = read_attr(ndir / "mtu")
            else:
                port.put("bond_members", None, "netdev unknown")
                ndev_mtu, why = None, "netdev unknown"
            pinfo = pv.get((name, int(pname)))
            pv_why = pv_reason or pv.get((name, 0), {}).get("error") or "no answer for this port"
            if pinfo and "active_mtu" in pinfo:
                port.put("active_mtu", pinfo["active_mtu"])
                port["active_mtu_source"] = "pyverbs query_port"
            elif link == "Ethernet" and ndev_mtu is not None and ndev_mtu.isdigit():
                port.put("active_mtu", _iboe_mtu(int(ndev_mtu)),
                         f"netdev MTU {ndev_mtu} is below the smallest RoCE MTU")
                port["active_mtu_source"] = (f"derived from {netdev} MTU {ndev_mtu} by the kernel "
                                             f"rule iboe_get_mtu (pyverbs: {pv_why})")
            else:
                port.put("active_mtu", None, "sysfs has no active MTU for this link layer and "
                         f"pyverbs gave none ({pv_why})")
            port["counters_present"] = (pdir / "counters" / "port_rcv_data").exists()
            if problems:
                port["gid_read_problems"] = problems[:8]
            ports.append(port)
        numa, source, why = _rdma_numa(ctx, name, ddir, [p.get("netdev") for p in ports])
        if numa is None:
            dev.put("numa_node", None, why)
        elif numa == "-1":
            dev.put("numa_node", None, f"kernel reports numa_node -1 (no NUMA affinity known; read from {source})")
        else:
            try:
                dev.put("numa_node", int(numa))
            except ValueError:
                dev.put("numa_node", None, f"{source}: unexpected numa_node {numa!r}")
        dev.put("numa_source", source, "no source of a NUMA node found (see numa_node's reason)")
        dev["ports"] = ports
        devices.append(dev)
    s["devices"] = devices
    return s


def _first_line(r: CommandResult | None) -> str | None:
    if r is None or r.returncode != 0:
        return None
    lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    return lines[0] if lines else None


def collect_software(ctx: _Ctx) -> dict[str, Any]:
    """glibc, rdma-core, MLNX_OFED and perftest versions (commands)."""
    s = _Section()
    run = ctx.runner.run
    ldd = _first_line(run(["ldd", "--version"]))
    m = re.search(r"(\d+\.\d+)\s*$", ldd or "")
    s.put("glibc", m.group(1) if m else None,
          "`ldd --version` did not run or printed no version" if not ldd else f"unrecognised {ldd!r}")
    rc = (_first_line(run(["dpkg-query", "-W", "-f=${Version}", "rdma-core"]))
          or _first_line(run(["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", "rdma-core"])))
    s.put("rdma_core", rc, "neither dpkg nor rpm knows an rdma-core package")
    ofed = _first_line(run(["ofed_info", "-s"]))
    s.put("mlnx_ofed", ofed.rstrip(":") if ofed else None, "`ofed_info -s` not available "
          "(MLNX_OFED not installed; inbox rdma-core drivers)")
    pv = run(["ib_read_bw", "--version"])
    m = re.search(r"Version:\s*(\S+)", (pv.stdout + pv.stderr) if pv else "")
    s.put("perftest", m.group(1) if m else None, "`ib_read_bw --version` did not run "
          "(perftest not installed?)" if pv is None else "no 'Version:' in its output")
    pkg = (_first_line(run(["dpkg-query", "-W", "-f=${Version}", "perftest"]))
           or _first_line(run(["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", "perftest"])))
    s.put("perftest_package", pkg, "no perftest package known to dpkg or rpm")
    return s


_GPU_FIELDS = ("index", "name", "driver_version", "pci.bus_id", "pcie.link.gen.current",
               "pcie.link.width.current", "pcie.link.gen.max", "pcie.link.width.max")


def collect_gpus(ctx: _Ctx) -> dict[str, Any]:
    """NVIDIA GPUs: model, driver, PCIe link (nvidia-smi)."""
    s = _Section()
    if ctx.runner.which("nvidia-smi") is None:
        s.put("devices", None, "nvidia-smi not installed: GPUs not queried")
        return s
    r = ctx.runner.run(["nvidia-smi", f"--query-gpu={','.join(_GPU_FIELDS)}",
                        "--format=csv,noheader,nounits"])
    if r is None or r.returncode != 0:
        s.put("devices", None, "nvidia-smi failed: " + (r.stderr.strip() if r else "no answer"))
        return s
    gpus = []
    for line in r.stdout.splitlines():
        if not line.strip():
            continue
        vals = [v.strip() for v in line.split(",")]
        if len(vals) != len(_GPU_FIELDS):
            s.put("devices", None, f"unexpected nvidia-smi line {line!r}")
            return s
        g = _Section()
        for k, v in zip(_GPU_FIELDS, vals):
            key = k.replace(".", "_")
            if v in ("[N/A]", "N/A", "[Not Supported]"):
                g.put(key, None, f"nvidia-smi printed {v}")
            else:
                g.put(key, int(v) if v.isdigit() else v)
        gpus.append(g)
    s.put("devices", gpus)
    return s


def collect_tools(ctx: _Ctx) -> dict[str, Any]:
    """numactl and perf availability (and perf_event_paranoid)."""
    s = _Section()
    for name, argv in (("numactl", ["numactl", "--show"]), ("perf", ["perf", "--version"])):
        t = _Section(path=ctx.runner.which(name))
        if t["path"] is None:
            t.put("usable", None, f"{name} not on PATH")
        else:
            r = ctx.runner.run(argv)
            t.put("usable", None if r is None else r.returncode == 0,
                  f"`{' '.join(argv)}` gave no answer")
            if name == "perf" and r is not None and r.returncode == 0:
                t["version"] = r.stdout.strip()
        s[name] = t
    s.put_attr("perf_event_paranoid", proc_path("sys", "kernel", "perf_event_paranoid",
                                                root=ctx.root), int)
    return s


COLLECTORS: dict[str, Callable[[_Ctx], dict[str, Any]]] = {
    "host": collect_host, "cpu": collect_cpu, "memory": collect_memory, "numa": collect_numa,
    "rdma": collect_rdma, "software": collect_software, "gpu": collect_gpus, "tools": collect_tools,
}


#: The files the collectors read (through peercache.sysfs, relative to the capture's root), listed in
#: every capture beside the commands it ran, so a reader can fill the same table by hand.
FILE_SOURCES = ("/proc/sys/kernel/{hostname,osrelease,arch}", "/proc/version", "/proc/cpuinfo", "/proc/meminfo",
                "/sys/devices/system/node/node*/{cpulist,meminfo,distance}",
                "/sys/class/infiniband/*/{board_id,fw_ver,hca_type,device/numa_node,device/current_link_*}",
                "/sys/class/infiniband/*/ports/*/{state,link_layer,rate,gids/*,gid_attrs/*}",
                "/sys/class/net/*/{mtu,bonding/slaves}", "/proc/sys/kernel/perf_event_paranoid")


class _Recorder:
    """A runner that notes every command asked of it (and whether it answered), for the capture's sources."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.commands: list[dict[str, Any]] = []

    def which(self, name: str) -> str | None:
        return self.inner.which(name)

    def run(self, argv: list[str]) -> CommandResult | None:
        r = self.inner.run(argv)
        self.commands.append({"command": " ".join(argv),
                              "answered": r is not None and r.returncode == 0})
        return r


def capture(root: str | os.PathLike = "/", runner: Runner | None = None) -> dict[str, Any]:
    """The testbed document of the machine (or fixture tree) at *root*."""
    root = Path(root)
    live = is_live(root)
    if runner is None:
        runner = LiveRunner() if live else ReplayRunner(root / "commands.json")
    recorder = _Recorder(runner)
    ctx = _Ctx(root=root, runner=recorder, live=live)
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "root": str(root), "live": live}
    for key, collect in COLLECTORS.items():
        try:
            doc[key] = collect(ctx)
        except Exception as e:  # one broken source must not lose the rest of the capture
            doc[key] = {"_missing": {"*": f"collect_{key} failed: {type(e).__name__}: {e}"}}
    doc["sources"] = {"commands": recorder.commands, "files": list(FILE_SOURCES),
                      "pyverbs": (doc.get("rdma") or {}).get("pyverbs")}
    return doc


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Short view for meta blocks: host, kernel, CPU model, NICs with rate and NUMA node."""
    nics = []
    for d in doc.get("rdma", {}).get("devices", []):
        p = (d.get("ports") or [{}])[0]
        rate = p.get("rate") or {}
        nics.append({"name": d.get("name"), "rate_gbps": rate.get("gbps"),
                     "numa_node": d.get("numa_node"), "numa_source": d.get("numa_source"),
                     "link_layer": p.get("link_layer"),
                     "active_mtu": p.get("active_mtu"), "netdev": p.get("netdev"),
                     "roce_v2_gid_index": p.get("roce_v2_ipv4_gid_index"),
                     "fw_ver": d.get("fw_ver"), "pcie": d.get("pcie")})
    host, cpu = doc.get("host", {}), doc.get("cpu", {})
    return {"host": host.get("hostname"), "kernel": host.get("kernel"),
            "cpu_model": cpu.get("model"), "sockets": cpu.get("sockets"),
            "threads": cpu.get("threads"), "memory_bytes": doc.get("memory", {}).get("total_bytes"),
            "numa_nodes": len(doc.get("numa", {}).get("nodes") or []), "nics": nics}
