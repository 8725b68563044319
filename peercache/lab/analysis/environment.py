"""The report's test-environment table, filled from the testbed capture (``system/hostinfo``).

One :class:`Field` per line of the published table (topology, NICs, link, line rate, CPU,
memory, NUMA, kernel, rdma-core/OFED, perftest, PeerCache revision). A field the capture
could not fill is ``None`` with the reason the capture gave (or why no capture was there);
nothing is guessed. :func:`capture_commands` lists what the capture ran and read, and
:func:`why_no_commands` says why a capture lists none (made by an older lab, before captures
recorded their sources: Snakemake keeps a capture whose file exists, so a re-run reused it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from peercache.lab.analysis import collect

ROLES = ("producer", "consumer")


@dataclass
class Field:
    """One line of the test-environment table: a value, or None and why."""

    name: str
    value: str | None
    reason: str | None = None


def load_captures(folder) -> tuple[dict[str, dict[str, Any]], str | None]:
    """role -> capture document from ``<folder>/<role>.json``; and why there are none, if so."""
    if folder is None or str(folder) == "":
        return {}, "no testbed capture folder given to the report"
    folder = Path(folder)
    caps = {}
    for role in ROLES:
        p = folder / f"{role}.json"
        if p.exists():
            caps[role] = json.loads(p.read_text())
    if not caps:
        return {}, f"no testbed capture under {folder} (producer.json / consumer.json)"
    return caps, None


def cluster_members(folder) -> list[dict[str, Any]]:
    """The listed hosts of a cluster testbed's captures (``<folder>/<name>.json`` with a ``name``), in name
    order: name, host spec, address and roles; none for a two-host testbed. The pair's own captures
    (``producer.json``, ``consumer.json``) name the member they were taken on, and are not counted again."""
    if folder is None or str(folder) == "" or not Path(folder).is_dir():
        return []
    out = []
    for p in sorted(Path(folder).glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("name") == p.stem and doc.get("roles"):
            out.append({k: doc.get(k) for k in ("name", "host_spec", "address", "roles")})
    # a two-host testbed's own pair (its captures name themselves producer and consumer) is no cluster
    return [] if {m["name"] for m in out} <= {"producer", "consumer"} else out


def _missing(section: dict[str, Any] | None, key: str) -> str | None:
    return ((section or {}).get("_missing") or {}).get(key) or ((section or {}).get("_missing") or {}).get("*")


def _per_role(caps: dict[str, dict], get: Callable[[dict], tuple[str | None, str | None]]) -> tuple[str | None,
                                                                                                    str | None]:
    """One value when both hosts agree, else 'producer: A; consumer: B'; None with the reasons when none."""
    got = {role: get(doc) for role, doc in caps.items()}
    vals = {role: v for role, (v, _) in got.items() if v is not None}
    if not vals:
        reasons = list(dict.fromkeys(r for _, r in got.values() if r))
        return None, "; ".join(reasons) or "not in the capture"
    if len(set(vals.values())) == 1 and len(vals) == len(got):
        return next(iter(vals.values())), None
    return "; ".join(f"{role}: {vals.get(role, 'unknown (' + (got[role][1] or '?') + ')')}"
                     for role in got), None


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f} GiB"


def _devices(doc: dict) -> list[dict]:
    return list((doc.get("capture") or {}).get("rdma", {}).get("devices") or [])


def _no_devices(doc: dict) -> str:
    rdma = (doc.get("capture") or {}).get("rdma") or {}
    return rdma.get("note") or _missing(rdma, "devices") or "the capture lists no RDMA device"


def _nics(doc):
    devs = _devices(doc)
    if not devs:
        return None, _no_devices(doc)
    models = list(dict.fromkeys(str(d.get("hca_type") or d.get("board_id") or "model unknown") for d in devs))
    return f"{len(devs)} x {', '.join(models)} ({', '.join(d['name'] for d in devs)})", None


def _firmware(doc):
    devs = _devices(doc)
    if not devs:
        return None, _no_devices(doc)
    fw = list(dict.fromkeys(d.get("fw_ver") for d in devs if d.get("fw_ver")))
    boards = list(dict.fromkeys(d.get("board_id") for d in devs if d.get("board_id")))
    if not fw:
        return None, _missing(devs[0], "fw_ver")
    return f"FW {', '.join(fw)}" + (f", board {', '.join(boards)}" if boards else ""), None


def _ports(doc) -> list[dict]:
    return [p for d in _devices(doc) for p in (d.get("ports") or [])]


def _link(doc):
    ports = _ports(doc)
    if not ports:
        return None, _no_devices(doc)
    parts = []
    for key, fmt in (("link_layer", "{}"), ("roce_v2_ipv4_gid_index", "RoCE v2, GID index {}"),
                     ("active_mtu", "MTU {}")):
        vals = list(dict.fromkeys(p.get(key) for p in ports if p.get(key) is not None))
        if vals:
            parts.append(fmt.format("/".join(str(v) for v in vals)))
        else:
            parts.append(f"{key.replace('_', ' ')} unknown ({_missing(ports[0], key) or 'not captured'})")
    return ", ".join(parts), None


def _rate(doc):
    ports = _ports(doc)
    if not ports:
        return None, _no_devices(doc)
    rates = list(dict.fromkeys((p.get("rate") or {}).get("gbps") for p in ports))
    if rates == [None]:
        return None, _missing(ports[0], "rate") or "no rate in the capture"
    return " / ".join(f"{r:g} Gb/s" if r is not None else "unknown" for r in rates) + " per port", None


def _cpu(doc):
    cpu = (doc.get("capture") or {}).get("cpu") or {}
    if not cpu.get("model"):
        return None, _missing(cpu, "model") or "no CPU section in the capture"
    sockets = f"{cpu['sockets']} x " if cpu.get("sockets") else ""
    counts = [f"{cpu[k]} {k}" for k in ("cores", "threads") if cpu.get(k)]
    return f"{sockets}{cpu['model']}" + (f" ({', '.join(counts)})" if counts else ""), None


def _memory(doc):
    cap = doc.get("capture") or {}
    total = (cap.get("memory") or {}).get("total_bytes")
    if total is None:
        return None, _missing(cap.get("memory"), "total_bytes") or "no memory section in the capture"
    nodes = (cap.get("numa") or {}).get("nodes") or []
    per = [_gib(n["memory_bytes"]) for n in nodes if n.get("memory_bytes")]
    return _gib(total) + (f" (per NUMA node {', '.join(per)})" if len(per) > 1 else ""), None


def _numa(doc):
    cap = doc.get("capture") or {}
    nodes = (cap.get("numa") or {}).get("nodes")
    if not nodes:
        return None, _missing(cap.get("numa"), "nodes") or "no NUMA section in the capture"
    text = f"{len(nodes)} node(s): " + ", ".join(f"node {n['node']} CPUs {n.get('cpulist')}" for n in nodes)
    dist = [d for n in nodes for d in (n.get("distances") or [])]
    if len(nodes) > 1 and dist:
        text += f"; distances {min(dist)} (local) / {max(dist)} (remote)"
    devs = _devices(doc)
    if devs:
        text += "; NIC → node: " + ", ".join(
            f"{d['name']} → {d['numa_node'] if d.get('numa_node') is not None else 'unknown'}" for d in devs)
    else:
        text += f"; NIC → node: none ({_no_devices(doc)})"
    return text, None


def _kernel(doc):
    host = (doc.get("capture") or {}).get("host") or {}
    sw = (doc.get("capture") or {}).get("software") or {}
    if not host.get("kernel"):
        return None, _missing(host, "kernel") or "no host section in the capture"
    return f"Linux {host['kernel']}" + (f", {host['arch']}" if host.get("arch") else "") + (
        f", glibc {sw['glibc']}" if sw.get("glibc") else ""), None


def _software(key: str, label: str):
    def get(doc):
        sw = (doc.get("capture") or {}).get("software") or {}
        return (f"{label} {sw[key]}" if sw.get(key) else None), _missing(sw, key) or f"no {key} in the capture"
    return get


def _ofed(doc):
    rc, why_rc = _software("rdma_core", "rdma-core")(doc)
    ofed, why_ofed = _software("mlnx_ofed", "MLNX_OFED")(doc)
    if rc is None and ofed is None:
        return None, f"{why_rc}; {why_ofed}"
    return ", ".join(v for v in (rc, ofed) if v) + ("" if ofed else f" (no MLNX_OFED: {why_ofed})"), None


def _perftest(doc):
    v, why = _software("perftest", "perftest")(doc)
    pkg = ((doc.get("capture") or {}).get("software") or {}).get("perftest_package")
    return (v + (f" (package {pkg})" if pkg else "") if v else None), why


def _topology(caps: dict[str, dict]) -> tuple[str | None, str | None]:
    hosts = []
    for role, doc in caps.items():
        name = (doc.get("summary") or {}).get("host")
        hosts.append(f"{role} {doc.get('host_spec', '?')}" + (f" ({name}" if name else " (")
                     + (f", {doc['address']})" if doc.get("address") else ")").replace("(, ", "(")
                     .replace(" ()", ""))
    same = len({(d.get("summary") or {}).get("host") for d in caps.values()}) == 1 and len(caps) > 1
    text = f"{len(caps)} hosts: " + " / ".join(hosts)
    notes = [d.get("note") for d in caps.values() if d.get("note")]
    if same:
        text += "; both on one machine"
    return text + ("; " + "; ".join(dict.fromkeys(notes)) if notes else ""), None


def _revision(runs: pd.DataFrame) -> tuple[str | None, str | None]:
    revs = [r for r in dict.fromkeys(runs.get("git_revision", pd.Series(dtype=object)).dropna()) if r]
    if not revs:
        return None, "no git revision recorded in the runs' meta blocks"
    return ", ".join(str(r) for r in revs), None


#: (label, getter over one host's capture document) in the published table's order.
_HOST_FIELDS: list[tuple[str, Callable[[dict], tuple[str | None, str | None]]]] = [
    ("NICs (model)", _nics), ("NIC firmware", _firmware), ("link layer, RoCE, GID index, MTU", _link),
    ("line rate", _rate), ("CPU", _cpu), ("memory", _memory), ("NUMA (NIC → node)", _numa),
    ("OS / kernel", _kernel), ("rdma-core / OFED", _ofed), ("perftest", _perftest),
]


def environment_fields(caps: dict[str, dict], runs: pd.DataFrame, why_none: str | None = None,
                       members: list[dict[str, Any]] | None = None) -> list[Field]:
    """The test-environment table: one Field per published line, None with a reason where unreadable;
    ``members``: a cluster testbed's hosts (:func:`cluster_members`), listed in the topology line."""
    out: list[Field] = []
    if caps and members:
        same = len({(d.get("summary") or {}).get("host") for d in caps.values()}) == 1
        out.append(Field("topology", f"{len(members)} hosts (a cluster): " + " / ".join(
            f"{m['name']} {m['host_spec']} ({m['address']}; {', '.join(m['roles'])})" for m in members)
            + ("; all on one machine" if same and all(str(m["host_spec"]).startswith(("netns:", "local"))
                                                     for m in members) else "")))
    elif caps:
        out.append(Field("topology", *_topology(caps)))
    else:
        hosts = {}
        for run in runs.to_dict("records")[:1]:
            hosts = collect.run_field(run, "hosts") or {}
        names = [f"{role} {h.get('host')}" for role, h in hosts.items() if isinstance(h, dict) and h.get("host")]
        out.append(Field("topology", f"{len(names)} hosts: " + " / ".join(names) if names else None,
                         None if names else why_none))
    for label, get in _HOST_FIELDS:
        if caps:
            out.append(Field(label, *_per_role(caps, get)))
        else:
            out.append(Field(label, None, why_none))
    out.append(Field("PeerCache revision", *_revision(runs)))
    return out


