"""Errors of the guest runner: what could not run, and what went wrong while it ran."""
from __future__ import annotations


class GuestError(RuntimeError):
    """The guest could not run the command to its end."""


class GuestUnavailable(GuestError):
    """The guest cannot run on this machine at all; the message says what is missing and what to install."""


class GuestTimeout(GuestError):
    """The guest outlived its timeout and was killed."""
