"""Where sysfs and /proc are read from: the real root, or a fixture tree in tests.

Every sysfs / proc read of the engine (RDMA device discovery) and of the lab
(host capture, port counters, CPU samples) goes through :func:`sysfs_path`
and :func:`proc_path` (the pyperf habit), so a test can point either at a
folder such as ``tests/fixtures/lab/hosts/cx7-8bond`` that holds ``sys/...``
and ``proc/...``. The root is an explicit argument; the process-wide default
(``/``) can be changed with :func:`set_root` or, scoped, :func:`using_root`.
The GID table of a port is read here once, for both (:func:`gid_table`), and so are the two
formats sysfs writes that both read: a GID's IPv4 address (:func:`gid_ipv4`) and a kernel CPU or
node list such as ``0-3,8`` (:func:`parse_list`).
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from pathlib import Path
from typing import Iterator

_root = Path("/")


def get_root() -> Path:
    """The current default root."""
    return _root


def set_root(root: str | os.PathLike) -> Path:
    """Make *root* the default root; returns the previous one."""
    global _root
    previous, _root = _root, Path(root)
    return previous


@contextlib.contextmanager
def using_root(root: str | os.PathLike) -> Iterator[Path]:
    """Use *root* as the default root inside a ``with`` block."""
    previous = set_root(root)
    try:
        yield Path(root)
    finally:
        set_root(previous)


def _resolve(root: str | os.PathLike | None) -> Path:
    return Path(root) if root is not None else _root


def is_live(root: str | os.PathLike | None = None) -> bool:
    """True when *root* is the real machine's ``/`` (live commands and pyverbs may be used)."""
    return _resolve(root).resolve() == Path("/")


def sysfs_path(*parts: str | int, root: str | os.PathLike | None = None) -> Path:
    """Path of ``/sys/<parts>`` under *root* (default: the current root)."""
    return _resolve(root).joinpath("sys", *map(str, parts))


def proc_path(*parts: str | int, root: str | os.PathLike | None = None) -> Path:
    """Path of ``/proc/<parts>`` under *root* (default: the current root)."""
    return _resolve(root).joinpath("proc", *map(str, parts))


def read_attr(path: Path) -> tuple[str | None, str | None]:
    """(stripped text, None) of a sysfs/proc file, or (None, why it could not be read)."""
    try:
        return path.read_text(errors="replace").strip(), None
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except OSError as e:  # sysfs answers EINVAL for unused GID slots, EACCES for some attrs
        return None, f"cannot read {path}: {e.strerror or e}"


ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def gid_table(device: str, port: int, root: str | os.PathLike | None = None
              ) -> tuple[list[dict], list[str]]:
    """Populated GID entries of a port: ({index, gid, type, ndev, ipv4}, problems).

    ``type`` and ``ndev`` are None where their gid_attrs file cannot be read
    (with the reason in the entry's ``_missing``); unused slots (all zeros)
    are left out; ``problems`` names the entries that could not be read at all.
    """
    base = sysfs_path("class", "infiniband", device, "ports", port, root=root)
    try:
        names = sorted(int(n) for n in os.listdir(base / "gids") if n.isdigit())
    except OSError:
        return [], []
    entries, problems = [], []
    for idx in names:
        gid, why = read_attr(base / "gids" / str(idx))
        if gid is None:
            problems.append(why or "")
            continue
        if gid == ZERO_GID:
            continue
        e: dict = {"index": idx, "gid": gid}
        for key, sub in (("type", "types"), ("ndev", "ndevs")):
            text, why = read_attr(base / "gid_attrs" / sub / str(idx))
            e[key] = text
            if text is None:
                e.setdefault("_missing", {})[key] = why or "not available"
        e["ipv4"] = gid_ipv4(gid)  # None: an IPv6 or IB GID, no IPv4 address (not a missing value)
        entries.append(e)
    return entries, problems


def gid_ipv4(gid: str | None) -> str | None:
    """The IPv4 address of an IPv4-mapped GID, else None (an IPv6 or IB GID, or not a GID at all).

    Any IPv6 spelling is read: sysfs's (``0000:0000:0000:0000:0000:ffff:c612:0001``), compressed
    (``::ffff:c612:1``) or dotted (``::ffff:198.18.0.1``), in either case -> ``"198.18.0.1"``."""
    if not gid:
        return None
    try:
        mapped = ipaddress.IPv6Address(gid.strip()).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped is not None else None


_LIST_PART = re.compile(r"([0-9]+)(?:-([0-9]*))?")


def parse_list(text: str) -> list[int]:
    """A kernel CPU or node list (sysfs ``cpulist``, ``Cpus_allowed_list``, ``numactl`` output:
    ``"0"``, ``"0-3,8"``, ``""``) as its numbers in the order written; ValueError when a part is not
    N or N-M. Surrounding whitespace and empty parts are skipped; as the three readers before this one
    did, ``N-`` reads as N and a range written backwards (``3-1``) holds no number."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        m = _LIST_PART.fullmatch(part)
        if not m:
            raise ValueError(f"{part!r} in {text!r} is not a number or a range N-M of a kernel list")
        a = int(m.group(1))
        out.extend(range(a, int(m.group(2) or a) + 1))
    return out
