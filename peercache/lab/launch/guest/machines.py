"""Two QEMU guests as two machines: the two-host Soft-RoCE testbed.

Each guest boots Debian's stock kernel with its own hostname (``pc-producer``,
``pc-consumer``), ``cpus`` vCPUs spread over ``numa_nodes`` NUMA nodes, and
one virtio NIC per rail. Rail ``i`` is its own wire: a QEMU socket netdev
that the producer listens on and the consumer connects to, on a loopback
port. The rail NICs sit on PCI expander buses bound to NUMA nodes (rail ``i``
on node ``i % numa_nodes``), so ``/sys/class/net/rail<i>/device/numa_node``
reads as on a two-socket server, and each carries an rxe device ``rxe<i>``
(RoCE v2 across the wire, between two kernels). Addresses: 198.18.<i>.1
(producer) and 198.18.<i>.2 (consumer), RFC 2544 benchmarking space that
exists only on the wires.

A third NIC is QEMU's user network with ``restrict=on``: its only use is a
port forward from ``127.0.0.1:<port>`` on this machine to the guest's sshd.
The guests reach nothing else. Keys (host and client), ``known_hosts``, the
ssh config naming ``pc-producer`` / ``pc-consumer`` and every port are made
per run in a private folder; :meth:`MachinePair.environment` gives the
variables (``PEERCACHE_SSH_CONFIG``, ``PEERCACHE_SLOWNESS``) a pipeline run
against the pair needs.

The guests see this machine's ``/`` read-only (with a tmpfs overlay: writes
stay in the guest), as a cluster's shared install would be, but no folder of
this machine is writable to them: every result comes back over SSH, as from
real hosts. Both guests are always powered off on leaving the context, and
their qemu processes die with the launcher (``--pdeathsig``): no qemu is ever
left behind.

The builders (:func:`qemu_argv`, :func:`setup_script`, :func:`ssh_config`) are
pure; :class:`MachinePair` is the launcher.
"""
from __future__ import annotations

import bisect
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from peercache.bench.meta import REVISION, REVISION_ENV, git_revision
from peercache.lab.launch.guest import kernel as K
from peercache.lab.launch.guest import runner as R
from peercache.lab.launch.guest.errors import GuestError, GuestTimeout, GuestUnavailable
from peercache.lab.launch.redis import die_with_parent
from peercache.lab.launch.hosts import SSH_CONNECT_TIMEOUT_S, LocalHost

ROLES = ("producer", "consumer")
#: The guest's address on QEMU's user network (its only other link is the sshd port forward).
MGMT_ADDR = "10.0.2.15"
NET_PREFIX = "198.18"
#: ssh host names of the pair, as the testbed names them (``ssh:pc-producer``).
HOST_ALIAS = {"producer": "pc-producer", "consumer": "pc-consumer"}
#: Written into the control share to ask a guest to power off.
STOP_FILE = "stop"
#: What each machine writes into its control share: sshd's log, and its health every 2 s.
SSHD_LOG = "sshd.log"
HEALTH_FILE = "health"
#: The guest's text symbols (/proc/kallsyms, written once at boot): where a stalled machine's vCPUs are.
KALLSYMS_FILE = "kallsyms"
#: A machine whose health file has not changed for this long (seconds of this machine's clock; the
#: guest writes it every 2 s of its own, and its clock keeps real time under emulation) has stopped.
STALL_S = 60.0
MAX_RAILS = 4


