"""Parsers on real captures from the two-machine Soft-RoCE testbed (tests/fixtures/lab/twohost/,
provenance in tests/fixtures/lab/PROVENANCE.md): each host's hostinfo, perftest across the wire,
port counters of both rails, the preflight of both hosts."""
from __future__ import annotations

import json
from pathlib import Path

from peercache.lab.system import hostinfo
from peercache.lab.tools import perftest

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lab" / "twohost"


def capture(role: str) -> dict:
    return json.loads((FIX / f"hostinfo_{role}.json").read_text())


def test_each_machine_reports_its_own_host_and_nics_on_two_numa_nodes():
    names = set()
    for role in ("producer", "consumer"):
        block = capture(role)
        s = hostinfo.summary(block["capture"])
        assert s == block["summary"]                      # the summary is re-derived from the raw capture
        names.add(s["host"])
        assert s["numa_nodes"] == 2
        nics = {n["name"]: n for n in s["nics"]}
        assert {d: nics[d]["numa_node"] for d in ("rxe0", "rxe1")} == {"rxe0": 0, "rxe1": 1}
        for d, nd in (("rxe0", "rail0"), ("rxe1", "rail1")):
            assert nics[d]["numa_source"].startswith(f"netdev {nd} (rxe parent), its parent PCI function")
            assert nics[d]["active_mtu"] == 4096 and nics[d]["roce_v2_gid_index"] == 1
    assert names == {"pc-producer", "pc-consumer"}


def test_perftest_across_the_wire_parses_to_a_figure():
    r = perftest.parse_output((FIX / "ib_write_bw_q1_s128K.client.log").read_text(), source="twohost client")
    assert r.header["Device"] == "rxe0" and r.header["Mtu"] == "4096[B]" and r.header["GID index"] == "1"
    (row,) = r.rows
    assert (row.size_bytes, row.iterations, row.raw_unit) == (131072, 152, "Gb/sec")
    assert row.bw_average_raw == 0.066057
    server = perftest.parse_output((FIX / "ib_write_bw_q1_s128K.server.log").read_text(), source="twohost server")
    assert server.test == r.test


def test_a_client_terminated_before_its_report_is_classified_not_parsed():
    text = (FIX / "ib_read_bw_q4_s128K.terminated.client.log").read_text()
    err = perftest.classify_failure(text, 143, "ssh:pc-consumer", "ib_read_bw")
    assert err is not None and "143" in str(err)


def test_both_rails_port_counters_moved_bytes_in_the_multi_rail_point():
    pc = json.loads((FIX / "multi_rail_port_counters.json").read_text())["port_counters"]
    assert set(pc) == {"rxe0", "rxe1"}
    assert all(c["rcv_bytes"] > 1_000_000 and c["source"].startswith("netdev:rail") for c in pc.values())


def test_preflight_of_both_machines_passed_over_both_rails():
    doc = json.loads((FIX / "preflight.json").read_text())
    assert doc["ok"] is True and doc["failures"] == []
    text = json.dumps(doc)
    for needle in ("rxe0", "rxe1", "198.18.0.1", "198.18.1.2", "RoCE v2"):
        assert needle in text


def test_ib_read_bw_by_count_across_the_wire():
    # -n 100 per QP, -q 4: perftest reports the iterations of all QPs together
    r = perftest.parse_output((FIX / "ib_read_bw_q4_s128K_n100.client.log").read_text(), source="twohost client")
    (row,) = r.rows
    assert (row.size_bytes, row.iterations, row.bw_average_raw, row.bw_peak_raw) == (131072, 400, 0.12, 0.25)
    assert r.header["Number of qps"] == "4" and r.header["Device"] == "rxe0"
