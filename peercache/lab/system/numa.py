"""NUMA binding of lab commands: ``numactl --cpunodebind=N --membind=N``, and whether it took effect.

The node comes from the testbed (its ``numa:`` map) or the testbed capture (a
NIC's ``numa_node`` in sysfs). The binding actually applied — or the reason
none was — is a small record that goes into the run's meta block
(``RunMeta.numa_binding[side]``), so a reader can tell a bound run from an
unbound one; beside it, the evidence read from the measured processes
themselves and :func:`judge`'s verdict on it (bound, unbound, wrong_node).
"""
from __future__ import annotations

from typing import Any

from peercache import sysfs


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


# --- evidence that a binding took effect -------------------------------------------------
#
# cpusample writes, for each process of a measured tree, a ``binding`` record read from the
# process itself (see cpusample.read_binding). :func:`judge` decides from those records alone
# whether the side ran where it was meant to. What it relies on:
#
# - ``Cpus_allowed_list`` is the affinity ``numactl --cpunodebind`` sets.
# - ``Mems_allowed_list`` is the *cpuset's* memory nodes: ``numactl --membind`` sets a memory
#   policy and leaves it alone (it stays "0-1" on a 2-node host). The policy shows in
#   ``numa_maps`` (``bind:1`` on every mapping of a bound process, ``default`` otherwise), so
#   memory counts as confined to a node when the cpuset allows only it *or* every mapping of
#   the process's own memory has a policy placing it there (``bind:<node>``; ``local`` on a process
#   whose CPUs are that node's, as OpenBLAS sets on its buffers).
# - "Resident pages on the node" are those of the process's own memory (anonymous, shm, memfd:
#   the pool buffers): pages of binaries and libraries are the page cache's, placed wherever
#   whoever first read them ran, whatever this process's binding.
#
# On a host with one NUMA node every process is on node 0 whether bound or not; the judge
# says "bound" (what it checks holds), and ``explicit`` says whether a binding was applied
# (a bind policy on its memory); nothing is flagged, since nothing can be on another node.

#: At least this share of a process's own resident memory on the node for it to count as bound.
BOUND_FRACTION = 0.9
VERDICT_ORDER = ("wrong_node", "unbound", "bound")


def parse_list(text: str | None) -> set[int] | None:
    """A kernel CPU or node list ("0-3,8") as a set; None when absent or unreadable."""
    if text is None:
        return None
    try:
        return set(sysfs.parse_list(str(text)))
    except ValueError:
        return None


def _fmt(nodes: set[int]) -> str:
    """A set as a kernel list ("0-3,8")."""
    parts, run = [], []
    for n in sorted(nodes):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def _policy_nodes(policies: list[str], cpu_home: set[int] | None) -> set[int] | None:
    """The nodes the memory ``policies`` of a process's own mappings place it on, or None when one does not
    confine it (``default``: the task has no policy) or cannot be read.

    ``bind:1`` / ``bind=static:0-1`` (what numactl --membind sets on the task, shown on every mapping
    without a policy of its own), ``interleave:`` and ``prefer:`` name their nodes; ``local`` (a
    policy libraries such as OpenBLAS set on their own buffers) is the node of the CPUs it may run on.
    """
    if not policies:
        return None
    nodes: set[int] = set()
    for p in policies:
        name, _, lst = p.partition(":")
        base = name.split("=")[0]
        if base == "local":
            if not cpu_home:
                return None
            nodes |= cpu_home
        elif base in ("bind", "interleave", "prefer"):
            got = parse_list(lst)
            if not got:
                return None
            nodes |= got
        else:
            return None
    return nodes


