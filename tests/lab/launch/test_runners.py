"""launch: pair runs for real (iperf3 on local and netns hosts), failure paths with
no-orphan checks, ports, the shared-window aggregate and the group runner."""
from __future__ import annotations

import _thread
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from contextlib import ExitStack

import pytest

from peercache.lab.launch import netns
from peercache.lab.launch.hosts import LocalHost, parse_host
from peercache.lab.launch.runners import (FirstSpec, GroupFailed, GroupRunner, GroupSpec, PairFailed, PairRunner,
                                  PortAllocator, Readiness, SideSpec, WindowBytes,
                                  WindowMismatch, aggregate_window)

from lab.launch.test_hosts import assert_none_left, marker, py

needs_iperf3 = pytest.mark.skipif(not os.path.exists("/usr/bin/iperf3"),
                                  reason="iperf3 not installed (apt-get install iperf3)")

PORTS = PortAllocator(first=24000 + os.getpid() % 1000 * 5, last=29999)


def iperf3_server(addr: str, port: int) -> list[str]:
    try:  # the tool module is written in parallel; use it once it is there
        from peercache.lab.tools import iperf3
        return iperf3.server_command(port, bind=addr, one_off=True)
    except ImportError:
        return ["iperf3", "-s", "-1", "-J", "-B", addr, "-p", str(port)]


def iperf3_client(addr: str, port: int, duration: int = 1) -> list[str]:
    try:
        from peercache.lab.tools import iperf3
        return iperf3.client_command(addr, port, duration=duration)
    except ImportError:
        return ["iperf3", "-c", addr, "-p", str(port), "-J", "-t", str(duration), "-l", "131072"]


def received_bytes(client_stdout: str) -> int:
    return int(json.loads(client_stdout)["end"]["sum_received"]["bytes"])


def netns_or_skip():
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)


# --- real pairs ---------------------------------------------------------------

@needs_iperf3
def test_iperf3_pair_on_local(tmp_path):
    port = PORTS.allocate()
    local = LocalHost()
    r = PairRunner(SideSpec(local, iperf3_server("127.0.0.1", port), numa_node=0, device="lo"),
                   SideSpec(local, iperf3_client("127.0.0.1", port), numa_node=-1),
                   Readiness(port=port, addr="127.0.0.1", timeout=10),
                   client_timeout=20, log_dir=tmp_path, name="local-iperf3").run()
    assert r.ok and r.complete and r.error is None
    assert r.server.rc == 0 and r.client.rc == 0
    assert received_bytes(r.client.stdout) > 0
    assert json.loads(r.server.stdout)["end"]["sum_received"]["bytes"] > 0
    # exact commands, NUMA binding records, times
    assert r.commands()["client"] == r.client.argv
    srv_bind, cli_bind = r.numa_bindings()["server"], r.numa_bindings()["client"]
    if local.which("numactl"):
        assert srv_bind["node"] == 0 and r.server.argv[:3] == ["numactl", "--cpunodebind=0", "--membind=0"]
    assert cli_bind["node"] is None and "unknown" in cli_bind["reason"]
    assert r.server.start <= r.client.start <= r.client.end <= r.end
    assert (tmp_path / "client.log").read_text().strip().startswith("{")


@needs_iperf3
def test_iperf3_pair_on_two_netns_hosts():
    netns_or_skip()
    port = PORTS.allocate()
    with netns.NetnsPair(tag=f"pcl{os.getpid() % 10000}p", index=232) as pair:
        a, b = parse_host(f"netns:{pair.ns_a}"), parse_host(f"netns:{pair.ns_b}")
        r = PairRunner(SideSpec(a, iperf3_server(pair.addr_a, port)),
                       SideSpec(b, iperf3_client(pair.addr_a, port)),
                       Readiness(port=port, addr=pair.addr_a, timeout=10), client_timeout=20).run()
    assert r.ok and received_bytes(r.client.stdout) > 0
    assert r.server.argv[:4] == ["ip", "netns", "exec", pair.ns_a]
    assert r.client.argv[:4] == ["ip", "netns", "exec", pair.ns_b]


