"""The guest's kernel and initramfs: Debian's stock kernel, fetched and cached, never installed.

``prepare()`` gets the image package that ``linux-image-amd64`` depends on
with ``apt-get download``, extracts the kernel and only the modules the guest
needs (with their dependency closure, from ``modinfo``), and packs a busybox
initramfs that loads them in dependency order. All of it lands in a cache
folder (``$PEERCACHE_GUEST_CACHE``, else ``$XDG_CACHE_HOME/peercache/guest``,
else ``~/.cache/peercache/guest``); a second call finds it there and asks apt
nothing.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from peercache.lab.launch.guest.errors import GuestUnavailable

#: The meta-package whose dependency names the kernel image to use.
META_PACKAGE = "linux-image-amd64"

#: Modules the guest loads (their dependencies come along): Soft-RoCE and the
#: verbs user interface, the crc32 rxe asks the crypto API for at run time,
#: rdma_cm for tools that use it, the 9p/virtio root, overlay, and the netdevs
#: the RDMA topology is built from (veth pairs in one guest, and a bridge joining a cluster's hosts;
#: virtio-net NICs when two guests are two machines, peercache.lab.launch.guest.machines).
GUEST_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "crc32_generic", "ib_uverbs", "rdma_ucm",
                 "rdma_rxe", "veth", "dummy", "virtio_net", "bridge")

#: Stage 1 of the guest: runs from the initramfs as /init.
INIT_SCRIPT = Path(__file__).with_name("init.sh")
BUSYBOX = Path("/bin/busybox")
STAMP = "ready"


@dataclass(frozen=True)
class GuestKernel:
    """A cached kernel: its release, the vmlinuz and the initramfs that boots it."""

    release: str
    vmlinuz: Path
    initrd: Path
    modules: tuple[str, ...]


def cache_root() -> Path:
    """Where prepared kernels are kept (see the module docstring)."""
    if os.environ.get("PEERCACHE_GUEST_CACHE"):
        return Path(os.environ["PEERCACHE_GUEST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "peercache" / "guest"


def _run(argv: list[str], *, what: str, todo: str, cwd: Path | None = None, timeout: float = 300) -> str:
    if shutil.which(argv[0]) is None:
        raise GuestUnavailable(f"{what}: `{argv[0]}` is not installed; {todo}")
    r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise GuestUnavailable(f"{what}: `{' '.join(argv)}` exited {r.returncode}: {' / '.join(tail)}; {todo}")
    return r.stdout


def image_package(progress=print) -> str:
    """The image package ``linux-image-amd64`` depends on now (for example linux-image-6.1.0-57-amd64).

    Without package lists (a fresh machine, or an image that cleaned them)
    apt knows no such package; as root, the lists are fetched once
    (``apt-get update``) and the question asked again.
    """
    todo = "run `apt-get update` (Debian's package lists are needed once)"
    try:
        return parse_image_dependency(_run(["apt-cache", "depends", META_PACKAGE],
                                           what="finding the guest kernel", todo=todo))
    except GuestUnavailable:
        if os.geteuid() != 0:
            raise
    progress("peercache guest: apt has no package lists; running `apt-get update` once")
    _run(["apt-get", "update", "-qq"], what="fetching Debian's package lists", todo=todo)
    return parse_image_dependency(_run(["apt-cache", "depends", META_PACKAGE],
                                       what="finding the guest kernel", todo=todo))


def parse_image_dependency(text: str) -> str:
    """The ``linux-image-*`` package named on a ``Depends:`` line of ``apt-cache depends``."""
    for line in text.splitlines():
        m = re.match(r"\s*Depends:\s*(linux-image-\S+)", line)
        if m:
            return m.group(1)
    raise GuestUnavailable(f"`apt-cache depends {META_PACKAGE}` names no linux-image package "
                           f"(got {text.strip()[:200]!r}); run `apt-get update`, or set PEERCACHE_GUEST_KERNEL "
                           "to an image package name")


def release_of(package: str) -> str:
    """The kernel release of an image package: linux-image-6.1.0-57-amd64 -> 6.1.0-57-amd64."""
    if not package.startswith("linux-image-"):
        raise GuestUnavailable(f"{package!r} is not a linux-image-* package name")
    return package[len("linux-image-"):]


def module_closure(wanted: tuple[str, ...], depends: dict[str, list[str]]) -> list[str]:
    """``wanted`` and everything they depend on, each after its dependencies (pure)."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            raise GuestUnavailable(f"module dependency cycle: {' -> '.join(chain + (name,))}")
        if name not in depends:
            raise GuestUnavailable(f"kernel module {name!r} (needed by {' -> '.join(chain) or 'the guest'}) "
                                   "is not in the kernel package; this kernel cannot run the guest")
        state[name] = "open"
        for dep in depends[name]:
            visit(dep, chain + (name,))
        state[name] = "done"
        order.append(name)

    for w in wanted:
        visit(w, ())
    return order


def _module_files(tree: Path) -> dict[str, Path]:
    """Module name (dashes as underscores) -> its .ko under an extracted lib/modules/<release>."""
    return {p.name[:-3].replace("-", "_"): p for p in tree.rglob("*.ko")}


def _depends(files: dict[str, Path], names: list[str]) -> dict[str, list[str]]:
    out = _run(["modinfo", "-F", "depends", *[str(files[n]) for n in names]], what="reading module dependencies",
               todo="apt-get install kmod")
    lines = out.splitlines()
    if len(lines) != len(names):
        raise GuestUnavailable(f"modinfo printed {len(lines)} lines for {len(names)} modules")
    return {n: [d.replace("-", "_") for d in line.split(",") if d] for n, line in zip(names, lines)}


