"""Checks of option values: one rule each, shared by ``peercache-bench``'s flags and HiCache's extra config.

Each checker takes the option as its caller names it (``"--warmup"``,
``"extra config 'timeout'"``) and returns the value, or raises a ConfigError
that names the option, says what was wrong and what to give. Every number has
an upper bound: a value past it is a typo, and would otherwise fail late, deep
inside a timer or an allocation, as an OverflowError.
"""
from __future__ import annotations

import math
import os
import re
import time
from typing import Any

from .address import Address
from .errors import ConfigError
from .sysfs import proc_path

#: Longest duration any option takes (timeouts, waits, TTLs, measured windows): a day.
MAX_SECONDS = 86400.0
#: Most data channels (connections / RC QPs) per peer; the rdma transport's own cap.
MAX_CHANNELS = 64
#: Largest byte count any option takes (a pool, a page): 1 PiB, far beyond any host.
MAX_BYTES = 1 << 50
#: Tenant and model names: they become the first parts of every key, separated by '/',
#: so neither may hold a '/' (tenant 'a/b' + model 'c' would share keys with 'a' + 'b/c').
NAME_CHARS = "A-Z a-z 0-9 . _ : @ + -"
NAME_RE = re.compile(r"[A-Za-z0-9._:@+-]{1,64}")
_SIZE = re.compile(r"\s*(\d{1,20})\s*([KMGTP]?)(i?B)?\s*", re.IGNORECASE)
_HOST = re.compile(r"\[[0-9A-Fa-f:.%A-Za-z]+\]|[A-Za-z0-9._:%-]{1,253}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def seconds(option: str, value: Any, *, positive: bool = False, allow_inf: bool = False,
            maximum: float = MAX_SECONDS) -> float:
    """A duration: a number >= 0 (> 0 with ``positive``) and at most ``maximum`` (inf too with ``allow_inf``)."""
    least = "> 0" if positive else ">= 0"
    hint = f"a number of seconds {least} and at most {maximum:g}" + (" (or inf: no limit)" if allow_inf else "")
    if not _is_number(value) or math.isnan(value):
        raise ConfigError(f"{option} must be {hint}, got {value!r}")
    if (value <= 0 if positive else value < 0):
        raise ConfigError(f"{option} must be {hint}, got {value!r}")
    if math.isinf(value) and allow_inf:
        return float(value)
    if value > maximum:
        raise ConfigError(f"{option} {value!r} is more than {maximum:g} s; give {hint}")
    return float(value)


def epoch(option: str, value: Any, *, ahead: float = MAX_SECONDS, now: float | None = None) -> float:
    """A start time in epoch seconds: finite, >= 0 and at most ``ahead`` seconds from now."""
    now = time.time() if now is None else now
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{option} must be a finite epoch time in seconds (e.g. $(date +%s)+5), got {value!r}")
    if value > now + ahead:
        raise ConfigError(f"{option} {value!r} is {value - now:.3g} s from now, more than {ahead:g} s ahead; "
                          "give a start time within that (e.g. $(date +%s)+5)")
    return float(value)


def integer(option: str, value: Any, *, minimum: int, maximum: int, what: str = "", least: str | None = None) -> int:
    """A whole number in ``minimum..maximum`` (not a bool, not a float); ``what`` says what it counts,
    ``least`` how a refusal words the minimum (">= minimum" unless given, e.g. "positive")."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{option} must be a whole number in {minimum}..{maximum}{what}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{option} must be {least or f'>= {minimum}'}{what}, got {value!r}")
    if value > maximum:
        raise ConfigError(f"{option} {value!r} is more than {maximum}{what}; give {minimum}..{maximum}")
    return value


def byte_size(option: str, value: Any, *, minimum: int = 0, maximum: int = MAX_BYTES) -> int:
    """A byte count: an integer or a string like '4GiB' / '512M', in ``minimum..maximum``."""
    hint = f"an integer or e.g. '4GiB', from {minimum} to {maximum} bytes"
    if isinstance(value, bool):
        raise ConfigError(f"{option}: {value!r} is not a byte count; give {hint}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        n = int(m.group(1)) << (10 * "KMGTP".find(m.group(2).upper()) + 10 if m.group(2) else 0)
    else:
        raise ConfigError(f"{option}: {value!r} is not a byte count; give {hint}")
    if n < minimum:
        raise ConfigError(f"{option}: {n} is below {minimum}; give {hint}")
    if n > maximum:
        raise ConfigError(f"{option}: {value!r} is {n} bytes, more than {maximum}; give {hint}")
    return n


def name(option: str, value: Any) -> str:
    """A tenant or model name: 1-64 of :data:`NAME_CHARS`, matched whole (no '/', no newline)."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ConfigError(f"{option}: {value!r} is not a name of 1-64 of {NAME_CHARS} "
                          "(no '/': it separates the parts of every key)")
    return value


def host_memory() -> int | None:
    """Physical memory of this host in bytes (None when it cannot be read)."""
    try:
        with open(proc_path("meminfo")) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def fits_memory(option: str, need: int) -> int:
    """``need`` bytes for ``option`` if this host has that much memory, else a ConfigError with both figures."""
    total = host_memory()
    if total is not None and need > total:
        raise ConfigError(f"{option}: {need} bytes is more than the {total} bytes of memory this host has; "
                          "give less")
    return need


def text(option: str, value: Any, pattern: str, what: str) -> str:
    """A string matched whole by ``pattern`` (described to the user as ``what``)."""
    if not isinstance(value, str) or not value or not re.fullmatch(pattern, value):
        raise ConfigError(f"{option}: {value!r} is not {what}")
    return value


def host(option: str, value: Any) -> str:
    """A host name or address to listen on or connect to (no port, no spaces)."""
    return text(option, value, _HOST.pattern, "a host name or IP address (for example 127.0.0.1 or 0.0.0.0)")


def host_port(option: str, value: Any) -> str:
    """HOST:PORT with a port a TCP socket can have (1..65535); a URL (``tcp://``...) is left to ZeroMQ."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{option}: {value!r} is not HOST:PORT (for example 127.0.0.1:31998)")
    if "://" in value:
        return text(option, value, r"[A-Za-z][A-Za-z0-9+.-]*://[^\s]+", "a URL without spaces")
    try:
        a = Address.parse(value)
    except ValueError:
        a = None
    if a is None or not _HOST.fullmatch(a.host):
        raise ConfigError(f"{option} {value!r} is not HOST:PORT (for example 127.0.0.1:31998)")
    if not 1 <= a.port <= 65535:
        raise ConfigError(f"{option} {value!r}: port {a.port} is outside 1..65535")
    return value


def writable_file(option: str, path: Any) -> str:
    """A file path a document can be written to now: its folder exists and may be written, and the path,
    if it exists, is a writable file (checked before a run, so that its result is not lost after it)."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{option}: {path!r} is not a file path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"{option} {path}: the folder {folder} does not exist; create it or write elsewhere")
    if os.path.isdir(path):
        raise ConfigError(f"{option} {path}: is a folder; give a file path inside it")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{option} {path}: the file exists and cannot be written by this user; "
                              "fix its permissions or write elsewhere")
    elif not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: the folder {folder} cannot be written by this user; "
                          "write elsewhere")
    return path