# --- failure paths, each followed by a no-orphan check -------------------------

def local_pair(server_code: str, client_code: str, mark: str, **kw) -> PairRunner:
    h = LocalHost()
    ready = kw.pop("ready", Readiness(pattern="^ready$", timeout=5))
    return PairRunner(SideSpec(h, py(server_code, mark)), SideSpec(h, py(client_code, mark)),
                      ready, **kw)


SERVER_OK = "import time; print('ready', flush=True); time.sleep(0.3)"
SERVER_FOREVER = "import time; print('ready', flush=True); time.sleep(60)"


def test_success_leaves_nothing_running():
    m = marker()
    r = local_pair(SERVER_OK, "print('done')", m).run()
    assert r.ok and r.client.stdout == "done\n"
    assert_none_left(m)


def test_a_warm_up_run_goes_to_its_end_against_the_ready_server_before_the_measured_client(tmp_path):
    """The steady state of a tool with no warm-up of its own (Mooncake's transfer_engine_bench): a first run
    against the same server, its output kept apart, then the measured one."""
    m = marker()
    h = LocalHost()
    stamp = "import time; print(time.time(), flush=True)"
    r = PairRunner(SideSpec(h, py(SERVER_FOREVER, m)), SideSpec(h, py(stamp, m)), Readiness(pattern="^ready$", timeout=5),
                   server_exits=False, grace=1, log_dir=tmp_path, warmup=SideSpec(h, py(stamp + "; time.sleep(0.3)", m))).run()
    assert r.ok and r.warmup is not None and r.warmup.rc == 0
    assert float(r.warmup.stdout) + 0.3 <= float(r.client.stdout), (r.warmup.stdout, r.client.stdout)
    assert r.client.stdout != r.warmup.stdout and (tmp_path / "warmup.log").exists()
    assert list(r.commands()) == ["server", "warmup", "client"]
    assert_none_left(m)


def test_a_warm_up_run_that_fails_fails_the_pair_and_the_client_never_starts():
    m = marker()
    h = LocalHost()
    with pytest.raises(PairFailed, match="the warm-up run before the measured one failed") as e:
        PairRunner(SideSpec(h, py(SERVER_FOREVER, m)), SideSpec(h, py("print('x')", m)),
                   Readiness(pattern="^ready$", timeout=5), server_exits=False, grace=1,
                   warmup=SideSpec(h, py("import sys; sys.exit(3)", m))).run()
    assert e.value.result.client.start is None
    assert_none_left(m)


def test_long_lived_server_is_stopped_after_client():
    m = marker()
    r = local_pair(SERVER_FOREVER, "print('done')", m, server_exits=False, grace=1).run()
    assert r.ok and r.server.stopped and r.server.rc == -15
    assert_none_left(m)


def test_server_never_ready():
    m = marker()
    t = time.monotonic()
    with pytest.raises(PairFailed, match="did not print") as e:
        local_pair("import time; print('starting', flush=True); time.sleep(60)", "print('x')", m,
                   ready=Readiness(pattern="^ready$", timeout=0.5)).run()
    assert time.monotonic() - t < 5
    res = e.value.result
    assert not res.ok and not res.complete and "starting" in res.server.stdout
    assert res.client.rc is None and res.client.start is None  # never started, command kept
    assert res.client.command[-1] == m
    assert_none_left(m)


def test_server_never_listening_on_port():
    m = marker()
    with pytest.raises(PairFailed, match="not listening"):
        local_pair(SERVER_FOREVER, "print('x')", m,
                   ready=Readiness(port=PORTS.allocate(), addr="127.0.0.1", timeout=0.5)).run()
    assert_none_left(m)


