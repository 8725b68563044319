"""Run one command inside a QEMU guest with Debian's kernel and real Soft-RoCE devices.

The guest has no NIC, so nothing it does leaves it. It sees the host's ``/``
read-only (with a tmpfs overlay, so writes stay in the guest) and the work
folder read-write at the same path, so results written there come back. The
command runs as root in the work folder; its output is streamed line by line,
its exit status returned. The guest is always powered off, and a guest that
outlives its timeout is killed: no qemu process is ever left behind.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from peercache.bench.meta import REVISION_ENV, git_revision
from peercache.lab.launch.guest import kernel as K
from peercache.lab.launch.guest import topology as T
from peercache.lab.launch.guest.errors import GuestError, GuestTimeout, GuestUnavailable

QEMU = "qemu-system-x86_64"
STAGE2 = Path(__file__).with_name("stage2.sh")
#: Printed by stage 2 once the topology is up; everything before it is boot noise.
READY_MARK = "pcguest: ready"
#: Kernel arguments of every guest (this runner's and the two machines'). ``tsc=reliable``: under TCG a
#: guest's TSC is the host's (constant rate, the same on every vCPU), but the kernel's boot-time sync check,
#: too slow under emulation, marks it unstable and falls back to the emulated HPET, where each clock read is
#: a system call and a device access. perftest calibrates its cycle counter (rdtsc) against gettimeofday
#: and gives up when the samples scatter: on the two machines over HPET, 6 of 12 runs of ``ib_write_bw -s
#: 131072`` failed so (r^2 0.52-0.88), and the pipeline's point used up its 8 attempts; over the TSC 12 of 12
#: passed, the guests' clocks still within 1 ms of where they started against the host's (170 s).
CLOCK_ARGS = ("tsc=reliable",)
#: How long a KVM probe boot may take to reach stage 2 before KVM is judged not to work.
KVM_PROBE_S = 30.0


@dataclass(frozen=True)
class GuestSpec:
    """How the guest is built: CPUs, memory, accelerator ("auto", "kvm" or "tcg")."""

    cpus: int = 2            #: virtual CPUs
    memory_mib: int = 4096   #: guest memory
    accel: str = "auto"      #: "auto" probes KVM once per host kernel and caches the verdict


@dataclass
class GuestResult:
    """What one guest run gave: the command's status, its output and timings."""

    returncode: int
    output: str
    accel: str
    kernel: str
    boot_s: float                      #: from qemu start to the "ready" mark
    wall_s: float
    topology: dict = field(default_factory=dict)


def missing() -> list[str]:
    """What this machine lacks to run the guest, each with what to do (empty when all is there)."""
    out = []
    if os.geteuid() != 0:
        out.append("the guest runner needs root (qemu's 9p shares with security_model=none, and the "
                   "guest's devices): run as root")
    if shutil.which(QEMU) is None:
        out.append(f"`{QEMU}` is not installed: apt-get install qemu-system-x86")
    if not K.BUSYBOX.exists():
        out.append("a static busybox is needed for the initramfs: apt-get install busybox-static")
    for tool, pkg in (("cpio", "cpio"), ("modinfo", "kmod"), ("dpkg-deb", "dpkg")):
        if shutil.which(tool) is None:
            out.append(f"`{tool}` is not installed: apt-get install {pkg}")
    return out


def qemu_argv(kern: K.GuestKernel, spec: GuestSpec, accel: str, ctl: Path, work: Path | None) -> list[str]:
    """The qemu command line (pure): no NIC, serial console on stdio, the host's / read-only over 9p."""
    append = ["console=ttyS0", "panic=-1", "quiet", "loglevel=3", "mitigations=off", "nokaslr", *CLOCK_ARGS]
    argv = [QEMU, "-accel", accel, "-cpu", "host" if accel == "kvm" else "max",
            "-smp", str(spec.cpus), "-m", str(spec.memory_mib),
            "-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-monitor", "none",
            "-nic", "none", "-no-reboot",
            "-kernel", str(kern.vmlinuz), "-initrd", str(kern.initrd), "-append", " ".join(append),
            "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={ctl},mount_tag=ctl,security_model=none,multidevs=remap"]
    if work is not None:
        argv += ["-virtfs", f"local,path={work},mount_tag=work,security_model=none,multidevs=remap"]
    return argv


