"""The cluster secret: loading it, and the keys derived from it.

Every process of a cluster that shares one secret derives the same two
CURVE keypairs from it: the control plane's servers (discovery + directory)
use the *server* pair and accept only connections that prove the *client*
pair, so a process without the secret cannot send a single control request
(ZeroMQ CURVE: the requests are also encrypted and integrity-checked). The
tcp data server's connections open with a challenge-response over
:func:`data_key` (:class:`DataKey`), in which each side proves the secret and
neither sends it.

Without a secret nothing is authenticated; the defaults then keep every
endpoint on loopback, and binding another address prints
:func:`open_warning`.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import os
import stat
import string
from dataclasses import dataclass

import zmq
from zmq.utils import z85

from .address import host_of, is_loopback
from .errors import ConfigError
from .redact import remember

log = logging.getLogger(__name__)

#: Environment variable holding the secret itself (``--auth-key-file`` wins over it).
ENV_VAR = "PEERCACHE_AUTH_KEY"
#: Shortest secret accepted, in bytes.
MIN_SECRET_BYTES = 16
#: Least entropy a secret must carry by :func:`estimated_bits`, in bits.
MIN_SECRET_BITS = 128
#: Fewest distinct byte values a secret may have (catches 'aaaa...', 'abab...', a zero-filled file).
MIN_DISTINCT_BYTES = 8
#: Longest key file read: a secret is a few dozen bytes; more is the wrong file.
MAX_KEY_FILE_BYTES = 4096
#: ZAP domain of the control-plane servers.
ZAP_DOMAIN = b"peercache"
_SALT = b"peercache auth v1"
_MAKE_ONE = "make one with: head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE"
#: Alphabets a secret may be drawn from, smallest first: (size, name, bytes).
_ALPHABETS = (
    (10, "decimal digits", frozenset(b"0123456789")),
    (16, "hex digits", frozenset(b"0123456789abcdef")),
    (16, "hex digits", frozenset(b"0123456789ABCDEF")),
    (26, "lower-case letters", frozenset(string.ascii_lowercase.encode())),
    (36, "lower-case letters and digits", frozenset((string.ascii_lowercase + string.digits).encode())),
    (62, "letters and digits", frozenset((string.ascii_letters + string.digits).encode())),
    (66, "base64 characters", frozenset((string.ascii_letters + string.digits + "+/=-_").encode())),
    (95, "printable ASCII", frozenset(bytes(range(32, 127)))),
    (256, "bytes", frozenset(range(256))),
)


def _hkdf(secret: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``secret`` for the purpose ``info``."""
    prk = hmac.new(_SALT, secret, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def estimated_bits(secret: bytes) -> tuple[float, str]:
    """A simple upper estimate of the entropy of ``secret``: its length times log2 of the smallest
    common alphabet holding every byte of it; with that alphabet's name."""
    used = set(secret)
    for size, name, alphabet in _ALPHABETS:
        if used <= alphabet:
            return len(secret) * math.log2(size), name
    raise AssertionError("every byte is in the last alphabet")


def check_secret(secret: bytes, where: str) -> bytes:
    """``secret`` if it can carry 128 bits by a simple test (length, variety, alphabet), else a ConfigError
    naming ``where`` it came from and how to make a good one."""
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"the auth key from {where} is {len(secret)} bytes; use at least "
                          f"{MIN_SECRET_BYTES} ({_MAKE_ONE})")
    distinct = len(set(secret))
    if distinct == 1:
        raise ConfigError(f"the auth key from {where} is {len(secret)} copies of the byte 0x{secret[0]:02x}: "
                          f"it carries no secret ({_MAKE_ONE})")
    if distinct < MIN_DISTINCT_BYTES:
        raise ConfigError(f"the auth key from {where} repeats {distinct} byte values; a random secret of that "
                          f"length has many more ({_MAKE_ONE})")
    bits, alphabet = estimated_bits(secret)
    if bits < MIN_SECRET_BITS:
        raise ConfigError(f"the auth key from {where}: {len(secret)} {alphabet} carry at most {bits:.0f} bits; "
                          f"a secret needs {MIN_SECRET_BITS} ({_MAKE_ONE})")
    remember(secret)
    return secret