def test_client_crash_fails_with_both_logs():
    m = marker()
    with pytest.raises(PairFailed, match="client .* rc 3") as e:
        local_pair(SERVER_FOREVER,
                   "import sys; print('half a result'); sys.stderr.write('client exploded\\n'); sys.exit(3)",
                   m).run()
    res = e.value.result
    assert not res.ok and res.client.rc == 3 and "client exploded" in res.client.stderr
    assert res.client.stdout == "half a result\n"
    assert res.server.stdout == "ready\n" and res.server.stopped
    assert_none_left(m)


def test_server_crash_during_client_fails_fast():
    m = marker()
    t = time.monotonic()
    with pytest.raises(PairFailed, match="server .* rc 7"):
        local_pair("import sys,time; print('ready', flush=True); time.sleep(0.2); sys.exit(7)",
                   "import time; time.sleep(60)", m, client_timeout=30).run()
    assert time.monotonic() - t < 5
    assert_none_left(m)


def test_client_timeout():
    m = marker()
    with pytest.raises(PairFailed, match="did not finish within 0.5s") as e:
        local_pair(SERVER_FOREVER, "print('started', flush=True); import time; time.sleep(60)", m,
                   client_timeout=0.5, grace=0.5).run()
    assert e.value.result.client.stdout == "started\n" and e.value.result.client.stopped
    assert_none_left(m)


def test_one_shot_server_that_does_not_exit():
    m = marker()
    with pytest.raises(PairFailed, match="server .* did not exit within 0.3s"):
        local_pair(SERVER_FOREVER, "print('done')", m, server_timeout=0.3, grace=0.5).run()
    assert_none_left(m)


def interrupt_after(seconds: float) -> threading.Timer:
    t = threading.Timer(seconds, _thread.interrupt_main)
    t.start()
    return t


