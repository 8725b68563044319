"""drive's readable console table: the host + meta line, then one row per point (and its rails)."""
from __future__ import annotations

from ..meta import host_line


def format_table(doc: dict) -> str:
    """The readable console table with its host + meta line."""
    m = doc["meta"]
    lines = [host_line(m),
             f"# protocol={m['protocol']} devices={','.join(m['devices']) or '-'} layout={m['layout']} "
             f"page={m['page_size']} B batch={m['batch_size']} processes={m['processes']} "
             f"op={m['op']} verify={'on' if m['verify'] else 'off'} "
             f"integrity={'on' if m.get('integrity') else 'off'} dir-cache-ttl={m['dir_cache_ttl']} s"
             + (f" tcp-poll={m['tcp_poll_us']} us" if m.get("tcp_poll_us") is not None else ""),
             f"{'threads':>7} {'GB/s':>8} {'pages/s':>11} {'p50 us':>9} {'p99 us':>9} {'p999 us':>9} "
             f"{'hit %':>7} {'errors':>6}  status"]
    for p in doc["points"]:
        lat = p["latency_us"]
        gbs = "-" if p["gb_per_s"] is None else f"{p['gb_per_s']:.3f}"
        hit = "-" if p["hit_rate"] is None else f"{100 * p['hit_rate']:.2f}"
        fmt = lambda v: "-" if v is None else f"{v:.1f}"
        lines.append(f"{p['threads']:>7} {gbs:>8} {p['pages_per_s']:>11.0f} {fmt(lat['p50']):>9} "
                     f"{fmt(lat['p99']):>9} {fmt(lat['p999']):>9} {hit:>7} {p['errors']:>6}  "
                     f"{p['status']}{' (' + p['reason'] + ')' if p['reason'] else ''}")
        if p.get("first_error"):
            lines.append(f"{'':>7} errors counted, expected (--faults-expected); the first: {p['first_error']}")
        if p.get("timeline"):
            tl = p["timeline"]
            lines.append(f"{'':>7} timeline: {len(tl['buckets'])} buckets of {tl['bucket_ms']} ms, longest stall of "
                         f"a thread {tl['max_stall_s']:.3f} s")
        if p.get("rails"):
            lines.append(f"{'':>7} rails: " + ", ".join(_rail_text(r) for r in p["rails"]))
    return "\n".join(lines)


def _rail_text(r: dict) -> str:
    """One rail of a point, for the table: bytes, share, and what happened to it."""
    share = "-" if r["share"] is None else f"{100 * r['share']:.0f} %"
    extra = [f"{r[k]} {k[:-1]}" for k in ("downs", "ups") if r[k]]
    extra += [f"{n} {k}" for k, n in r["completion_errors"].items()]
    if r["state"] != "up":
        extra.append("down now")
    return f"{r['rail']} {r['bytes_read'] / 1e9:.3f} GB ({share}{', ' + ', '.join(extra) if extra else ''})"

