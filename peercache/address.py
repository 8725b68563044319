"""HOST:PORT, the one place it is split, checked and written (issue 37: one place per rule).

An IPv6 host is written in brackets (``[::1]:31998``) and held without them (``::1``); a HOST:PORT is
split at its last colon, so an unbracketed IPv6 host (``::1:31998``) also splits as it always has.
:meth:`Address.parse` checks the shape (a host, a colon, a port of digits); the port's range is its
caller's (a listener may take port 0, a connection needs 1..65535), and so are the caller's messages.
:func:`split` and :func:`host_of` only split, for addresses checked before. Only the standard library
is imported: the lab's small remote tools import this too.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

#: A bracketed host: an IPv6 literal, maybe with a zone (``[fe80::1%eth0]``), as checks' host rule has it.
_BRACKETED = re.compile(r"\[([0-9A-Za-z:.%]+)\]")
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Address:
    """A HOST:PORT: ``host`` without brackets (``::1``, ``127.0.0.1``, a name), ``port`` a whole number."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> "Address":
        """``HOST:PORT`` (``[IPV6]:PORT`` too) -> Address; ValueError saying what is missing or wrong.

        The port is not range-checked here (callers say which range they take)."""
        if not isinstance(text, str):
            raise ValueError(f"{text!r} is not HOST:PORT text")
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError(f"{text!r} has no port (HOST:PORT)")
        if not _DIGITS.fullmatch(port):
            raise ValueError(f"{text!r}: port {port!r} is not a number")
        if host.startswith("["):
            m = _BRACKETED.fullmatch(host)
            if not m:
                raise ValueError(f"{text!r}: host {host!r} is not an [IPv6] address in brackets")
            host = m.group(1)
        elif "[" in host or "]" in host:
            raise ValueError(f"{text!r}: host {host!r} has a stray bracket")
        if not host:
            raise ValueError(f"{text!r} has no host (HOST:PORT)")
        return cls(host, int(port))

    def __str__(self) -> str:
        return join(self.host, self.port)

    @property
    def is_loopback(self) -> bool:
        """Whether only this machine can reach the host (see :func:`is_loopback`)."""
        return is_loopback(self.host)


def join(host: str, port: int | str) -> str:
    """HOST:PORT text of ``host`` and ``port``, an IPv6 host in brackets (``[::1]:80``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split(text: str) -> tuple[str, str]:
    """(host, port text) of HOST:PORT split at its last colon, the host's brackets dropped; nothing is
    checked (no colon: ``("", text)``). For addresses checked before, and for tools' output (``ss``)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), port


def host_of(text: str) -> str:
    """The host of HOST:PORT or of a ZeroMQ endpoint ``tcp://HOST:PORT``, brackets dropped; nothing is checked."""
    return split(text.split("://", 1)[-1])[0]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name from HOST:PORT, brackets or not) is reachable only from this
    machine: ``localhost``, 127.0.0.0/8 and ``::1``. A name, a wildcard (0.0.0.0, ::) or anything else is
    not: the network may reach it."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