def test_keyboard_interrupt_ends_everything():
    m = marker()
    timer = interrupt_after(0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            local_pair(SERVER_FOREVER, "import time; time.sleep(60)", m, client_timeout=30,
                       grace=0.5).run()
    finally:
        timer.cancel()
    assert_none_left(m)


# --- ports --------------------------------------------------------------------

def test_port_allocator_hands_out_distinct_ports():
    alloc = PortAllocator(first=40000, last=40009, probe=None)
    ports = [alloc.allocate() for _ in range(10)]
    assert sorted(ports) == list(range(40000, 40010))
    with pytest.raises(Exception, match="no free port"):
        alloc.allocate()
    alloc.release(40003)
    assert alloc.allocate() == 40003


def test_port_allocator_skips_busy_ports():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        busy = s.getsockname()[1]
        alloc = PortAllocator(first=busy, last=min(busy + 5, 65535))
        assert alloc.allocate() != busy


def test_port_allocator_is_thread_safe():
    alloc = PortAllocator(first=41000, last=41999, probe=None)
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.extend(alloc.allocate() for _ in range(50)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == len(set(got)) == 400


# --- aggregate arithmetic -------------------------------------------------------

def test_aggregate_is_total_bytes_over_shared_window():
    agg = aggregate_window({"mlx5_0": WindowBytes(10e9, 100.0, 110.0),
                            "mlx5_1": WindowBytes(6e9, 100.1, 110.2)}, tolerance_s=0.5)
    assert agg.total_bytes == 16e9
    assert (agg.window_start, agg.window_end) == (100.0, 110.2)
    assert agg.rate_Bps == pytest.approx(16e9 / 10.2)
    assert agg.groups["mlx5_0"]["rate_Bps"] == pytest.approx(1e9)
    assert agg.groups["mlx5_1"]["rate_Bps"] == pytest.approx(6e9 / 10.1)
    assert agg.start_skew_s == pytest.approx(0.1) and agg.end_skew_s == pytest.approx(0.2)
    # never more than adding per-group rates over their own windows would claim
    assert agg.rate_Bps <= sum(g["rate_Bps"] for g in agg.groups.values())


@pytest.mark.parametrize("windows", [
    {"a": WindowBytes(1e9, 0.0, 10.0), "b": WindowBytes(1e9, 5.0, 15.0)},   # staggered start
    {"a": WindowBytes(1e9, 0.0, 10.0), "b": WindowBytes(1e9, 0.0, 5.0)},    # one stopped early
    {"a": WindowBytes(1e9, 0.0, 1.0), "b": WindowBytes(1e9, 2.0, 3.0)},     # no overlap at all
])
def test_aggregate_refuses_windows_that_differ(windows):
    with pytest.raises(WindowMismatch, match="do not coincide") as e:
        aggregate_window(windows)
    assert set(e.value.details["groups"]) == {"a", "b"}  # per-group figures kept


def test_aggregate_default_tolerance_is_five_percent_of_shortest_window():
    ok = {"a": WindowBytes(1, 0.0, 10.0), "b": WindowBytes(1, 0.4, 10.4)}
    assert aggregate_window(ok).tolerance_s == pytest.approx(0.5)
    with pytest.raises(WindowMismatch):
        aggregate_window({"a": WindowBytes(1, 0.0, 10.0), "b": WindowBytes(1, 0.6, 10.6)})
    with pytest.raises(ValueError, match="not after"):
        aggregate_window({"a": WindowBytes(1, 5.0, 5.0)})


# --- group runner -------------------------------------------------------------

def iperf3_window(g) -> WindowBytes:
    c = g.clients[0]
    return WindowBytes(received_bytes(c.stdout), c.start, c.end)


@needs_iperf3
def test_group_runner_two_netns_pairs_share_one_window(tmp_path):
    netns_or_skip()
    base = os.getpid() % 10000
    with ExitStack() as stack:
        pairs = [stack.enter_context(netns.NetnsPair(tag=f"pcg{base}{i}", index=233 + i))
                 for i in range(2)]
        groups = []
        for i, pair in enumerate(pairs):
            port = PORTS.allocate()
            a, b = parse_host(f"netns:{pair.ns_a}"), parse_host(f"netns:{pair.ns_b}")
            groups.append(GroupSpec(
                name=f"nic{i}",
                server=SideSpec(a, iperf3_server(pair.addr_a, port), numa_node=0, device=f"nic{i}"),
                clients=[SideSpec(b, iperf3_client(pair.addr_a, port, duration=1), numa_node=0,
                                  device=f"nic{i}")],
                ready=Readiness(port=port, addr=pair.addr_a, timeout=10)))
        res = GroupRunner(groups, client_timeout=20, measure=iperf3_window,
                          window_tolerance_s=0.5, log_dir=tmp_path).run()
    assert res.ok and res.complete and set(res.groups) == {"nic0", "nic1"}
    starts = [g.clients[0].start for g in res.groups.values()]
    # every client was released at the barrier, after every server was up
    assert all(s >= res.barrier for s in starts) and max(starts) - min(starts) < 0.2
    assert all(g.server.start < res.barrier for g in res.groups.values())
    agg = res.aggregate
    total = sum(res.windows[n].bytes for n in ("nic0", "nic1"))
    window = max(w.end for w in res.windows.values()) - min(w.start for w in res.windows.values())
    assert agg.total_bytes == total > 0
    assert agg.rate_Bps == pytest.approx(total / window)
    for n, w in res.windows.items():  # per-NIC figures kept beside the aggregate
        assert agg.groups[n]["rate_Bps"] == pytest.approx(w.bytes / (w.end - w.start))
    assert res.groups["nic0"].numa_bindings()["client"]["device"] == "nic0"
    assert (tmp_path / "nic1" / "client.log").exists()


def test_group_runner_refuses_mismatched_windows():
    m = marker()
    h = LocalHost()
    groups = [GroupSpec(name=f"g{i}", clients=[SideSpec(h, py(f"import time; time.sleep({d})", m))])
              for i, d in enumerate((0.1, 1.0))]
    with pytest.raises(GroupFailed, match="do not coincide") as e:
        GroupRunner(groups, client_timeout=10,
                    measure=lambda g: WindowBytes(100, g.clients[0].start, g.clients[0].end)).run()
    res = e.value.result
    assert not res.ok and res.aggregate is None and "window_mismatch" in res.flags
    assert set(res.windows) == {"g0", "g1"}
    assert_none_left(m)


def test_group_runner_several_readers_and_one_failing_group():
    m = marker()
    h = LocalHost()
    ok_group = GroupSpec(name="g0", server=SideSpec(h, py(SERVER_FOREVER, m)),
                         ready=Readiness(pattern="^ready$", timeout=5),
                         clients=[SideSpec(h, py("import time; time.sleep(30)", m)) for _ in range(2)])
    bad_group = GroupSpec(name="g1", server=SideSpec(h, py(SERVER_FOREVER, m)),
                          ready=Readiness(pattern="^ready$", timeout=5),
                          clients=[SideSpec(h, py("import sys; sys.exit(5)", m))])
    t = time.monotonic()
    with pytest.raises(GroupFailed, match="rc 5") as e:
        GroupRunner([ok_group, bad_group], client_timeout=20, server_exits=False, grace=0.5).run()
    assert time.monotonic() - t < 8
    res = e.value.result
    assert [c.role for c in res.groups["g0"].clients] == ["client0", "client1"]
    assert res.groups["g1"].clients[0].rc == 5
    assert_none_left(m)


def test_group_runner_passes_shared_start_time():
    m = marker()
    h = LocalHost()
    groups = [GroupSpec(name=f"g{i}", clients=[SideSpec(h, py("import sys; print(sys.argv[2])", m)
                                                        + ["{start_at}"])]) for i in range(2)]
    res = GroupRunner(groups, client_timeout=10).run()
    printed = [float(g.clients[0].stdout) for g in res.groups.values()]
    assert printed == [pytest.approx(res.barrier, abs=1e-5)] * 2


# A client that gets ready after a while of its own (sys.argv[2] s), says so, then waits for the start
# time in its start file (sys.argv[3]) and prints it with the moment it read it.
LATE_READY = ("import os, sys, time; time.sleep(float(sys.argv[2])); print('ready', flush=True)\n"
              "for _ in range(500):\n"
              "    if os.path.exists(sys.argv[3]): break\n"
              "    time.sleep(0.01)\n"
              "print(open(sys.argv[3]).read().strip(), time.time(), flush=True)")


def test_group_runner_releases_clients_once_every_one_is_ready():
    """client_ready: clients start at once with {start_file}; the shared start is written into it only
    after the slowest client is ready (a spawn time far longer than the lead), and removed afterwards."""
    m = marker()
    h = LocalHost()
    groups = [GroupSpec(name=f"g{i}", clients=[SideSpec(h, py(LATE_READY, m) + [str(d), "{start_file}"])])
              for i, d in enumerate((0.1, 2.0))]
    t0 = time.time()
    res = GroupRunner(groups, client_timeout=10, barrier_lead=0.5,
                      client_ready=Readiness(pattern="^ready$", timeout=10)).run()
    assert res.ok, res.error
    printed = [g.clients[0].stdout.split() for g in res.groups.values()]
    assert [float(p[1]) for p in printed] == [pytest.approx(res.barrier, abs=1e-5)] * 2
    assert res.barrier >= t0 + 2.0 + 0.5              # after the slow one was ready, plus the lead
    assert all(float(p[2]) <= res.barrier for p in printed)    # read before the start: none missed it
    path = next(a for a in res.groups["g0"].clients[0].command if a.startswith("/tmp/pclab-start-"))
    assert not os.path.exists(path) and not os.path.exists(path + ".tmp")
    assert_none_left(m)


def test_group_runner_fails_when_a_client_never_gets_ready():
    m = marker()
    h = LocalHost()
    groups = [GroupSpec(name="g0", clients=[SideSpec(h, py(LATE_READY, m) + ["0.1", "{start_file}"])]),
              GroupSpec(name="g1", clients=[SideSpec(h, py("import time; time.sleep(30)", m))])]
    t = time.monotonic()
    with pytest.raises(GroupFailed, match="did not print"):
        GroupRunner(groups, client_timeout=10, client_ready=Readiness(pattern="^ready$", timeout=2)).run()
    assert time.monotonic() - t < 8
    assert_none_left(m)


# A long-lived process that writes a file once it is up (sys.argv[2]) and says so, then sleeps.
UP_AND_WAIT = ("import sys, time; open(sys.argv[2], 'w').write('up'); print('up', flush=True); time.sleep(60)")
# A client that prints whether the file (sys.argv[2]) is there when it starts.
SEES = "import os, sys; print(os.path.exists(sys.argv[2]))"


def test_group_runner_starts_first_processes_before_any_group_and_stops_them_last(tmp_path):
    """A cluster's directory: up before every group's server and client, stopped after them; a group
    with only a server (a producer nobody in its group reads) is allowed and measured by no one."""
    m = marker()
    h = LocalHost()
    flag = str(tmp_path / "directory-up")
    groups = [GroupSpec("reader", [SideSpec(h, py(SEES, m) + [flag])]),
              GroupSpec("producer", [], SideSpec(h, py(UP_AND_WAIT, m) + [str(tmp_path / "p")]),
                        Readiness(pattern="^up$", timeout=10))]
    measured = []
    res = GroupRunner(groups, client_timeout=10, server_exits=False, log_dir=tmp_path,
                      measure=lambda gr: measured.append(gr.name) or WindowBytes(1, 1.0, 2.0),
                      first=[FirstSpec("directory", SideSpec(h, py(UP_AND_WAIT, m) + [flag]),
                                       Readiness(pattern="^up$", timeout=10))]).run()
    assert res.ok, res.error
    assert res.groups["reader"].clients[0].stdout.strip() == "True"      # the directory was up first
    assert measured == ["reader"] and res.groups["producer"].clients == []
    assert res.first["directory"].stopped and (tmp_path / "directory.log").exists()
    assert_none_left(m)


def test_group_runner_fails_when_a_first_process_never_gets_ready():
    m = marker()
    h = LocalHost()
    with pytest.raises(GroupFailed, match="did not print"):
        GroupRunner([GroupSpec("g", [SideSpec(h, py("print('x')", m))])], client_timeout=5,
                    first=[FirstSpec("directory", SideSpec(h, py("import time; time.sleep(30)", m)),
                                     Readiness(pattern="^up$", timeout=1))]).run()
    assert_none_left(m)


def test_group_runner_events_leave_crash_and_join_during_the_window_without_failing_it(tmp_path):
    """Membership churn: during the shared window one server leaves (SIGTERM), one crashes (SIGKILL) and a
    new one joins; the run stays ok, each event is logged with its time, and the joiner is stopped at the end."""
    m = marker()
    h = LocalHost()
    up = Readiness(pattern="^up$", timeout=10)
    groups = [GroupSpec("reader", [SideSpec(h, py("import time; time.sleep(2)", m))]),
              *(GroupSpec(n, [], SideSpec(h, py(UP_AND_WAIT, m) + [str(tmp_path / f"up-{n}")]), up)
                for n in ("a", "b"))]

    def churn(ctl, stop):
        assert ctl.at(ctl.barrier + 0.3, stop)
        ctl.leave("a")
        ctl.crash("b")
        ctl.join("c", SideSpec(h, py(UP_AND_WAIT, m) + [str(tmp_path / "up-c")]), up)

    res = GroupRunner(groups, client_timeout=10, server_exits=False, log_dir=tmp_path, events=churn).run()
    assert res.ok, res.error
    # the leave's exit ("left") is awaited in the background, so it lands anywhere after the leave
    assert [e["event"] for e in res.events if e["event"] != "left"] == ["leave", "crash", "join", "ready"]
    assert [e["group"] for e in res.events if e["event"] == "left"] == ["a"]
    assert all(e["t"] >= res.barrier + 0.3 for e in res.events)
    assert res.groups["b"].server.rc == -9 and res.groups["a"].server.stopped
    assert res.groups["c"].server.stopped and (tmp_path / "up-c").exists() and (tmp_path / "c" / "server.log").exists()
    assert_none_left(m)


def _state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_group_runner_events_stop_continue_and_restart_a_first_process(tmp_path):
    """A directory's faults: a first process SIGSTOPped then continued, one restarted in place (a new process,
    awaited as at the start, watched and stopped with the rest), and a command run on a host; the run stays ok
    and every event is logged with its time."""
    m = marker()
    h = LocalHost()
    up = Readiness(pattern="^up$", timeout=10)
    groups = [GroupSpec("reader", [SideSpec(h, py("import time; time.sleep(2.5)", m))])]
    firsts = [FirstSpec(n, SideSpec(h, py(UP_AND_WAIT, m) + [str(tmp_path / f"up-{n}")]), up)
              for n in ("directory", "master")]
    seen = {}

    def faults(ctl, stop):
        assert ctl.at(ctl.barrier + 0.2, stop)
        pid = ctl._firsts["master"].handle.proc.pid
        ctl.signal("master", signal.SIGSTOP)
        time.sleep(0.2)
        seen["stopped"] = _state(pid)
        ctl.signal("master", signal.SIGCONT)
        time.sleep(0.2)
        seen["continued"] = _state(pid)
        seen["old"] = ctl._firsts["directory"].handle.proc.pid
        ctl.restart("directory", 0.3)
        seen["new"] = ctl._firsts["directory"].handle.proc.pid
        seen["echo"] = ctl.command("operator", h, ["echo", "OK"], timeout=10).stdout.strip()

    res = GroupRunner(groups, client_timeout=10, server_exits=False, log_dir=tmp_path, first=firsts,
                      events=faults).run()
    assert res.ok, res.error
    assert seen["stopped"] == "T" and seen["continued"] in ("S", "R") and seen["echo"] == "OK"
    assert seen["new"] != seen["old"] and res.first["directory"].stopped
    assert [(e["event"], e.get("signal")) for e in res.events] == [
        ("signal", "SIGSTOP"), ("signal", "SIGCONT"), ("restart", None), ("back", None), ("command", None)]
    back = next(e for e in res.events if e["event"] == "back")
    assert back["down_s"] >= 0.3 and all(e["t"] >= res.barrier + 0.2 for e in res.events)
    assert (tmp_path / "directory.log").read_text().count("up") == 2          # both incarnations' output
    assert_none_left(m)


def test_group_runner_a_restarted_first_process_that_dies_fails_the_run(tmp_path):
    """The process started again is watched as the first one was: its death while clients read fails the run."""
    m = marker()
    h = LocalHost()
    up = Readiness(pattern="^up$", timeout=10)
    groups = [GroupSpec("reader", [SideSpec(h, py("import time; time.sleep(3)", m))])]
    flag = tmp_path / "second"

    def faults(ctl, stop):
        ctl.restart("directory")

    # the first incarnation holds; the one started again says it is up, then ends on its own
    script = ("import os, sys, time; first = not os.path.exists(sys.argv[2]); open(sys.argv[2], 'a').close(); "
              "print('up', flush=True); time.sleep(60 if first else 0.5)")
    with pytest.raises(GroupFailed, match="exited with rc 0 while its client was running"):
        GroupRunner(groups, client_timeout=10, server_exits=False, events=faults,
                    first=[FirstSpec("directory", SideSpec(h, py(script, m) + [str(flag)]), up)]).run()
    assert_none_left(m)


def test_group_runner_refuses_a_first_process_named_as_a_group():
    h = LocalHost()
    with pytest.raises(ValueError, match="not a group's"):
        GroupRunner([GroupSpec("directory", [SideSpec(h, ["true"])])],
                    first=[FirstSpec("directory", SideSpec(h, ["true"]), Readiness(pattern="x"))])


def test_group_runner_an_event_that_fails_fails_the_run():
    m = marker()
    h = LocalHost()
    groups = [GroupSpec("reader", [SideSpec(h, py("import time; time.sleep(1)", m))])]

    def bad(ctl, stop):
        ctl.leave("nobody")

    with pytest.raises(GroupFailed, match="an event of the run failed: KeyError"):
        GroupRunner(groups, client_timeout=10, events=bad).run()
    assert_none_left(m)


def test_group_runner_refuses_groups_without_any_client():
    h = LocalHost()
    with pytest.raises(ValueError, match="no group has a client"):
        GroupRunner([GroupSpec("g", [], SideSpec(h, ["true"]), Readiness(pattern="x"))])


# --- peercache-bench across two netns hosts (last: the bench tool is new) -----

@pytest.mark.skipif(importlib.util.find_spec("peercache.bench.cli") is None,
                    reason="peercache-bench (peercache.bench.cli) not importable yet")
def test_peercache_bench_pair_on_two_netns_hosts(tmp_path):
    netns_or_skip()
    port = PORTS.allocate()
    bench = [sys.executable, "-m", "peercache.bench.cli"]
    with netns.NetnsPair(tag=f"pcb{os.getpid() % 10000}", index=236) as pair:
        a, b = parse_host(f"netns:{pair.ns_a}"), parse_host(f"netns:{pair.ns_b}")
        disc = f"{pair.addr_a}:{port}"
        common = ["--discovery-addr", disc, "--protocol", "tcp", "--page-size", "4096",
                  "--working-set", "64", "--quiet"]
        r = PairRunner(
            SideSpec(a, [*bench, "serve", *common, "--readers", "1", "--max-wait", "30",
                         "--out", str(tmp_path / "serve.json")]),
            SideSpec(b, [*bench, "drive", *common, "--batch-size", "8", "--concurrencies", "1",
                         "--duration", "0.5", "--warmup", "0.1", "--out", str(tmp_path / "drive.json")]),
            Readiness(port=port, addr=pair.addr_a, timeout=20), client_timeout=40,
            server_timeout=15).run()
    assert r.ok, r.error
    assert (tmp_path / "drive.json").exists()


# A server that takes its time to leave: on SIGTERM it waits 1.5 s before it exits.
SLOW_LEAVE = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), sys.exit(0)))\n"
              "print('up', flush=True)\n"
              "time.sleep(60)")


