"""Secrets out of everything written: one function for log lines, messages and documents.

:func:`redact` masks, in any text, the password of a Redis URL
(``redis://user:PASSWORD@host`` -> ``redis://user:***@host``, and so for ``rediss://`` and
``redis+sentinel://``; a lone ``redis://TOKEN@host`` is masked whole), the value of a secret environment
variable or flag written as ``NAME=VALUE`` / ``--flag VALUE``, and any literal
occurrence of a secret this process holds (:func:`remember`, and the values of
:data:`SECRET_ENV` in its environment). :func:`redact_doc` applies it to every
string of a JSON-like document and masks the values of secret-named keys.

Every document the project writes goes through :func:`redact_doc`: the bench's
result JSON and its meta block (``meta.command``), the lab's raw folders and
its tidy tables. Nothing here parses a URL strictly; a mask too many is
preferred to a secret in a file.
"""
from __future__ import annotations

import os
import re
from typing import Any

MASK = "***"
#: Environment variables whose values are secrets (the cluster secret, the Redis password).
SECRET_ENV = ("PEERCACHE_AUTH_KEY", "PEERCACHE_REDIS_PASSWORD")
#: Command-line flags followed by a secret (ours have none; the Redis tools' do).
SECRET_FLAGS = ("--requirepass", "--masterauth", "--password", "--pass", "--auth-key")
#: Dict keys whose values are secrets wherever they appear in a document.
SECRET_KEYS = ("auth_key", "password", "requirepass", "masterauth", "secret", "token", "data_token")
#: Literal secrets shorter than this are not searched for in text (they would mask ordinary words).
_MIN_LITERAL = 8

# redis://[user:]password@, rediss://... or redis+sentinel://... (rediss+sentinel:// too, which is
# refused, but in a message that quotes it), anywhere in a text: the userinfo ends at the last '@' of
# the word, so a password with an unescaped '@' or '/' is masked whole.
_URL = re.compile(r"(?i)\b(rediss?(?:\+sentinel)?://)(?:([^\s:@/'\"]*):)?[^\s'\"]*@")
_ENV = re.compile(r"\b(" + "|".join(SECRET_ENV) + r")=(\S+)")
_FLAG = re.compile(r"(?<!\S)(" + "|".join(map(re.escape, SECRET_FLAGS)) + r")(=|\s+)(\S+)")
_REDIS_TOOL = re.compile(r"(?:^|/)redis-(?:cli|benchmark)$")
_known: set[str] = set()


def remember(secret: bytes | str | None) -> None:
    """Mask ``secret`` wherever it appears in text from now on (a secret this process loaded)."""
    if not secret:
        return
    text = secret.decode("utf-8", "replace") if isinstance(secret, (bytes, bytearray)) else str(secret)
    if len(text) >= _MIN_LITERAL:
        _known.add(text)


def _literals() -> list[str]:
    env = (os.environ.get(name) for name in SECRET_ENV)
    found = _known | {v.strip() for v in env if v and len(v.strip()) >= _MIN_LITERAL}
    return sorted(found, key=len, reverse=True)   # the longest first: one secret may hold another


def _url(m: re.Match) -> str:
    user = m.group(2)
    return f"{m.group(1)}{user}:{MASK}@" if user is not None else f"{m.group(1)}{MASK}@"


def redact(text: str) -> str:
    """``text`` with every secret in it replaced by ``***`` (see the module docstring)."""
    if not isinstance(text, str) or not text:
        return text
    out = _URL.sub(_url, text)
    out = _ENV.sub(lambda m: f"{m.group(1)}={MASK}", out)
    out = _FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", out)
    for secret in _literals():
        out = out.replace(secret, MASK)
    return out


def redact_argv(argv: list) -> list:
    """An argv list redacted element by element, with the element after a secret flag masked."""
    out = [redact(a) if isinstance(a, str) else redact_doc(a) for a in argv]
    redis_tool = bool(argv) and isinstance(argv[0], str) and bool(_REDIS_TOOL.search(argv[0]))
    for i in range(len(out) - 1):
        a = argv[i]
        if isinstance(a, str) and (a in SECRET_FLAGS or (redis_tool and a == "-a")):
            out[i + 1] = MASK
    return out


def redact_doc(doc: Any) -> Any:
    """A copy of a JSON-like ``doc`` with every string redacted and secret-named keys' values masked."""
    if isinstance(doc, str):
        return redact(doc)
    if isinstance(doc, dict):
        return {k: (MASK if isinstance(k, str) and k.lower() in SECRET_KEYS and doc[k] not in (None, "", b"")
                    else redact_doc(v)) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        out = redact_argv(list(doc))
        return out if isinstance(doc, list) else tuple(out)
    if isinstance(doc, (bytes, bytearray)):
        return MASK if any(s.encode() in doc for s in _literals()) else doc
    return doc