@dataclass(frozen=True)
class MachinesSpec:
    """The two machines: rails (wires, one NIC and rxe device each), CPUs, NUMA nodes, memory, rail MTU."""

    rails: int = 2
    cpus: int = 2
    numa_nodes: int = 2
    memory_mib: int = 2048
    mtu: int = 4200              #: netdev MTU of the rails: 4200 gives rxe an active MTU of 4096
    accel: str = "auto"
    boot_timeout_s: float = 300.0

    def __post_init__(self):
        if not 1 <= self.rails <= MAX_RAILS:
            raise ValueError(f"machines: rails={self.rails} outside 1..{MAX_RAILS}")
        if not 1 <= self.numa_nodes <= self.cpus:
            raise ValueError(f"machines: numa_nodes={self.numa_nodes} needs 1..cpus ({self.cpus}) nodes")
        if self.memory_mib < 512 * self.numa_nodes:
            raise ValueError(f"machines: memory_mib={self.memory_mib} is under 512 MiB per NUMA node")
        if not 1280 <= self.mtu <= 65535:
            raise ValueError(f"machines: rail MTU {self.mtu} outside 1280..65535")

    def rail_node(self, rail: int) -> int:
        """The NUMA node rail ``rail``'s NIC sits on."""
        return rail % self.numa_nodes


def rail_addr(role: str, rail: int) -> str:
    """The data address of ``role`` on rail ``rail``."""
    return f"{NET_PREFIX}.{rail}.{1 if role == 'producer' else 2}"


def nic_mac(role: str, nic: int) -> str:
    """MAC of NIC ``nic`` of ``role`` (0 = the management NIC, 1.. = rails); the guest finds its NICs by it."""
    return f"52:54:00:5c:{ROLES.index(role) + 1:02x}:{nic:02x}"