def why_no_commands(caps: dict[str, dict], folder=None) -> str:
    """Why the captures in ``folder`` list no commands, and what to do (a sentence)."""
    if not caps:
        return "no testbed capture, so no commands to list"
    old = [role for role, doc in caps.items() if not (doc.get("capture") or {}).get("sources")]
    if not old:
        return "the capture ran no commands"
    where = Path(folder) if folder else Path("data/raw/<testbed>/testbed")
    versions = sorted({str((caps[r].get("capture") or {}).get("schema_version", "?")) for r in old})
    return (f"the {' and '.join(old)} capture(s) ({', '.join(f'{where / r}.json' for r in old)}, hostinfo "
            f"schema {', '.join(versions)}) were made before captures recorded their commands, and a later run "
            f"kept them; remove {where}/ and run `make run` again to capture the hosts afresh")


def capture_commands(caps: dict[str, dict]) -> list[str]:
    """What the capture ran (with the hosts it answered on) and the files it read, one line each."""
    cmds: dict[str, list[str]] = {}
    files: dict[str, None] = {}
    for role, doc in caps.items():
        src = (doc.get("capture") or {}).get("sources") or {}
        for c in src.get("commands") or []:
            cmds.setdefault(c["command"], [])
            if c.get("answered"):
                cmds[c["command"]].append(role)
        for f in src.get("files") or []:
            files[f] = None
    lines = [f"{c}" + ("" if who else "   # no answer") for c, who in cmds.items()]
    lines += [f"cat {f}" for f in files]
    return lines