def read_key_file(path: str, option: str = "--auth-key-file") -> bytes:
    """The secret in the key file ``path`` (surrounding whitespace stripped), after ssh's checks: a regular
    file that neither group nor others may read or write; a ConfigError naming ``option`` otherwise."""
    what = f"{option} {path}"
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"{what}: cannot read it ({e.strerror or e}); {_MAKE_ONE}") from e
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} is not a regular file (a device, a pipe or a folder); the secret must be "
                          f"a file of its own ({_MAKE_ONE})")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what} can be read or written by other users (mode {stat.S_IMODE(st.st_mode):03o}): "
                          f"a secret must be the owner's alone; chmod 600 {path}")
    if st.st_size > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{what} is {st.st_size} bytes, more than the {MAX_KEY_FILE_BYTES} of a key file; "
                          f"is it the right file? ({_MAKE_ONE})")
    try:
        with open(path, "rb") as f:
            secret = f.read(MAX_KEY_FILE_BYTES + 1).strip()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read it ({e.strerror or e}); {_MAKE_ONE}") from e
    return check_secret(secret, what)


def load_secret(path: str | None = None, env: dict | None = None, option: str = "--auth-key-file") -> bytes | None:
    """The secret from the key file ``path`` (:func:`read_key_file`), else from $PEERCACHE_AUTH_KEY, else None;
    ``option`` is how errors name ``path`` (a flag, or a HiCache config key)."""
    env = os.environ if env is None else env
    if path:
        return read_key_file(path, option)
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


#: Bytes of the data key, of each handshake nonce and of each MAC.
DATA_KEY_BYTES = NONCE_BYTES = MAC_BYTES = 32
#: Bytes of an address as the handshake binds it: IPv6 (IPv4 mapped), then the port, network order.
ADDR_BYTES = 18
#: Bytes of the transcript the handshake's MACs are over: cn || sn || the address.
TRANSCRIPT_BYTES = 2 * NONCE_BYTES + ADDR_BYTES
#: What each MAC over the transcript is for (native/handshake.c's LABELS): distinct labels, so that
#: no proof is another (a server's proof is never a client's) and neither is the session key.
_DATA_LABELS = {"server": b"peercache data v2 server", "client": b"peercache data v2 client",
                "session": b"peercache data v2 session"}
_REQUEST_LABEL = b"peercache data v2 request"


def data_key(secret: bytes) -> bytes:
    """The 32-byte key of the data plane's handshake (:class:`DataKey`), derived from the secret. It is
    never sent: each side proves it holds it."""
    return _hkdf(secret, b"data plane key v2")


def _mac(key: bytes, message: bytes) -> bytes:
    return hashlib.blake2b(message, key=key, digest_size=MAC_BYTES).digest()