def devices(spec: MachinesSpec) -> list[str]:
    """The RDMA devices each machine has (the same names on both)."""
    return [f"rxe{i}" for i in range(spec.rails)]


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one run: each guest's sshd forward, and each rail's wire."""

    ssh: dict[str, int]
    rails: tuple[int, ...]


def qemu_argv(kern: K.GuestKernel, spec: MachinesSpec, accel: str, role: str, ctl: Path, ports: Ports) -> list[str]:
    """The qemu command line of one machine (pure)."""
    # loglevel 4: the kernel's errors reach the console log (an OOM kill, an rxe error, a lockup),
    # which is all there is to read when a machine stops answering ssh.
    append = ["console=ttyS0", "panic=-1", "quiet", "loglevel=4", "mitigations=off", "nokaslr", *R.CLOCK_ARGS]
    per_node = spec.memory_mib // spec.numa_nodes
    argv = [R.QEMU, "-name", HOST_ALIAS[role], "-machine", "pc", "-accel", accel,
            "-cpu", "host" if accel == "kvm" else "max", "-smp", str(spec.cpus),
            "-m", str(per_node * spec.numa_nodes),
            "-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio",
            # The human monitor on a Unix socket beside (not in) the control share: describe() asks it
            # whether qemu's main loop still answers when the machine has stopped answering ssh.
            "-monitor", f"unix:{monitor_path(ctl)},server=on,wait=off",
            "-no-reboot", "-kernel", str(kern.vmlinuz), "-initrd", str(kern.initrd), "-append", " ".join(append),
            "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={ctl},mount_tag=ctl,security_model=none,multidevs=remap"]
    cpus = list(range(spec.cpus))
    for n in range(spec.numa_nodes):
        mine = cpus[n::spec.numa_nodes]
        argv += ["-object", f"memory-backend-ram,id=mem{n},size={per_node}M",
                 "-numa", f"node,nodeid={n},memdev=mem{n}," + ",".join(f"cpus={c}" for c in mine)]
        # A PCI expander bus per node: a NIC behind it reports that node (its _PXM) to the guest.
        # (QEMU plugs only bridges into a pxb: the NICs go behind a pci-bridge on it.)
        argv += ["-device", f"pxb,id=pxb{n},bus_nr={32 * (n + 1)},numa_node={n},bus=pci.0",
                 "-device", f"pci-bridge,id=node{n},chassis_nr={n + 1},bus=pxb{n},addr=0x0"]
    # The management NIC: QEMU's user network, restricted to the sshd forward on 127.0.0.1.
    argv += ["-netdev", f"user,id=mgmt,restrict=on,net=10.0.2.0/24,host=10.0.2.2,"
                        f"hostfwd=tcp:127.0.0.1:{ports.ssh[role]}-{MGMT_ADDR}:22",
             "-device", f"virtio-net-pci,netdev=mgmt,mac={nic_mac(role, 0)},bus=pci.0"]
    for i, port in enumerate(ports.rails):
        end = "listen" if role == "producer" else "connect"
        argv += ["-netdev", f"socket,id=rail{i},{end}=127.0.0.1:{port}",
                 "-device", f"virtio-net-pci,netdev=rail{i},mac={nic_mac(role, i + 1)},"
                            f"bus=node{spec.rail_node(i)},addr={i + 1:#x}"]
    return argv


def monitor_path(ctl: Path) -> Path:
    """Where the machine whose control share is ``ctl`` has its qemu monitor socket (outside the share)."""
    return ctl.parent / f"{ctl.name}.monitor"


def ask_monitor(path: Path, command: str, timeout: float = 5.0) -> str:
    """One command to a qemu human monitor socket: its answer, or what went wrong (never raises)."""
    def until_prompt(s: socket.socket) -> bytes:
        buf = b""
        while not buf.rstrip().endswith(b"(qemu)"):
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        return buf

    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            until_prompt(s)                     # the greeting
            s.sendall(command.encode() + b"\n")
            text = until_prompt(s).decode(errors="replace").replace("\r", "")
    except OSError as e:
        return f"no answer within {timeout:.0f} s ({type(e).__name__}: {e}): qemu's main loop may be stuck"
    # The monitor echoes the command (with terminal escapes) before its answer.
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and command not in ln and "(qemu)" not in ln]
    return " ".join(lines) or "an empty answer"


def process_threads(pid: int) -> str:
    """One line per thread of process ``pid``: its name, scheduler state and where it sleeps (from
    /proc; a stopped machine's qemu shows whether its vCPU threads spin, R, or all wait, S)."""
    base = Path(f"/proc/{pid}/task")
    try:
        tids = sorted(base.iterdir(), key=lambda t: int(t.name))
    except OSError as e:
        return f"(threads of {pid} unreadable: {e})"
    out = []
    for t in tids:
        try:
            stat = (t / "stat").read_text()
            wchan = (t / "wchan").read_text().strip() or "-"
        except OSError:
            continue            # the thread ended meanwhile
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        # utime + stime (fields 14 and 15 of stat): CPU time, to compare between two readings.
        out.append(f"{t.name} {name!r} state {rest[0]} wchan {wchan} cpu {int(rest[11]) + int(rest[12])} ticks")
    return "\n".join(out)


def vcpu_addresses(registers: str) -> list[int]:
    """The instruction pointer of each vCPU in qemu's answer to ``info registers -a`` (pure)."""
    return [int(x, 16) for x in re.findall(r"\bRIP=([0-9a-f]{16})\b", registers)]


def symbolize(addresses: list[int], kallsyms: str) -> list[str]:
    """Each address as ``0x... symbol+offset [module]`` from /proc/kallsyms text lines (pure; an address
    below every symbol stays hex)."""
    table = sorted((int(f[0], 16), f[2], " " + f[3] if len(f) > 3 else "")
                   for f in (line.split() for line in kallsyms.splitlines()) if len(f) >= 3 and f[1] in "tTwW")
    starts = [t[0] for t in table]
    out = []
    for a in addresses:
        i = bisect.bisect_right(starts, a) - 1
        out.append(f"{a:#x} {table[i][1]}+{a - table[i][0]:#x}{table[i][2]}" if i >= 0 else f"{a:#x}")
    return out


def _nic_by_mac(mac: str, name: str) -> str:
    return (f"for d in /sys/class/net/*; do [ \"$(cat $d/address)\" = {mac} ] && ip link set dev \"${{d##*/}}\" "
            f"name {name} && break; done; [ -e /sys/class/net/{name} ] || "
            f"{{ echo 'pcguest: no NIC with MAC {mac}'; exit 1; }}")


SSHD_CONFIG = """\
ListenAddress {addr}
HostKey /etc/ssh/pcguest/host_key
AuthorizedKeysFile /etc/ssh/pcguest/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 128
MaxStartups 128
PidFile /run/sshd.pid
"""


def sshd_config(revision: str | None) -> str:
    """The machines' sshd config (pure). Every session gets ``revision`` (this host's
    :func:`~peercache.bench.meta.git_revision`, when it has that form) as ``$PEERCACHE_GIT_REVISION``: a
    machine runs this host's checkout, read-only, and ``git status`` there took over 10 s of each serve
    and drive start under emulation."""
    text = SSHD_CONFIG.format(addr=MGMT_ADDR)
    if revision and REVISION.fullmatch(revision):
        text += f"SetEnv {REVISION_ENV}={revision}\n"
    return text


def setup_script(spec: MachinesSpec, role: str, revision: str | None = None) -> str:
    """What one machine runs at boot (pure; ``set -e``): name its NICs, address the rails, add an rxe
    device on each, wait for their ports, start sshd on the management address only (its sessions
    told the checkout's ``revision``: :func:`sshd_config`)."""
    lines = ["set -e", _nic_by_mac(nic_mac(role, 0), "mgmt"),
             f"ip addr add {MGMT_ADDR}/24 dev mgmt", "ip link set mgmt up"]
    for i in range(spec.rails):
        nic = f"rail{i}"
        lines += [_nic_by_mac(nic_mac(role, i + 1), nic), f"ip link set {nic} mtu {spec.mtu}",
                  f"ip addr add {rail_addr(role, i)}/24 dev {nic}", f"ip link set {nic} up",
                  f"rdma link add rxe{i} type rxe netdev {nic}"]
    for dev in devices(spec):
        lines.append(f"n=0; until grep -q ACTIVE /sys/class/infiniband/{dev}/ports/1/state; do "
                     f"n=$((n+1)); [ $n -lt 200 ] || {{ echo 'pcguest: {dev} port never became ACTIVE'; exit 1; }}; "
                     "sleep 0.1; done")
    # Root's login shell becomes sh in this guest (its overlay only): an ssh session then does not
    # source this machine's /root/.bashrc, which may start a Python version manager (seconds under TCG).
    lines += ["sed -i 's#^root:\\(.*\\):/bin/bash$#root:\\1:/bin/sh#' /etc/passwd",
              "mkdir -p /run/sshd /etc/ssh/pcguest",
              "cp /mnt/pcguest/host_key /mnt/pcguest/authorized_keys /etc/ssh/pcguest/",
              "chmod 600 /etc/ssh/pcguest/host_key",
              f"cat > /etc/ssh/pcguest/sshd_config <<'EOF'\n{sshd_config(revision)}EOF",
              f"/usr/sbin/sshd -f /etc/ssh/pcguest/sshd_config -E /mnt/pcguest/{SSHD_LOG}",
              "echo \"pcguest: $(hostname): RDMA devices $(ls /sys/class/infiniband | tr '\\n' ' ')"
              "NUMA nodes $(cat /sys/devices/system/node/online)\""]
    return "\n".join(lines) + "\n"


#: The machine's command: wait (bounded by the launcher's kill) until asked to power off, and meanwhile
#: write the machine's health every 2 s into the control share (uptime, load, sshd's listening socket
#: and its queue), which this side can read when the machine stops answering ssh.
WAIT_COMMAND = (f"(grep ' [tTwW] ' /proc/kallsyms > /mnt/pcguest/{KALLSYMS_FILE} 2>/dev/null &); "
                f"while [ ! -e /mnt/pcguest/{STOP_FILE} ]; do "
                f"{{ echo \"$(date +%T) up $(cut -d' ' -f1 /proc/uptime) s, load $(cat /proc/loadavg)\"; "
                f"ss -tlnH 'sport = :22'; ss -tnH state established '( sport = :22 )' | wc -l; }} "
                f"> /mnt/pcguest/{HEALTH_FILE}.new 2>&1; mv /mnt/pcguest/{HEALTH_FILE}.new /mnt/pcguest/{HEALTH_FILE}; "
                "sleep 2; done")


def ssh_config(ports: dict[str, int], identity: Path, known_hosts: Path) -> str:
    """The ssh client config naming the pair (pure): batch mode, this run's key and host keys only.

    A machine that answers no keepalive for 30 s (5 s x 6) is taken as gone: an emulated machine
    busy on both vCPUs can be silent for seconds, and a dropped shared master ends every session
    over it."""
    out = []
    for role, port in ports.items():
        out.append(f"Host {HOST_ALIAS[role]}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
                   f"  HostKeyAlias {HOST_ALIAS[role]}\n  IdentityFile {identity}\n  IdentitiesOnly yes\n"
                   f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
                   "  ServerAliveInterval 5\n  ServerAliveCountMax 6\n")
    return "\n".join(out)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    r = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise GuestUnavailable(f"ssh-keygen failed: {r.stderr.strip()}; apt-get install openssh-client")


def missing() -> list[str]:
    """What this machine lacks to boot the pair (empty when all is there)."""
    out = R.missing()
    for tool, pkg in (("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            out.append(f"`{tool}` is not installed: apt-get install {pkg}")
    if not Path("/usr/sbin/sshd").exists():
        out.append("the guests run this machine's /usr/sbin/sshd: apt-get install openssh-server")
    return out


@dataclass
class _Machine:
    role: str
    ctl: Path
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    def tail(self, n: int = 20) -> str:
        return "".join(self.lines[-n:])


class MachinePair:
    """Boots the two machines, hands out their ssh config, and always powers them off (a context manager)."""

    def __init__(self, spec: MachinesSpec = MachinesSpec(), *, progress: Callable[[str], None] | None = None,
                 console: Callable[[str, str], None] | None = None):
        self.spec = spec
        self.say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.console = console
        self.dir: Path | None = None
        self.machines: dict[str, _Machine] = {}
        self.ports: Ports | None = None
        self.accel = "?"
        self.kernel = "?"
        self.boot_s = float("nan")
        self.slowness = 1.0

    # -- paths -------------------------------------------------------------------------------
    @property
    def ssh_config_path(self) -> Path:
        assert self.dir is not None, "the pair is not started"
        return self.dir / "ssh_config"

    @property
    def ssh_control_dir(self) -> Path:
        """Where the run's processes share one ssh master connection per machine."""
        assert self.dir is not None, "the pair is not started"
        return self.dir / "ssh-mux"

    def environment(self) -> dict[str, str]:
        """Variables a pipeline run against the pair needs: its ssh config and shared masters, and how slow
        the guests are."""
        return {"PEERCACHE_SSH_CONFIG": str(self.ssh_config_path), "PEERCACHE_SSH_CONTROL_DIR": str(self.ssh_control_dir),
                "PEERCACHE_SLOWNESS": f"{self.slowness:.1f}", "PEERCACHE_MACHINES_KERNEL": self.kernel}

    def host_spec(self, role: str) -> str:
        return f"ssh:{HOST_ALIAS[role]}"

    def _ssh_base(self) -> list[str]:
        """ssh with this run's config and its shared masters' sockets."""
        return ["ssh", "-F", str(self.ssh_config_path), "-o", f"ControlPath={self.ssh_control_dir}/%C"]

    def ssh_argv(self, role: str, command: str) -> list[str]:
        """Plain ssh argv running ``command`` (a shell string) on ``role`` over this run's config."""
        # Over the run's shared master when one is up (ControlMaster=no: never become one), else directly.
        connect = round(SSH_CONNECT_TIMEOUT_S * max(1.0, self.slowness))     # sshd's banner is slow under load
        # `--`: ssh takes nothing after it as an option, as every ssh argv of the lab (hosts.SshHost)
        return [*self._ssh_base(), "-o", f"ConnectTimeout={connect}", "-o", "ControlMaster=no", "--",
                HOST_ALIAS[role], command]

    def ssh(self, role: str, command: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run ``command`` on ``role`` and return what it printed (never raises on its exit status)."""
        return subprocess.run(self.ssh_argv(role, command), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)

    # -- start -------------------------------------------------------------------------------
    def start(self) -> "MachinePair":
        problems = missing()
        if problems:
            raise GuestUnavailable("the two-machine Soft-RoCE testbed cannot run here: " + "; ".join(problems))
        kern = K.prepare(progress=self.say)
        self.kernel = kern.release
        self.accel = R.choose_accel(kern, R.GuestSpec(cpus=self.spec.cpus, accel=self.spec.accel), self.say)
        self.dir = Path(tempfile.mkdtemp(prefix="pcpair-"))
        self.ports = Ports(ssh={r: free_port() for r in ROLES}, rails=tuple(free_port() for _ in range(self.spec.rails)))
        t0 = time.monotonic()
        try:
            self._prepare_files()
            # The consumer's wires connect to the producer's listening ends: producer first.
            self._boot("producer", kern)
            self._await_listening(self.ports.rails, self.machines["producer"])
            self._boot("consumer", kern)
            for m in self.machines.values():
                self._await_ready(m, t0 + self.spec.boot_timeout_s)
            self.boot_s = time.monotonic() - t0
            self.slowness = max(self._slowness(m) for m in self.machines.values())
            for role in ROLES:
                self._await_ssh(role, t0 + self.spec.boot_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.say(f"peercache machines: pc-producer and pc-consumer up ({self.accel}, {self.spec.rails} rails, "
                 f"{self.spec.numa_nodes} NUMA nodes each, boot {self.boot_s:.0f} s, slowness x{self.slowness:.1f}); "
                 f"ssh -F {self.ssh_config_path} pc-producer")
        return self

    def _prepare_files(self) -> None:
        assert self.dir is not None and self.ports is not None
        _keygen(self.dir / "id_ed25519", "peercache-lab client")
        known = []
        rev = git_revision()
        for role in ROLES:
            ctl = self.dir / role
            ctl.mkdir()
            _keygen(ctl / "host_key", HOST_ALIAS[role])
            (ctl / "host_key.pub").unlink()
            pub = subprocess.run(["ssh-keygen", "-y", "-f", str(ctl / "host_key")], capture_output=True, text=True,
                                 timeout=30, check=True).stdout.strip()
            known.append(f"{HOST_ALIAS[role]} {pub}\n")
            shutil.copy2(self.dir / "id_ed25519.pub", ctl / "authorized_keys")
            shutil.copy2(R.STAGE2, ctl / "stage2.sh")
            exports = {"PCG_CWD": "/", "PCG_WORK": "", "PCG_HOSTNAME": HOST_ALIAS[role], "PCG_HOST_TMP": "1",
                       "PCG_PYTHON": sys.executable, "PCG_CALIB_CODE": R.CALIBRATION,
                       "PCG_HOST_CALIB": f"{R.host_calibration():.6f}"}
            (ctl / "env.sh").write_text("".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in exports.items()))
            (ctl / "topology.sh").write_text(setup_script(self.spec, role, rev))
            (ctl / "command.sh").write_text(WAIT_COMMAND + "\n")
        (self.dir / "known_hosts").write_text("".join(known))
        self.ssh_config_path.write_text(ssh_config(self.ports.ssh, self.dir / "id_ed25519", self.dir / "known_hosts"))

    def _boot(self, role: str, kern: K.GuestKernel) -> None:
        assert self.dir is not None and self.ports is not None
        ctl = self.dir / role
        m = _Machine(role, ctl, qemu_argv(kern, self.spec, self.accel, role, ctl, self.ports),
                     self.dir / f"{role}.console.log")
        self.machines[role] = m
        m.proc = subprocess.Popen(die_with_parent(m.argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        m.reader = threading.Thread(target=self._pump, args=(m,), daemon=True)
        m.reader.start()

    def _pump(self, m: _Machine) -> None:
        assert m.proc is not None and m.proc.stdout is not None
        with open(m.log, "w") as log:
            for raw in m.proc.stdout:
                line = raw.decode(errors="replace").replace("\r", "")
                m.lines.append(line)
                log.write(line)
                log.flush()
                if R.READY_MARK in line:
                    m.ready.set()
                if self.console is not None and line.startswith("pcguest:"):
                    self.console(m.role, line)

    def _await_listening(self, ports: tuple[int, ...], m: _Machine) -> None:
        deadline = time.monotonic() + 30
        while not all(LocalHost().is_port_open("127.0.0.1", p) for p in ports):
            if m.proc is not None and m.proc.poll() is not None:
                raise GuestError(f"{HOST_ALIAS[m.role]}: qemu exited {m.proc.returncode} at start: {m.tail()}")
            if time.monotonic() > deadline:
                raise GuestError(f"{HOST_ALIAS[m.role]}: qemu did not listen on its rail ports {ports} within 30 s")
            time.sleep(0.1)

    def _await_ready(self, m: _Machine, deadline: float) -> None:
        while not m.ready.wait(0.2):
            if m.proc is not None and m.proc.poll() is not None:
                raise GuestError(f"{HOST_ALIAS[m.role]} stopped while booting (qemu exited {m.proc.returncode}); "
                                 f"its console:\n{m.tail(25)}")
            if time.monotonic() > deadline:
                raise GuestTimeout(f"{HOST_ALIAS[m.role]} did not finish booting within "
                                   f"{self.spec.boot_timeout_s:.0f} s; its console:\n{m.tail(25)}")

    @staticmethod
    def _slowness(m: _Machine) -> float:
        try:
            return max(1.0, float((m.ctl / "slowness").read_text().strip()))
        except (OSError, ValueError):
            return 1.0

    def _await_ssh(self, role: str, deadline: float) -> None:
        last = ""
        while time.monotonic() < deadline:
            try:
                r = self.ssh(role, "hostname", timeout=30)
            except subprocess.TimeoutExpired:
                last = "ssh timed out"
                continue
            if r.returncode == 0 and r.stdout.strip() == HOST_ALIAS[role]:
                return
            last = (r.stderr or r.stdout).strip()
            time.sleep(0.5)
        raise GuestTimeout(f"{HOST_ALIAS[role]}: sshd did not answer through 127.0.0.1:{self.ports.ssh[role]} "
                           f"before the boot deadline: {last}")

    def describe(self, role: str, n: int = 30) -> str:
        """Whether ``role``'s qemu still runs, and the last ``n`` lines of its console: for an error
        about a machine that stopped answering."""
        m = self.machines.get(role)
        if m is None:
            return f"{HOST_ALIAS[role]}: never started"
        state = "running" if self.running(role) else f"qemu exited {m.proc.returncode if m.proc else '?'}"
        out = [f"{HOST_ALIAS[role]} ({state}; console {m.log}), its console's last lines:\n{m.tail(n)}"]
        if self.running(role):
            out.append(f"qemu's monitor, asked `info status`: {ask_monitor(monitor_path(m.ctl), 'info status')}")
            out.append(f"qemu's threads (pid {m.proc.pid}):\n{process_threads(m.proc.pid)}")
            out.append(self._where_vcpus_are(m))
        silent = self.silent_for(role)
        if silent is not None:
            out.append(f"its health file last changed {silent:.0f} s ago")
        for name, what in ((HEALTH_FILE, "its health (written every 2 s: time, uptime, load, sshd's "
                                         "listening socket with its queue, established ssh connections)"),
                           (SSHD_LOG, "sshd's log")):
            try:
                text = (m.ctl / name).read_text(errors="replace")
            except OSError as e:
                text = f"(unreadable: {e})"
            out.append(f"{what}:\n" + "".join(text.splitlines(keepends=True)[-10:]))
        return "\n".join(out)

    @staticmethod
    def _where_vcpus_are(m: _Machine, samples: int = 3) -> str:
        """Each vCPU's instruction pointer, ``samples`` times 1 s apart, named from the guest's kallsyms."""
        try:
            kallsyms = (m.ctl / KALLSYMS_FILE).read_text(errors="replace")
        except OSError:
            kallsyms = ""
        lines = []
        for k in range(samples):
            if k:
                time.sleep(1)
            answer = ask_monitor(monitor_path(m.ctl), "info registers -a", timeout=10)
            rips = vcpu_addresses(answer)
            lines.append(f"  sample {k + 1}: " + ("; ".join(f"CPU{i} {s}" for i, s in enumerate(symbolize(rips, kallsyms)))
                                                 if rips else answer[:200]))
        return ("its vCPUs' instruction pointers, 1 s apart" + ("" if kallsyms else " (no kallsyms from the guest)")
                + ":\n" + "\n".join(lines))

    def silent_for(self, role: str) -> float | None:
        """Seconds since ``role`` last wrote its health file (None before its first)."""
        m = self.machines.get(role)
        try:
            return time.time() - (m.ctl / HEALTH_FILE).stat().st_mtime if m is not None else None
        except OSError:
            return None

    def stalled(self, role: str) -> bool:
        """Whether ``role``'s qemu runs but the machine inside has written no health for STALL_S."""
        silent = self.silent_for(role)
        return self.running(role) and silent is not None and silent > STALL_S

    def restart(self) -> "MachinePair":
        """Power both machines off and boot a fresh pair: new keys, ports and ssh config (environment()
        changes with it)."""
        self.stop()
        self.machines, self.dir, self.ports = {}, None, None
        return self.start()

    # -- stop --------------------------------------------------------------------------------
    def running(self, role: str) -> bool:
        m = self.machines.get(role)
        return m is not None and m.proc is not None and m.proc.poll() is None

    def power_off(self, role: str, *, hard: bool = False, grace: float = 20.0) -> None:
        """Power ``role`` off: ask it (stop file, then poweroff) unless ``hard``; kill qemu when it does not go."""
        m = self.machines.get(role)
        if m is None or m.proc is None:
            return
        if not hard and m.proc.poll() is None:
            try:
                (m.ctl / STOP_FILE).write_text("stop\n")
            except OSError:
                pass
            try:
                m.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if m.proc.poll() is None:
            try:
                os.killpg(m.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            m.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if m.reader is not None:
            m.reader.join(timeout=5)

    def stop(self) -> None:
        """Power both machines off (together), remove the run's keys and config."""
        for m in self.machines.values():
            if m.proc is not None and m.proc.poll() is None:
                try:
                    (m.ctl / STOP_FILE).write_text("stop\n")
                except OSError:
                    pass
        if self.dir is not None and self.ssh_control_dir.is_dir():
            for role in ROLES:      # the shared masters, if the run started them
                subprocess.run([*self._ssh_base(), "-O", "exit", HOST_ALIAS[role]], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=15)
        for role in list(self.machines):
            self.power_off(role)
        if self.dir is not None:
            keep = os.environ.get("PEERCACHE_MACHINES_KEEP")
            if not keep:
                shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "MachinePair":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
