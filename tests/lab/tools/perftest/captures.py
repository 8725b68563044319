"""The perftest captures the tests of this folder read, and what is known of each.

Three sets, each with its provenance beside it (tests/fixtures/lab/PROVENANCE.md lists them all):

- ``softroce/``: real captures of perftest 6.06 (Debian 4.5+0.17) on Soft-RoCE in the QEMU guest
  (kernel 6.1.0-57-amd64, rxe_a0 on pcg0a 198.18.0.1 = server, rxe_b0 on pcg0b 198.18.0.2 =
  client), taken by capture.sh in that folder; manifest.tsv holds the exact command and exit
  status of every process. Read with :func:`real`, :func:`parse_real`, :data:`MANIFEST`.
- ``public/``: real perftest outputs that someone published (GitHub issues/PRs, committed logs);
  public/README.md gives each file's source, release and what was trimmed. The expected values
  below (:data:`BW`, :data:`LAT`, ...) were read by hand from the files. Read with :func:`public`.
- the folder itself: two real captures of this project's CI host (``no_device.txt``,
  ``unknown_option.txt``) and three composed by ``make_fixtures.py`` with perftest's own printf
  formats, because the guest cannot produce them (``read_bw_q16_mib.txt``: the MiB/sec label of
  newer releases; ``read_bw_q16.json``: their standard JSON; ``write_bw_mb_old.txt``: an
  InfiniBand link). Read with :func:`load`.

These tests need no device.
"""
from __future__ import annotations

from pathlib import Path

from peercache.lab.tools import perftest as pt

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "lab" / "perftest"
SR = FIX / "softroce"
PUB = FIX / "public"
MiB = 1 << 20


def load(name: str) -> str:
    """A file of the folder itself (tests/fixtures/lab/perftest/NAME)."""
    return (FIX / name).read_text()


def real(name: str) -> str:
    """A real capture: NAME.SIDE.stdout, or NAME.SIDE.stdout + .stderr for "NAME.SIDE+err"."""
    if name.endswith("+err"):
        stem = name[: -len("+err")]
        return (SR / f"{stem}.stdout").read_text() + (SR / f"{stem}.stderr").read_text()
    return (SR / name).read_text()


def parse_real(name: str) -> pt.PerftestResult:
    """A real capture through the text parser, named as its source."""
    return pt.parse_output(real(name), name)


def public(name: str) -> str:
    """A public output (tests/fixtures/lab/perftest/public/NAME)."""
    return (PUB / name).read_text()


def _manifest() -> dict[tuple[str, str], tuple[int, str]]:
    out = {}
    for line in (SR / "manifest.tsv").read_text().splitlines():
        name, side, rc, cmd = line.split("\t")
        out[(name, side)] = (int(rc), cmd)
    return out


#: (capture name, side) -> (exit status, exact command) of every process in softroce/manifest.tsv.
MANIFEST = _manifest()

#: Every perftest process that exited 0 and printed a result table (name, side).
SUCCESS = sorted(k for k, (rc, cmd) in MANIFEST.items()
                 if rc == 0 and k[1] in ("server", "client", "first")
                 and (SR / f"{k[0]}.{k[1]}.stdout").exists()
                 and "#bytes" in (SR / f"{k[0]}.{k[1]}.stdout").read_text())


# --- public outputs: expectations, one entry per file ---------------------------------------