def _accel_cache(kern: K.GuestKernel) -> Path:
    return K.cache_root() / f"accel-{os.uname().release}-{kern.release}.json"


def choose_accel(kern: K.GuestKernel, spec: GuestSpec, progress: Callable[[str], None]) -> str:
    """KVM when it really boots this guest here, else TCG; probed once per host kernel and cached."""
    if spec.accel in ("kvm", "tcg"):
        return spec.accel
    if spec.accel != "auto":
        raise GuestError(f"accelerator {spec.accel!r}: use auto, kvm or tcg")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    cache = _accel_cache(kern)
    if cache.exists():
        try:
            return json.loads(cache.read_text())["accel"]
        except (ValueError, KeyError):
            pass
    progress(f"peercache guest: /dev/kvm exists; probing whether KVM boots the guest (up to {KVM_PROBE_S:.0f} s)")
    try:
        r = _boot(kern, GuestSpec(cpus=1, memory_mib=1024, accel="kvm"), "kvm", "true", cwd=None, env={},
                  topo=T.Topology(rails=0), timeout=KVM_PROBE_S, stream=None)
    except GuestTimeout:
        ok = False          # the known failure: KVM starts, the guest never prints past the bootloader
    except GuestError as e:
        if "pcguest:" in str(e):
            # The guest's own init ran and failed: the guest is broken, not KVM; decide next time.
            progress(f"peercache guest: the KVM probe failed inside the guest, using tcg this time: {e}")
            return "tcg"
        ok = False          # qemu itself failed under KVM (seen: "failed to set MSR")
    else:
        ok = r.returncode == 0
    accel = "kvm" if ok else "tcg"
    progress(f"peercache guest: KVM {'boots' if ok else 'does not boot'} the guest here; using {accel}")
    cache.write_text(json.dumps({"accel": accel, "probed": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    return accel


#: A fixed piece of pure-Python work, timed on the host and in the guest: their ratio is the
#: guest's slowness factor (PEERCACHE_SLOWNESS), which tests scale their timeouts by.
CALIBRATION = "import time\nt=time.perf_counter()\ns=0\nfor i in range(2000000): s+=i*i\nprint(time.perf_counter()-t)"
_host_calib: list[float] = []


#: what a folder read through the cached root may be called (its name reaches stage 2's shell)
_CACHED_NAME = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")


def cached_folders(work: Path | None, prefix: str | os.PathLike = sys.prefix,
                   package: str | os.PathLike = Path(__file__).parents[3]) -> list[str]:
    """The read-mostly folders of the work folder (this interpreter's venv and the ``peercache`` package, where
    they lie inside it), as paths relative to it, that stage 2 shows through the guest's cached read-only root
    rather than the uncached work share. Every Python start in the guest reads hundreds of files there: over the
    work share each read is a 9p round trip at the guest's slowness (``import peercache.bench.cli`` took 26 s at
    x25, against 7 s once cached). What the guest writes in them (byte code) lands in its own overlay, never on
    the host. Pure."""
    if work is None:
        return []
    out = []
    for folder in (Path(prefix), Path(package)):
        try:
            rel = folder.resolve().relative_to(Path(work).resolve()).as_posix()
        except ValueError:
            continue
        if rel != "." and _CACHED_NAME.fullmatch(rel) and rel not in out:
            out.append(rel)
    return out


def host_calibration() -> float:
    """Seconds the calibration loop takes on this host (best of three, measured once per process)."""
    if not _host_calib:
        times = []
        for _ in range(3):
            r = subprocess.run([sys.executable, "-c", CALIBRATION], capture_output=True, text=True, timeout=60)
            times.append(float(r.stdout))
        _host_calib.append(min(times))
    return _host_calib[0]


def _kill(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _boot(kern: K.GuestKernel, spec: GuestSpec, accel: str, command: str, *, cwd: Path | None, env: dict,
          topo: "T.Topology", timeout: float, stream: Callable[[str], None] | None) -> GuestResult:
    """Boot once, run ``command``, power off; the core of :func:`run`."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pcguest-ctl-") as tmp:
        ctl = Path(tmp)
        shutil.copy2(STAGE2, ctl / "stage2.sh")
        rev = git_revision()
        exports = {**T.environment(topo), **({REVISION_ENV: rev} if rev else {}), **env, "PCG_CWD": str(cwd or "/"), "PCG_WORK": str(cwd or ""),
                   "PCG_CACHED": " ".join(cached_folders(cwd)),
                   "PEERCACHE_GUEST": "1",
                   "PCG_PYTHON": sys.executable, "PCG_CALIB_CODE": CALIBRATION, "PCG_HOST_CALIB": f"{host_calibration():.6f}"}
        (ctl / "env.sh").write_text("".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in exports.items()))
        (ctl / "topology.sh").write_text(T.setup_script(topo))
        (ctl / "command.sh").write_text(command + "\n")
        argv = qemu_argv(kern, spec, accel, ctl, cwd)
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        lines: list[str] = []
        ready_at: list[float] = []

        def pump() -> None:
            assert p.stdout is not None
            for raw in p.stdout:
                line = raw.decode(errors="replace").replace("\r", "")
                lines.append(line)
                if not ready_at:
                    if READY_MARK in line:
                        ready_at.append(time.monotonic())
                    elif line.startswith("pcguest:") and stream is not None:
                        stream(line)
                    continue
                if stream is not None and not line.startswith("pcguest: powering off"):
                    stream(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(p)
            reader.join(timeout=5)
            where = "during boot" if not ready_at else "while the command ran"
            tail = "".join(lines[-15:])
            raise GuestTimeout(f"the guest ({accel}) was still running after {timeout:.0f} s ({where}) and was "
                               f"killed; command: {command!r}; its last output:\n{tail}") from None
        finally:
            _kill(p)
            reader.join(timeout=5)
            if p.stdout is not None:
                p.stdout.close()
        rc_file = ctl / "rc"
        out = "".join(lines)
        if not rc_file.exists():
            raise GuestError(f"the guest ({accel}) stopped without an exit status (qemu exited {p.returncode}); "
                             f"its last output:\n{''.join(lines[-25:])}")
        rc = int(rc_file.read_text().strip() or 125)
    t1 = time.monotonic()
    return GuestResult(rc, out, accel, kern.release, (ready_at[0] - t0) if ready_at else float("nan"), t1 - t0,
                       T.describe(topo))


def run(command: str | list[str], *, cwd: str | os.PathLike | None = None, env: dict | None = None,
        topology: "T.Topology | None" = None, spec: GuestSpec = GuestSpec(), timeout: float = 1200,
        stream: Callable[[str], None] | None = None, progress: Callable[[str], None] | None = None) -> GuestResult:
    """Run ``command`` (a shell string, or an argv) as root in a fresh guest; see the module docstring.

    ``cwd`` is shared read-write at the same path (default: the current
    folder); ``stream`` gets each output line of the command as it comes.
    Raises GuestUnavailable when this machine cannot run the guest (the
    message says what to install), GuestTimeout when it ran past ``timeout``.
    """
    problems = missing()
    if problems:
        raise GuestUnavailable("the Soft-RoCE guest cannot run here: " + "; ".join(problems))
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    kern = K.prepare(progress=say)
    accel = choose_accel(kern, spec, say)
    cmd = command if isinstance(command, str) else shlex.join(command)
    work = Path(cwd if cwd is not None else os.getcwd()).resolve()
    return _boot(kern, spec, accel, cmd, cwd=work, env=dict(env or {}), topo=topology or T.Topology(),
                 timeout=timeout, stream=stream)
