"""Token authorization, TorchServe 0.11.1 semantics: three keys, a key file, expiry and rotation.

At start the server writes ``key_file.json`` (mode 0600) in TorchServe's shape::

    {"management": {"key": "...", "expiration time": "2024-02-16T21:12:24.801167Z"},
     "inference":  {"key": "...", "expiration time": "..."},
     "API":        {"key": "..."}}

Inference routes need ``Authorization: Bearer <inference key>``, management routes the
management key, ``GET /token?type=management|inference`` (rotation) the API key, which never
expires. An expired key answers 401 until rotated. Keys are compared in constant time. The
key file is deleted at shutdown, as TorchServe does, but only while it still holds what this
server wrote: a second server (a failed start, or one sharing the path) never deletes another's
keys.

With ``token_keys_file`` the operator provides the keys (in the key file's shape; e.g. a
Kubernetes Secret shared by every replica): they are used as they are, never expire, and the
server neither writes, deletes nor rotates them (``/token`` answers 400: rotate the Secret).
Torch-free.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torchbay.server.errors import BadRequest, ConfigError, ServiceUnavailable, Unauthorized
from torchbay.server.http.asgi import Scope, header

log = logging.getLogger("torchbay.auth")

KeyKind = Literal["management", "inference", "API"]
ROTATABLE = ("management", "inference")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


@dataclass
class _Key:
    value: str
    expires_at: float | None  # epoch seconds; None = never (the API key)

    def to_json(self) -> dict[str, str]:
        out = {"key": self.value}
        if self.expires_at is not None:
            stamp = dt.datetime.fromtimestamp(self.expires_at, dt.timezone.utc)
            out["expiration time"] = stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return out


def new_key() -> str:
    """A fresh random key: 32 url-safe characters (192 bits; TorchServe's are 8)."""
    return secrets.token_urlsafe(24)


class TokenAuth:
    """The server's three keys. ``check`` raises Unauthorized; ``rotate`` replaces one key."""

    def __init__(
        self,
        key_file: Path,
        expiration_min: float,
        *,
        clock: Callable[[], float] = time.time,
        keys_file: Path | None = None,
    ) -> None:
        self.key_file = key_file
        self.expiration_s = expiration_min * 60
        self.clock = clock
        self._written: str | None = None  # the key file's text as this server last wrote it
        self.provided = keys_file is not None
        if keys_file is not None:
            self.keys = _read_provided_keys(keys_file)
            return
        now = clock()
        self.keys: dict[str, _Key] = {
            "management": _Key(new_key(), now + self.expiration_s),
            "inference": _Key(new_key(), now + self.expiration_s),
            "API": _Key(new_key(), None),
        }

    # -- the key file ---------------------------------------------------------------------------

    def key_file_json(self) -> dict[str, Any]:
        return {kind: key.to_json() for kind, key in self.keys.items()}

    def write_key_file(self) -> None:
        """Write the keys atomically, readable by the owner only (0600 from creation on)."""
        if self.provided:
            return  # the operator's keys stay where the operator put them
        path = self.key_file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        text = json.dumps(self.key_file_json(), indent=2)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o600)  # a umask can only remove bits, but be explicit
            tmp.replace(path)
        except BaseException:  # a full disk: no half-written copy of the keys stays behind
            tmp.unlink(missing_ok=True)
            raise
        self._written = text

    def delete_key_file(self) -> bool:
        """Delete the key file if it still holds the keys this server wrote; True if deleted."""
        if self._written is None:
            return False
        try:
            current = self.key_file.read_text()
        except OSError:  # gone already, or not ours to read
            return False
        if current != self._written:
            log.info("key file %s now holds another server's keys: left in place", self.key_file)
            return False
        with contextlib.suppress(FileNotFoundError):
            self.key_file.unlink()
        self._written = None
        return True

    # -- checks ---------------------------------------------------------------------------------

    def check(self, authorization: bytes | str | None, kind: KeyKind) -> None:
        """Accept ``Bearer <key of this kind>`` that has not expired; else raise Unauthorized."""
        if authorization is None:
            raise Unauthorized(
                f"Token authorization failed: missing 'Authorization: Bearer <{kind} key>' "
                "header (keys are in the server's key file)",
                headers=_CHALLENGE,
            )
        if isinstance(authorization, str):
            authorization = authorization.encode("latin-1", "replace")
        scheme, _, token = authorization.strip().partition(b" ")
        key = self.keys[kind]
        # compare_digest on bytes of any length: the time taken does not reveal the key.
        good = scheme.lower() == b"bearer" and hmac.compare_digest(
            token.strip(), key.value.encode()
        )
        if not good:
            raise Unauthorized(
                f"Token authorization failed: not a valid {kind} key", headers=_CHALLENGE
            )
        if key.expires_at is not None and self.clock() >= key.expires_at:
            raise Unauthorized(
                f"Token authorization failed: the {kind} key expired; rotate it with "
                f"GET /token?type={kind} on the management port",
                headers=_CHALLENGE,
            )

    def authorize(self, scope: Scope, kind: str) -> None:
        """The ASGI hook: check the request's Authorization header for ``kind``'s key."""
        self.check(header(scope, b"authorization"), kind)  # type: ignore[arg-type]

    def rotate(self, kind: str) -> dict[str, Any]:
        """Replace the management or inference key (new expiry too); rewrite the key file. A
        key file that cannot be written is a 503 and the old key stays (no key is lost)."""
        if kind not in ROTATABLE:
            raise BadRequest(f"type must be one of {', '.join(ROTATABLE)}, got {kind!r}")
        if self.provided:
            raise BadRequest("the keys come from token_keys_file: rotate them there")
        old = self.keys[kind]
        self.keys[kind] = _Key(new_key(), self.clock() + self.expiration_s)
        try:
            self.write_key_file()
        except OSError as exc:  # a full disk, a folder gone: the old key stays, as written
            self.keys[kind] = old
            log.error("cannot write the key file %s: %s", self.key_file, exc)
            raise ServiceUnavailable(
                f"the {kind} key was not rotated: the key file cannot be written "
                f"({exc.strerror or type(exc).__name__})"
            ) from None
        log.info("rotated the %s key", kind)
        return {kind: self.keys[kind].to_json()}


def _read_provided_keys(path: Path) -> dict[str, _Key]:
    """The three keys of an operator's keys file; raises ConfigError naming what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
        keys = {kind: str(data[kind]["key"]) for kind in ("management", "inference", "API")}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"token_keys_file {path}: cannot read the management, inference and API keys "
            f"({type(exc).__name__})"
        ) from None
    if any(len(key) < 16 for key in keys.values()):
        raise ConfigError(f"token_keys_file {path}: every key needs at least 16 characters")
    return {kind: _Key(key, None) for kind, key in keys.items()}


def read_key(key_file: Path, kind: KeyKind = "management") -> str:
    """The ``kind`` key from a key file (for clients). Raises OSError, KeyError, ValueError."""
    data = json.loads(Path(key_file).read_text())
    return str(data[kind]["key"])