def _closure_from_tree(files: dict[str, Path]) -> list[str]:
    """Resolve GUEST_MODULES against an extracted tree, asking modinfo only about what is reached."""
    depends: dict[str, list[str]] = {}
    todo = [m for m in GUEST_MODULES if m in files]
    while todo:
        depends.update(_depends(files, todo))
        todo = sorted({d for deps in depends.values() for d in deps if d in files and d not in depends})
    return module_closure(GUEST_MODULES, depends)


def initrd_key(module_names: list[str]) -> str:
    """What an initramfs was packed from: the stage-1 script and the module order."""
    h = hashlib.sha256(INIT_SCRIPT.read_bytes())
    h.update(Path(__file__).read_bytes())       # how it is packed
    h.update(" ".join(module_names).encode())
    return h.hexdigest()[:16]


def build_initramfs(dest: Path, modules: list[tuple[str, Path]]) -> None:
    """A newc cpio holding busybox, the modules (loaded in the listed order) and the stage-1 init."""
    if not BUSYBOX.exists():
        raise GuestUnavailable("the guest's initramfs needs a static busybox: apt-get install busybox-static")
    if shutil.which("cpio") is None:
        raise GuestUnavailable("packing the guest's initramfs needs cpio: apt-get install cpio")
    with tempfile.TemporaryDirectory(prefix="pcguest-initrd-") as tmp:
        root = Path(tmp)
        for d in ("bin", "dev", "proc", "sys", "tmp", "modules", "lower", "rw", "newroot"):
            (root / d).mkdir()
        shutil.copy2(BUSYBOX, root / "bin" / "busybox")
        for name, path in modules:
            shutil.copy2(path, root / "modules" / f"{name}.ko")
        (root / "modules" / "order").write_text("".join(f"{n}\n" for n, _ in modules))
        shutil.copy2(INIT_SCRIPT, root / "init")
        (root / "init").chmod(0o755)
        paths = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        part = dest.with_suffix(".part")
        with open(part, "wb") as f:
            r = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc"], input="\n".join(paths).encode(),
                               stdout=f, stderr=subprocess.PIPE, cwd=root, timeout=120)
        if r.returncode != 0:
            raise GuestUnavailable(f"cpio failed packing the initramfs: {r.stderr.decode(errors='replace')}")
        part.replace(dest)


def _load(d: Path) -> GuestKernel | None:
    """A complete cached kernel in ``d``, its initramfs repacked if init.sh changed; else None."""
    stamp = d / STAMP
    if not stamp.exists() or not (d / "vmlinuz").exists():
        return None
    wanted, _, order_txt = stamp.read_text().partition("\n")
    if wanted.split() != list(GUEST_MODULES):
        return None                     # another module set: fetch again
    order = order_txt.split()
    key = initrd_key(order)
    key_file = d / "initrd.key"
    if not (d / "initrd.cpio").exists() or not key_file.exists() or key_file.read_text().strip() != key:
        build_initramfs(d / "initrd.cpio", [(n, d / "modules" / f"{n}.ko") for n in order])
        key_file.write_text(key + "\n")
    return GuestKernel(d.name, d / "vmlinuz", d / "initrd.cpio", tuple(order))


def _cached(root: Path) -> GuestKernel | None:
    """The newest complete kernel in the cache, or None."""
    stamps = sorted(root.glob("*/" + STAMP), key=lambda p: p.stat().st_mtime, reverse=True)
    for stamp in stamps:
        k = _load(stamp.parent)
        if k is not None:
            return k
    return None


def prepare(*, progress=print) -> GuestKernel:
    """The guest kernel, from the cache or fetched now (see the module docstring)."""
    root = cache_root()
    wanted = os.environ.get("PEERCACHE_GUEST_KERNEL")
    hit = _load(root / release_of(wanted)) if wanted else _cached(root)
    if hit is not None:
        return hit
    package = wanted or image_package(progress)
    release = release_of(package)
    dest = root / release
    progress(f"peercache guest: fetching {package} (apt-get download; nothing is installed) into {dest}")
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "modules").mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="pcguest-kernel-", dir=root) as tmp:
        tmpd = Path(tmp)
        _run(["apt-get", "download", package], what=f"downloading {package}", cwd=tmpd,
             todo="check that Debian's package mirror is reachable and run `apt-get update`")
        debs = list(tmpd.glob("*.deb"))
        if len(debs) != 1:
            raise GuestUnavailable(f"apt-get download {package} left {len(debs)} .deb files in {tmpd}")
        x = tmpd / "x"
        _run(["dpkg-deb", "-x", str(debs[0]), str(x)], what=f"unpacking {debs[0].name}", todo="apt-get install dpkg")
        vmlinuz = x / "boot" / f"vmlinuz-{release}"
        tree = x / "lib" / "modules" / release
        if not vmlinuz.exists() or not tree.is_dir():
            raise GuestUnavailable(f"{debs[0].name} has no boot/vmlinuz-{release} or lib/modules/{release}")
        files = _module_files(tree)
        order = _closure_from_tree(files)
        shutil.copy2(vmlinuz, dest / "vmlinuz")
        for n in order:
            shutil.copy2(files[n], dest / "modules" / f"{n}.ko")
    # The stamp is written last: a fetch cut short leaves no "ready" kernel behind.
    (dest / STAMP).write_text(" ".join(GUEST_MODULES) + "\n" + " ".join(order) + "\n")
    progress(f"peercache guest: kernel {release} cached ({len(order)} modules)")
    k = _load(dest)
    if k is None:
        raise GuestUnavailable(f"the kernel cached in {dest} did not load back; remove that folder and retry")
    return k