#: Successful bandwidth outputs: header fields (as printed) and rows
#: (size, iterations, peak or None, average, msg rate or None) at chosen indexes.
BW = {
    "perftest273_write_postlist_d60_gbits.txt": dict(
        test="RDMA_Write Post List BW Test", tool="ib_write_bw", unit="Gb/sec", n=1,
        header={"Device": "ib0", "Number of qps": "1", "Transport type": "IB",
                "Connection type": "RC", "PCIe relax order": "Unsupported", "ibv_wr* API": "OFF",
                "TX depth": "256", "Post List": "128", "CQ Moderation": "128", "Mtu": "4096[B]",
                "Link type": "Ethernet", "GID index": "2", "rdma_cm QPs": "OFF"},
        info={"qps": 1, "mtu_bytes": 4096, "gid_index": 2, "tx_depth": 256, "cq_moderation": 128},
        rows={0: (8, 224958464, None, 0.48, 7.498617)}),
    "eugr_write_bw_q4_rdma_cm_gbits.txt": dict(
        test="RDMA_Write BW Test", tool="ib_write_bw", unit="Gb/sec", n=1,
        header={"Device": "rocep1s0f1", "Number of qps": "4", "Transport type": "IB",
                "Mtu": "1024[B]", "Link type": "IB", "rdma_cm QPs": "ON",
                "Data ex. method": "rdma_cm", "CQ Moderation": "1", "TX depth": "128"},
        info={"qps": 4, "mtu_bytes": 1024, "gid_index": None, "rdma_cm": "ON"},
        rows={0: (65536, 20000, 111.72, 111.71, 0.213070)}),
    "stm_read_bw_a_mlx4_ib.txt": dict(
        test="RDMA_Read BW Test", tool="ib_read_bw", unit="MB/sec", n=23,
        header={"Device": "mlx4_0", "Number of qps": "1", "Transport type": "IB",
                "Mtu": "2048[B]", "Link type": "IB", "Outstand reads": "16", "TX depth": "128",
                "CQ Moderation": "100"},
        info={"qps": 1, "mtu_bytes": 2048, "outstand_reads": 16, "gid_index": None},
        rows={0: (2, 20000, 9.12, 8.98, 4.710248), 15: (65536, 20000, 3670.14, 3669.96, 0.058719),
              22: (8388608, 20000, 3666.29, 3666.17, 0.000458)}),
    "stm_send_bw_a_mlx4_ib.txt": dict(
        test="Send BW Test", tool="ib_send_bw", unit="MB/sec", n=23,
        header={"Device": "mlx4_0", "Max inline data": "0[B]", "Mtu": "2048[B]", "Link type": "IB"},
        info={"qps": 1, "mtu_bytes": 2048, "max_inline_bytes": 0},
        rows={0: (2, 20000, 10.17, 9.90, 5.189724), 15: (65536, 20000, 3653.52, 3653.23, 0.058452),
              22: (8388608, 20000, 3662.23, 3661.76, 0.000458)}),
    "jebtang_send_bw_ud_a_v1.txt": dict(
        test="Send BW Test", tool="ib_send_bw", unit="MB/sec", n=11,
        header={"Connection type": "UD", "Mtu": "2048"},
        info={"connection": "UD", "mtu_bytes": 2048, "qps": None, "device": None},
        rows={0: (2, 1000, 7.51, 7.21, None), 10: (2048, 1000, 2923.29, 2919.91, None)},
        notes=["line 4: Inline data is used up to 1 bytes message"]),
    "pib4_atomic_bw_cmp_swap_client.txt": dict(
        test="Atomic CMP_AND_SWAP BW Test", tool="ib_atomic_bw", unit="MB/sec", n=1,
        header={"Device": "pib_1", "Number of qps": "1", "Connection type": "RC",
                "Outstand reads": "16", "Mtu": "4096[B]", "Link type": "IB"},
        info={"qps": 1, "using_srq": None, "outstand_reads": 16},
        rows={0: (8, 1000, 1.70, 1.67, 0.219031)},
        notes=["line 2: Device not recognized to implement inline feature. Disabling it"]),
}

#: Successful latency outputs: rows (size, iterations, t_min, t_max, t_typical, t_avg, t_stdev,
#: 99%, 99.9%) at chosen indexes, all usec.
LAT = {
    "stm_write_lat_a_mlx4_ib.txt": dict(
        test="RDMA_Write Latency Test", tool="ib_write_lat", n=23,
        header={"Device": "mlx4_0", "TX depth": "1", "Mtu": "2048[B]", "Max inline data": "220[B]"},
        rows={0: (2, 20000, 0.88, 6.84, 0.98, 1.03, 0.20, 1.21, 5.42),
              15: (65536, 20000, 19.69, 69.60, 19.97, 20.04, 0.64, 23.79, 25.30),
              22: (8388608, 20000, 2296.01, 2345.48, 2302.01, 2304.98, 6.43, 2327.01, 2335.48)}),
    "stm_read_lat_a_mlx4_ib.txt": dict(
        test="RDMA_Read Latency Test", tool="ib_read_lat", n=23,
        header={"Device": "mlx4_0", "Outstand reads": "16", "TX depth": "1"},
        rows={0: (2, 20000, 1.91, 13.87, 1.99, 2.01, 0.32, 2.13, 9.95),
              15: (65536, 20000, 19.62, 57.18, 20.00, 20.07, 0.73, 22.43, 28.74),
              22: (8388608, 20000, 2177.92, 2240.08, 2184.09, 2184.33, 2.24, 2192.22, 2202.42)}),
    "stm_send_lat_a_mlx4_ib.txt": dict(
        test="Send Latency Test", tool="ib_send_lat", n=23,
        header={"Device": "mlx4_0", "Max inline data": "236[B]"},
        rows={0: (2, 20000, 1.02, 11.76, 1.07, 1.11, 0.30, 1.68, 5.00),
              15: (65536, 20000, 19.89, 59.97, 20.08, 20.17, 0.77, 24.04, 31.27),
              22: (8388608, 20000, 2239.42, 4189.77, 2247.02, 2252.46, 65.03, 2287.38, 3761.26)}),
    "eugr_write_lat_rdma_cm.txt": dict(
        test="RDMA_Write Latency Test", tool="ib_write_lat", n=1,
        header={"Device": "rocep1s0f1", "PCIe relax order": "OFF", "rdma_cm QPs": "ON",
                "Max inline data": "220[B]", "Link type": "IB"},
        rows={0: (2, 1000, 1.42, 1.93, 1.47, 1.47, 0.00, 1.57, 1.93)}),
}

