"""The cluster secret: loading it, and the keys derived from it.

Every process of a cluster that shares one secret derives the same two
CURVE keypairs from it: the control plane's servers (discovery + directory)
use the *server* pair and accept only connections that prove the *client*
pair, so a process without the secret cannot send a single control request
(ZeroMQ CURVE: the requests are also encrypted and integrity-checked). The
data server's connection handshake checks :func:`data_token`.

Without a secret nothing is authenticated; the defaults then keep every
endpoint on loopback, and binding another address prints
:func:`open_warning`.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import stat
from dataclasses import dataclass

import zmq
from zmq.utils import z85

from .errors import ConfigError

log = logging.getLogger(__name__)

#: Environment variable holding the secret itself (``--auth-key-file`` wins over it).
ENV_VAR = "PEERCACHE_AUTH_KEY"
#: Shortest secret accepted, in bytes.
MIN_SECRET_BYTES = 16
#: ZAP domain of the control-plane servers.
ZAP_DOMAIN = b"peercache"
_SALT = b"peercache auth v1"
_MAKE_ONE = "make one with: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE"


def _hkdf(secret: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``secret`` for the purpose ``info``."""
    prk = hmac.new(_SALT, secret, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def check_secret(secret: bytes, where: str) -> bytes:
    """``secret`` if it is long enough, else a ConfigError naming ``where`` it came from."""
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"the auth key from {where} is {len(secret)} bytes; use at least "
                          f"{MIN_SECRET_BYTES} ({_MAKE_ONE})")
    return secret


def load_secret(path: str | None = None, env: dict | None = None) -> bytes | None:
    """The secret from ``path`` (surrounding whitespace stripped), else from $PEERCACHE_AUTH_KEY, else None."""
    env = os.environ if env is None else env
    if path:
        try:
            with open(path, "rb") as f:
                secret = f.read(1 << 16).strip()
            mode = os.stat(path).st_mode
        except OSError as e:
            raise ConfigError(f"--auth-key-file {path}: cannot read it ({e.strerror or e}); {_MAKE_ONE}") from e
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("auth key file %s can be read by other users (mode %o); chmod 600 it",
                        path, stat.S_IMODE(mode))
        return check_secret(secret, f"--auth-key-file {path}")
    value = env.get(ENV_VAR)
    if value:
        return check_secret(value.strip().encode(), f"${ENV_VAR}")
    return None


def resolve(auth_key: bytes | str | None) -> bytes | None:
    """The library's ``auth_key=`` argument as bytes; None falls back to $PEERCACHE_AUTH_KEY."""
    if auth_key is None:
        return load_secret()
    if isinstance(auth_key, str):
        auth_key = auth_key.encode()
    if not isinstance(auth_key, (bytes, bytearray, memoryview)):
        raise ConfigError(f"auth_key must be bytes or str, not {type(auth_key).__name__}")
    return check_secret(bytes(auth_key), "auth_key=")


@dataclass(frozen=True)
class CurveKeys:
    """The two CURVE keypairs (Z85) derived from one secret."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    def __repr__(self) -> str:  # never print secret halves
        return f"CurveKeys(server_public={self.server_public!r})"

    def server(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server (set before bind; a ZAP handler must be bound first)."""
        sock.curve_server = True
        sock.curve_secretkey = self.server_secret
        sock.curve_publickey = self.server_public
        sock.zap_domain = ZAP_DOMAIN

    def client(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of a server with these keys (set before connect)."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.client_public
        sock.curve_secretkey = self.client_secret


def curve_keys(secret: bytes | None) -> CurveKeys | None:
    """Deterministic CURVE keypairs of ``secret`` (None without a secret)."""
    if secret is None:
        return None
    if not zmq.has("curve"):
        raise ConfigError("an auth key needs ZeroMQ with CURVE security; this libzmq was built without "
                          "it (install pyzmq's wheel, which bundles libsodium-backed CURVE)")
    ss = z85.encode(_hkdf(secret, b"curve server"))
    cs = z85.encode(_hkdf(secret, b"curve client"))
    return CurveKeys(zmq.curve_public(ss), ss, zmq.curve_public(cs), cs)


def data_token(secret: bytes) -> bytes:
    """32-byte token the data server's connection handshake checks (HMAC-SHA256 of the secret)."""
    return hmac.new(_hkdf(secret, b"data token key"), b"peercache data-plane handshake v1",
                    hashlib.sha256).digest()


@dataclass(frozen=True)
class Credentials:
    """What one process holds of the cluster secret: its CURVE keys and the data token."""

    curve: CurveKeys | None = None
    data_token: bytes | None = None

    def __repr__(self) -> str:  # never print the token
        return f"Credentials(curve={self.curve!r}, data_token={'set' if self.data_token else None})"

    @classmethod
    def of(cls, secret: bytes | None) -> "Credentials":
        """The credentials of ``secret`` (empty ones without a secret)."""
        if secret is None:
            return cls()
        return cls(curve_keys(secret), data_token(secret))


#: No secret: nothing is authenticated.
NONE = Credentials()


def zap_reply(frames: list[bytes], keys: CurveKeys) -> list[bytes]:
    """The ZAP (RFC 27) reply to ``frames``: 200 only for CURVE with the derived client key."""
    if len(frames) < 6:
        rid = frames[1] if len(frames) > 1 else b""
        return [b"1.0", rid, b"400", b"malformed ZAP request", b"", b""]
    version, rid, domain, _address, _identity, mechanism = frames[:6]
    creds = frames[6:]
    ok = (version == b"1.0" and mechanism == b"CURVE" and len(creds) == 1 and len(creds[0]) == 32
          and hmac.compare_digest(z85.encode(creds[0]), keys.client_public))
    if ok:
        return [b"1.0", rid, b"200", b"OK", b"peercache-member", b""]
    return [b"1.0", rid, b"400", b"client key not derived from the cluster secret", b"", b""]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name from HOST:PORT) is reachable only from this machine."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False   # a name or a wildcard: assume the network can reach it


def open_warning(addr: str) -> str:
    """What anyone on the network can do to a control plane listening on ``addr`` without a secret."""
    return (f"discovery listens on {addr} without an auth key: anyone who can reach that "
            "address can read every page (look up any key and read it from its producer), publish "
            "keys that readers will then get, unregister or evict nodes, and stop `peercache-bench "
            f"serve`. Give every process the same secret (--auth-key-file PATH or ${ENV_VAR}), or "
            "listen on 127.0.0.1 only.")


def warn_if_open(addr: str, keys: CurveKeys | None) -> bool:
    """Log :func:`open_warning` when ``addr`` is not loopback and there is no secret; True if warned."""
    host = addr.split("://", 1)[-1].rpartition(":")[0]
    if keys is None and not is_loopback(host):
        log.warning(open_warning(addr))
        return True
    return False
