"""drive's per-rail figures: what each rail carried in a point's window, over all driver processes."""
from __future__ import annotations

from dataclasses import replace

from peercache.bench import drive
from peercache.bench.cli import build_parser


def _rail(name, state="up", nbytes=0, reads=0, errors=None, resets=0, downs=0, ups=0):
    return {"rail": name, "state": state, "bytes_read": nbytes, "reads": reads,
            "completion_errors": dict(errors or {}), "qp_resets": resets, "downs": downs, "ups": ups}


def test_rail_delta_is_the_growth_over_the_window_and_the_state_at_its_end():
    before = [_rail("rxe_b0", nbytes=1000, reads=10), _rail("rxe_b1", nbytes=900, reads=9,
                                                            errors={"IBV_WC_RETRY_EXC_ERR": 1})]
    after = [_rail("rxe_b0", nbytes=5000, reads=50),
             _rail("rxe_b1", state="down", nbytes=1100, reads=11, resets=2, downs=1,
                   errors={"IBV_WC_RETRY_EXC_ERR": 2, "IBV_WC_WR_FLUSH_ERR": 7})]
    d = drive.rail_delta(before, after)
    assert d[0] == _rail("rxe_b0", nbytes=4000, reads=40)
    assert d[1] == _rail("rxe_b1", state="down", nbytes=200, reads=2, resets=2, downs=1,
                         errors={"IBV_WC_RETRY_EXC_ERR": 1, "IBV_WC_WR_FLUSH_ERR": 7})


def test_merge_rails_sums_processes_and_gives_each_rail_its_share():
    p0 = [_rail("rxe_b0", nbytes=300, reads=3), _rail("rxe_b1", nbytes=100, reads=1, downs=1, ups=1)]
    p1 = [_rail("rxe_b0", nbytes=500, reads=5), _rail("rxe_b1", state="down", nbytes=100, reads=1, downs=1,
                                                      errors={"IBV_WC_RETRY_EXC_ERR": 1})]
    m = {r["rail"]: r for r in drive.merge_rails([p0, p1])}
    assert m["rxe_b0"]["bytes_read"] == 800 and m["rxe_b0"]["share"] == 0.8 and m["rxe_b0"]["state"] == "up"
    b1 = m["rxe_b1"]
    assert (b1["bytes_read"], b1["share"], b1["downs"], b1["ups"], b1["state"]) == (200, 0.2, 2, 1, "down")
    assert b1["completion_errors"] == {"IBV_WC_RETRY_EXC_ERR": 1}
    assert drive.merge_rails([[], []]) == []
    assert drive.merge_rails([[_rail("rxe_b0")]])[0]["share"] is None      # nothing read: no share


def test_a_point_carries_its_rails_and_the_table_shows_them():
    cfg = replace(drive.DriveConfig.from_args(build_parser().parse_args(["drive"]), drive.Worker),
                  duration=1.0, layout="mla", op="get", processes=1, batch_size=1, page_size=4096, verify=True)
    st = drive.ThreadStats()
    st.batches, st.keys, st.hits, st.bytes = 4, 4, 4, 4 * 4096
    rails = [_rail("rxe_b0", nbytes=12000, reads=3), _rail("rxe_b1", state="down", nbytes=4000, reads=1, downs=1)]
    p = drive.aggregate(1, cfg, [{"stats": st.__dict__, "abort": [], "rails": rails}]).to_dict()
    assert [r["share"] for r in p["rails"]] == [0.75, 0.25]
    tcp = drive.aggregate(1, cfg, [{"stats": st.__dict__, "abort": []}]).to_dict()
    assert tcp["rails"] == []
    doc = {"meta": {"host": "h", "cpu": "c", "kernel": "k", "git_revision": "r", "protocol": "rdma",
                    "devices": ["rxe_b0", "rxe_b1"], "layout": "mla", "page_size": 4096, "batch_size": 1,
                    "processes": 1, "op": "get", "verify": True, "dir_cache_ttl": 0},
           "points": [p, tcp]}
    lines = drive.format_table(doc).splitlines()
    rail_lines = [ln for ln in lines if "rails:" in ln]
    assert rail_lines == ["        rails: rxe_b0 0.000 GB (75 %), rxe_b1 0.000 GB (25 %, 1 down, down now)"]