LAT_JSON = {
    "perftest216_write_lat_rxe_legacy.json": dict(
        test="RDMA_Write Latency Test", tool="ib_write_lat",
        info={"device": "rxe0", "qps": 1, "mtu_bytes": 1024, "gid_index": 1, "link_type": "Ethernet",
              "tx_depth": 1},
        row=(128, 5000, 2.37, 5.39, 2.42, 2.42, 0.05, 2.47, 4.03)),
}

#: Damaged or cut pastes: (parser, line number, reason fragment, fragment of the named line).
DAMAGED = {
    "perftest65_send_bw_markdown_bold.txt": (
        pt.parse_output, 3, "column value '**5544.28**' is not a number", "**5544.28**"),
    "ucx8852_read_bw_a_separators_stripped.txt": (
        pt.parse_output, 16, "unrecognised result table header", "#bytes     iterations"),
    "ucx8851_read_bw_a_ib_cut.txt": (
        pt.parse_output, 23, "table opened at line 19 is not closed", "38.95              2.5525"),
    "perftest234_write_bw_d10_server_cut.txt": (
        pt.parse_output, 26, "result row has 2 columns, the header at line 25 has 5", "65536      664644"),
    "perftest342_write_bw_rdma_cm_newest_cut.txt": (
        pt.parse_output, 24, "result row has 3 columns", "65536      247166           0.00"),
}

#: Failed runs: (kind, fragments of the message, the line parse_output names).
FAILED = {
    "perftest173_completion_status4_cuda.txt": (
        "completion_error", ["IBV_WC_LOC_PROT_ERR (status 4, \"local protection error\")",
                             "at the client", "wr_id 0", "syndrome 0x51", "828 posted / 700 completed",
                             "memory registration", "GPUDirect"], 4),
    "softiwarp27_completion_status12_one_line.txt": (
        "completion_error", ["IBV_WC_RETRY_EXC_ERR (status 12, \"transport retry counter exceeded\")",
                             "syndrome 0x81", "128 posted / 0 completed", "the peer stopped answering",
                             "drops packets"], 1),
    "project_softroce_completion_status5.txt": (
        "completion_error", ["IBV_WC_WR_FLUSH_ERR (status 5, \"Work Request Flushed Error\")",
                             "wr_id 6", "syndrome 0x0", "195 posted / 69 completed",
                             "already in the error state", "first non-flush error"], 4),
    "k8s112_write_bw_modify_qp_rtr.txt": (
        "cannot_connect", ["queue pairs could not be connected", "Failed to modify QP 218 to RTR",
                           "GID index (-x)", "this output shows an all-zero GID"], 20),
    "k8s72_write_bw_modify_qp_rtr_spaces.txt": (
        "cannot_connect", ["Failed to modify QP 59 to RTR", "this output shows an all-zero GID"], 19),
    "pib3_read_bw_a_server_read_keys.txt": (
        "cannot_connect", ["the peer ended the out-of-band exchange",
                           "Couldn't read remote address", "read its log"], 19),
    "sparkrdma31_read_bw_server_read_keys.txt": (
        "cannot_connect", ["the peer ended the out-of-band exchange", "read its log"], 21),
    "perftest228_write_bw_cannot_connect.txt": (
        "cannot_connect", ["Couldn't connect to 192.168.125.211:18515", "server was started first"], 2),
    "perftest54_write_bw_rdma_cm_rejected.txt": (
        "cannot_connect", ["Failed to connect RDMA CM"], 8),
    "perftest139_write_lat_irdma_create_qp.txt": (
        "resource_error", ["cannot create the queue pair", "Unable to create QP.", "inline size (-I"], 7),
    "softiwarp23_send_bw_siw_alloc_mr.txt": (
        "resource_error", ["cannot register the test buffer", "Couldn't allocate MR", "ulimit -l"], 18),
    "perftest26_send_bw_rdma_cm_alloc_mr.txt": (
        "resource_error", ["Couldn't allocate MR"], 6),
    "perftest31_write_bw_cuda_alloc_mr.txt": (
        "resource_error", ["Couldn't allocate MR", "nvidia-peermem"], 15),
    "perftest395_write_bw_hugepages.txt": (
        "resource_error", ["hugepage", "Failed to allocate hugepages. Please configure hugepages",
                           "kernel.shmmni"], 5),
    "lsgunth1_send_lat_port_down_quoted.txt": (
        "no_device", ["the RDMA port is down", "Port number 1 state is Down", "PORT_ACTIVE"], 4),
}

ALL = {**BW, **LAT, **LAT_JSON, **DAMAGED, **FAILED}
