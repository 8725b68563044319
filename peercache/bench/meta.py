"""The host + meta block every result carries."""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from importlib import metadata

from .. import atomic
from ..errors import ConfigError
from ..redact import redact, redact_doc

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def now_iso() -> str:
    """Current UTC time, ISO 8601."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def cpu_model() -> str | None:
    """CPU model name from /proc/cpuinfo (None if unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return platform.processor() or None


#: The variable that gives :func:`git_revision` its answer: the Soft-RoCE guests, which run this host's
#: checkout read-only, set it to the host's answer (``git status`` over a guest's 9p root took over 10 s).
REVISION_ENV = "PEERCACHE_GIT_REVISION"
#: What :func:`git_revision` answers: a commit, and whether the checkout differed from it.
REVISION = re.compile(r"[0-9a-f]{7,64}(-dirty|-status-unknown)?")


def git_revision() -> str | None:
    """git revision of the checkout the package runs from (None outside one); ``$PEERCACHE_GIT_REVISION``
    (:data:`REVISION_ENV`) overrides it."""
    if os.environ.get(REVISION_ENV):
        return os.environ[REVISION_ENV]
    try:
        r = subprocess.run(["git", "-C", _PKG_DIR, "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    try:
        dirty = subprocess.run(["git", "-C", _PKG_DIR, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return r.stdout.strip() + "-status-unknown"
    return r.stdout.strip() + ("-dirty" if dirty else "")


def versions() -> dict[str, str | None]:
    """Versions of the packages on the data and control path."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("peercache", "numpy", "pyzmq", "msgpack"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def host_block() -> dict:
    """Where this ran: host, kernel, CPU, cores."""
    return {"host": socket.gethostname(), "kernel": platform.release(), "machine": platform.machine(),
            "cpu": cpu_model(), "cpus": os.cpu_count()}


def host_line(m: dict) -> str:
    """The first line of a tool's console table: where it ran (a document's meta: host block and revision)."""
    return f"# {m['host']} ({m['cpu']}), kernel {m['kernel']}, rev {m['git_revision']}"


def command_line() -> str:
    """The command that is running, exactly but for its secrets (a Redis URL's password is ``***``)."""
    return redact(shlex.join([os.path.basename(sys.argv[0])] + sys.argv[1:]))


def write_document(path: str, doc: dict, indent: int | None = 1) -> None:
    """Write a result document as JSON, every secret in it masked (:func:`peercache.redact.redact_doc`)."""
    text = json.dumps(redact_doc(doc), indent=indent)
    atomic.write_text(path, text + ("\n" if indent is None else ""))


def one_document_main(tool: str, args, run, indent: int | None = 1) -> int:
    """The tail of a tool that prints one JSON document (dirbench, growth): ``run(args, say)`` with progress to
    stderr unless ``args.quiet``; the document, secrets masked, on stdout and in ``args.out``; exit 2 for
    options it refused (ConfigError), 1 when the document says it failed, else 0."""
    say = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        doc = run(args, say)
    except ConfigError as e:
        print(f"{tool}: invalid options: {e}", file=sys.stderr)
        return 2
    print(json.dumps(redact_doc(doc)), flush=True)
    if args.out:
        write_document(args.out, doc, indent=indent)
    if doc["status"] != "ok":
        print(f"{tool}: FAILED: {doc['error']}", file=sys.stderr)
        return 1
    return 0