def test_a_slow_leave_does_not_delay_the_next_event_and_a_join_is_timed_from_its_start(tmp_path):
    """Churn events happen at their moments: the leave returns after its SIGTERM, and the server's 1.5 s
    exit is logged as ``left`` when it comes; the crash after it is on time. A join is logged when its start
    is asked for, not after its process and readers are up (which can take a loaded machine a second)."""
    m = marker()
    h = LocalHost()
    up = Readiness(pattern="^up$", timeout=10)
    groups = [GroupSpec("reader", [SideSpec(h, py("import time; time.sleep(3)", m))]),
              GroupSpec("a", [], SideSpec(h, py(SLOW_LEAVE, m)), up),
              GroupSpec("b", [], SideSpec(h, py(UP_AND_WAIT, m) + [str(tmp_path / "up-b")]), up)]
    asked = {}

    def churn(ctl, stop):
        assert ctl.at(ctl.barrier + 0.2, stop)
        ctl.leave("a")
        ctl.crash("b")
        asked["join"] = time.time()
        ctl.join("c", SideSpec(h, py(UP_AND_WAIT, m) + [str(tmp_path / "up-c")]), up)

    res = GroupRunner(groups, client_timeout=10, server_exits=False, grace=5, log_dir=tmp_path,
                      events=churn).run()
    assert res.ok, res.error
    at = {e["event"]: e for e in res.events}
    assert at["crash"]["t"] - at["leave"]["t"] < 0.5, res.events
    assert at["left"]["seconds"] >= 1.4 and at["left"]["t"] > at["crash"]["t"], res.events
    assert res.groups["a"].server.rc == 0          # it left on its own, within the grace: no SIGKILL
    assert asked["join"] <= at["join"]["t"] <= res.groups["c"].server.start, (at["join"], res.groups["c"].server.start)
    assert_none_left(m)
