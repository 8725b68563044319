"""Exceptions of the engine. Each message says what was wrong and what to do."""


class PeerCacheError(Exception):
    """Base class of every error the engine raises on purpose."""


class ConfigError(PeerCacheError, ValueError):
    """Invalid options, refused before anything starts."""


class DiscoveryUnreachable(PeerCacheError):
    """The discovery node did not answer within the bounded wait."""


class HostNotFound(DiscoveryUnreachable):
    """The host of the discovery address (or of the directory's URL) does not resolve to an address."""


class InvalidArgument(PeerCacheError, TypeError):
    """An argument of the wrong type or shape (a key that is not str or bytes, a value or output buffer
    that is not a C-contiguous bytes-like object); a TypeError too, as Python's own were before."""


class RpcError(PeerCacheError):
    """A control-plane request got an error reply."""


class TransportError(PeerCacheError):
    """A data-path failure: connection lost, peer gone, transport unavailable."""


class TransportUnavailable(TransportError):
    """The requested transport cannot run on this machine or build."""


class InvalidLocation(PeerCacheError):
    """The directory returned a location that cannot be a slot (a corrupt or hostile publish)."""


class DeadlineExceeded(PeerCacheError, TimeoutError):
    """A read ran out of its time (the client's ``timeout``: one bound for the whole call, not one per
    step); the message names the step that did not answer and what to check."""
