"""Result files written whole or not at all.

Every document the engine and the lab leave behind (drive's and serve's ``--out``, a point's
``result.json``, tidy tables, figures, reports) goes through :func:`replacing`: the content is
written to a temporary file in the destination's own folder, flushed to disk, and renamed over the
destination. A reader sees the earlier file or the new one, never a cut-off one, and a failed write
(a full disk, a vanished folder) leaves the earlier file as it was and says so in one line
(:class:`WriteFailed`), with the free space where the disk is the cause.
"""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import PeerCacheError


class WriteFailed(PeerCacheError, OSError):
    """A result file could not be written; the earlier file at that path, if any, is unchanged."""


def _free_bytes(folder: Path) -> int | None:
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _size_words(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _failure(path: Path, e: OSError) -> WriteFailed:
    kept = "the earlier file there is kept" if path.exists() else "nothing was left there"
    what = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        free = _free_bytes(path.parent)
        room = f" ({_size_words(free)} free in {path.parent})" if free is not None else ""
        err = WriteFailed(f"could not write {path}: {what}{room}; {kept}. "
                          "Free some space there or write to another path")
    else:
        err = WriteFailed(f"could not write {path}: {what}; {kept}. "
                          "Check the folder exists and is writable, or write to another path")
    err.errno = e.errno          # callers that test for ENOSPC still can
    return err


def _fsync_folder(folder: Path) -> None:
    # The rename is durable only once the folder's entry is on disk; a folder that cannot be
    # opened for that (some network file systems) still got a whole file by the rename.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def replacing(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; on a clean exit it is synced and renamed
    over ``path``, on any error removed (``path`` untouched). OSErrors become :class:`WriteFailed`."""
    path = Path(path)
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
    except OSError as e:
        raise _failure(path, e) from e
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp makes the file 0600; a result file should have the mode any new file gets here.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _failure(path, e) from e
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_folder(folder)


def write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (see :func:`replacing`)."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_text(path, text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` whole or not at all (see :func:`replacing`)."""
    write_bytes(path, text.encode(encoding))