@dataclass(frozen=True)
class DataKey:
    """The MACs of the tcp data plane's handshake and of its requests' tags; native/handshake.c is the
    same construction in C (tests/engine/transport/test_data_handshake.py checks both on one vector).

    Every MAC is keyed BLAKE2b-256 (RFC 7693's keyed mode, a MAC as it stands; libb2 in C)::

        t                 = cn || sn || address
        proof(side, t)    = MAC(key, "peercache data v2 " + side || t)      side: server, client
        session(t)        = MAC(key, "peercache data v2 session" || t)
        tag(seq, request) = MAC(session, "peercache data v2 request" || seq (u64 LE) || request)

    ``key`` is :func:`data_key`; ``cn`` and ``sn`` the client's and the server's fresh 32-byte nonces;
    ``address`` the server's side of the connection as the server sees it (ADDR_BYTES); ``request`` a
    request's header and ops; ``seq`` counts the requests before it on its connection. The server
    proves itself first, over the client's nonce and its address: a client tells nothing to a server
    that has not proved the secret, nor to one that proves it from another address than the one the
    client reached (whatever forwards the connection: a relay). The client's proof is over the
    server's nonce, so a recorded one is worth nothing on another connection; the labels keep a proof
    from serving as the other side's; and the tags, keyed by the session and numbered, keep whoever
    sits on the path from adding, replaying or changing a request.
    """

    key: bytes

    def __repr__(self) -> str:  # never print the key
        return "DataKey(...)"

    def proof(self, side: str, transcript: bytes) -> bytes:
        """The proof of ``side`` ("server" or "client") over ``transcript`` (cn || sn || address)."""
        return _mac(self.key, _DATA_LABELS[side] + transcript)

    def session(self, transcript: bytes) -> bytes:
        """The key of the tags of the connection whose handshake had this ``transcript``."""
        return _mac(self.key, _DATA_LABELS["session"] + transcript)

    @staticmethod
    def tag(session: bytes, seq: int, request: bytes) -> bytes:
        """The tag of request number ``seq`` (its header and ops) of a connection with this ``session``."""
        return _mac(session, _REQUEST_LABEL + seq.to_bytes(8, "little") + request)


@dataclass(frozen=True)
class Credentials:
    """What one process holds of the cluster secret: its CURVE keys and the data key."""

    curve: CurveKeys | None = None
    data: DataKey | None = None

    def __repr__(self) -> str:  # never print the key
        return f"Credentials(curve={self.curve!r}, data={'set' if self.data else None})"

    @classmethod
    def of(cls, secret: bytes | None) -> "Credentials":
        """The credentials of ``secret`` (empty ones without a secret)."""
        if secret is None:
            return cls()
        return cls(curve_keys(secret), DataKey(data_key(secret)))


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


_WILDCARDS = ("", "*", "0.0.0.0", "::")


def who_can_reach(host: str) -> str:
    """Who can connect to a listener on ``host`` (one that is not loopback), in words."""
    h = host.strip("[]")
    if h in _WILDCARDS:
        return ("any host that can reach any address of this machine (every network it is on, and "
                "any network routed to one of them)")
    try:
        ip = ipaddress.ip_address(h.split("%", 1)[0])
    except ValueError:
        return f"any host that can reach {h} (a name: whatever address it resolves to)"
    if ip.is_global:
        return f"any host on the internet that can route to {h}"
    return f"any host that can reach {h} (its network, and any network routed to it)"


def open_warning(addr: str, what: str = "discovery") -> str:
    """What anyone on the network can do to ``what`` (discovery, or a node's data server) listening on
    ``addr`` without a secret, who that is, and how to close it."""
    host = host_of(addr)
    who = who_can_reach(host)
    fix = (f"Give every process the same secret (--auth-key-file PATH or ${ENV_VAR}; HiCache: "
           "auth_key_file), or listen on 127.0.0.1 only")
    if what == "data":
        return (f"the data server listens on {addr} without an auth key: {who} can read every page "
                "in this node's pool, without asking the directory (with no secret, its connections "
                f"are not authenticated). {fix} (--bind 127.0.0.1; HiCache: bind).")
    return (f"discovery listens on {addr} without an auth key: {who} can read every page (look up any "
            "key and read it from its producer), publish keys that readers will then get, unregister "
            f"or evict nodes, and stop `peercache-bench serve`. {fix}.")


def warn_if_open(addr: str, keys: CurveKeys | None, what: str = "discovery") -> bool:
    """Log :func:`open_warning` when ``addr`` is not loopback and there is no secret; True if warned."""
    host = host_of(addr)
    if keys is None and not is_loopback(host):
        log.warning(open_warning(addr, what))
        return True
    return False