def judge_process(reading: dict[str, Any], node: int | None,
                  node_cpus: dict[int, set[int]]) -> dict[str, Any]:
    """One process's binding record judged against ``node`` (pure).

    ``node_cpus``: the CPUs of each NUMA node of the host the process ran on. Verdicts: ``bound``
    (allowed CPUs within the node's, memory confined to the node, >= BOUND_FRACTION of its own
    resident memory there), ``wrong_node`` (its CPUs, or its memory by cpuset or policy, confined to
    one other node), ``unbound`` (neither). With ``node`` None the node judged is the one the process
    is confined to, if any (``bound``), else ``unbound``.
    """
    cpus = parse_list(reading.get("cpus_allowed_list"))
    mems = parse_list(reading.get("mems_allowed_list"))
    mem = {int(k): v for k, v in (reading.get("own_kb_per_node") or reading.get("pages_per_node") or {}).items()}
    total = sum(mem.values())
    # Where the evidence puts the process, each on its own:
    cpu_home = ({n for n, c in node_cpus.items() if c & cpus} if cpus is not None and node_cpus else None)
    policy_nodes = _policy_nodes(reading.get("policies") or [], cpu_home)
    mem_home = mems if mems is not None and len(mems) == 1 else None
    if policy_nodes is not None and len(policy_nodes) == 1:
        mem_home = policy_nodes
    # None: the reading has no memory policies to tell (its numa_maps went unread: the process was
    # exiting, or had not mapped anything yet)
    policies = reading.get("policies") or []
    out: dict[str, Any] = {"pid": reading.get("pid"), "comm": reading.get("comm"), "at": reading.get("at"),
                           "explicit": any(p.split(":")[0].split("=")[0] == "bind" for p in policies)
                           if policies else None}
    if node is None:
        homes = [h for h in (cpu_home, mem_home) if h is not None and len(h) == 1]
        found = homes[0] if homes and all(h == homes[0] for h in homes) and len(homes) == 2 else None
        node = next(iter(found)) if found else None
        out["node_asked"] = None
        if node is None:
            out.update(verdict="unbound", node=None,
                       why=[f"may run on CPUs {reading.get('cpus_allowed_list')} and allocate on nodes "
                            f"{_fmt(policy_nodes or mems or set()) or '?'}: not confined to one node"])
            return out
    else:
        out["node_asked"] = node
    out["node"] = node
    why: list[str] = []
    own = node_cpus.get(node)
    if cpus is None:
        cpus_ok = False
        why.append("Cpus_allowed_list not read")
    elif own is None:
        cpus_ok = None
        why.append(f"the CPUs of node {node} are not known: CPUs not checked")
    else:
        cpus_ok = cpus <= own
        if not cpus_ok:
            why.append(f"may run on CPUs {reading.get('cpus_allowed_list')}, node {node} has {_fmt(own)}")
    mems_ok = (mems == {node}) or (policy_nodes == {node})
    unread = not reading.get("policies") and not total
    if not mems_ok and unread and cpus_ok:
        # No numa_maps (a helper process read as it exited, e.g. the git a drive runs): its CPUs, which
        # numactl confines together with the memory policy the process inherits, are the evidence.
        mems_ok = True
        why.append(f"memory policy not read (no numa_maps); judged by its CPUs, confined to node {node}")
    if not mems_ok:
        why.append(f"memory allowed on nodes {_fmt(mems or set()) or '?'} with policy "
                   f"{', '.join(reading.get('policies') or []) or '?'}, not confined to node {node}")
    frac = mem.get(node, 0) / total if total else None
    out["on_node_fraction"] = None if frac is None else round(frac, 4)
    if frac is None:
        pages_ok = None
        why.append("memory placement not read (no numa_maps)")
    else:
        pages_ok = frac >= BOUND_FRACTION
        if not pages_ok:
            why.append(f"{100 * frac:.0f}% of its own resident memory ({total} "
                       f"{'kB' if reading.get('own_kb_per_node') else 'pages'}) on node {node}")
    if cpus_ok is not False and mems_ok and pages_ok is not False:
        verdict = "bound"
    else:
        # bound elsewhere: confined (CPUs, or memory by cpuset or policy) to another node; memory that merely
        # sits elsewhere, unconfined, is an unbound process's (its pages' node is said in ``why``)
        others = [h for h in (cpu_home, mem_home) if h is not None and len(h) == 1 and node not in h]
        if others:
            verdict = "wrong_node"
            out["found_node"] = next(iter(others[0]))
        else:
            verdict = "unbound"
    if verdict == "bound" and len(node_cpus) == 1:
        why.append("the host has one NUMA node: every process is on it, bound or not"
                   + ("" if out["explicit"] else " (its memory policies were not read)" if out["explicit"] is None
                      else " (no bind policy on its memory: no binding was applied)"))
    out.update(verdict=verdict, why=why)
    return out


def judge(readings: list[dict[str, Any]], node: int | None, node_cpus: dict[int, set[int]] | dict[str, str],
          ) -> dict[str, Any]:
    """A side's binding records (every process, every reading) judged against ``node`` (pure).

    ``node_cpus``: {node: CPU set} or {"0": "0-1"} (a capture's or cpusample's host record). The
    side's verdict is the worst of its processes' (wrong_node, then unbound, then bound);
    ``no_evidence`` without any record.
    """
    cpus = {int(k): (v if isinstance(v, set) else parse_list(v) or set())
            for k, v in node_cpus.items() if v is not None}
    per = [judge_process(r, node, cpus) for r in _informative(readings)]
    if not per:
        return {"verdict": "no_evidence", "node": node, "processes": []}
    verdict = min((p["verdict"] for p in per), key=VERDICT_ORDER.index)
    worst = [p for p in per if p["verdict"] == verdict]
    out: dict[str, Any] = {"verdict": verdict, "node": node if node is not None else worst[0].get("node"),
                           "node_cpus": {str(k): _fmt(v) for k, v in sorted(cpus.items())},
                           "explicit": _explicit(per),
                           "processes": per}
    if verdict == "wrong_node":
        out["found_node"] = worst[0].get("found_node")
    out["why"] = sorted({w for p in worst for w in p.get("why", [])})
    out["processes"] = _per_pid(per)
    return out


def _informative(readings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The readings to judge: a process's reading without numa_maps (taken as it exited and its
    mappings were already gone) is left out when another reading of the same process has them."""
    read = {r.get("pid") for r in readings if r.get("policies")}
    return [r for r in readings if r.get("policies") or r.get("pid") not in read]


def _explicit(judged: list[dict[str, Any]]) -> bool | None:
    """Whether a binding was applied to every process (reading) whose memory policies were read; None
    when no reading had any."""
    told = [p["explicit"] for p in judged if p["explicit"] is not None]
    return all(told) if told else None


def _per_pid(per: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per process: its worst reading's verdict (its reasons only when it is not bound)."""
    by: dict[Any, list[dict[str, Any]]] = {}
    for p in per:
        by.setdefault(p.get("pid"), []).append(p)
    out = []
    for pid, ps in by.items():
        w = min(ps, key=lambda p: VERDICT_ORDER.index(p["verdict"]))
        fr = [p["on_node_fraction"] for p in ps if p.get("on_node_fraction") is not None]
        line = {"pid": pid, "comm": w.get("comm"), "verdict": w["verdict"], "node": w.get("node"),
                "readings": [p.get("at") for p in ps], "on_node_fraction": min(fr) if fr else None,
                "explicit": _explicit(ps)}
        if w["verdict"] != "bound":
            line["why"] = w.get("why")
        if w.get("found_node") is not None:
            line["found_node"] = w["found_node"]
        out.append(line)
    return out
