"""Bearer-token authentication and per-model authorization, shared by every front (REST now, gRPC later).

Tokens live in a file (``auth.tokens_file``), one per line::

    # comment lines and blank lines are ignored
    s3cr3t-token-for-everything
    another-token  ranker,ranker_v2      # only these models (comma separated, no spaces inside the list)
    ops-token      *                     # every model, same as no list

A front calls :meth:`Authenticator.check` with the raw ``Authorization`` value (REST header or gRPC metadata
``authorization``) and the client-facing model name (``None`` for calls not aimed at one model). It returns ``None``
or raises :class:`Unauthenticated` (401: missing, malformed or unknown token) / :class:`PermissionDenied` (403: a
valid token not scoped to that model). Tokens are compared with :func:`hmac.compare_digest` against every entry (no
early exit), never logged, and never quoted in error messages.

The file is re-read when its modification time or size changes (checked at most every ``reload_interval_s``); a file
that cannot be read or parsed, or that holds no token (refused at start too), keeps the previous tokens and logs a
warning (without the file's contents). A request carrying more than one ``Authorization`` value (two REST headers,
two gRPC ``authorization`` metadata entries) is refused with 401 / UNAUTHENTICATED: no front picks one of them.
Task safety: one event loop; the reload is a short synchronous read.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gateway.errors import PermissionDenied, Unauthenticated, clip
from schemas.gateway_settings import GatewaySettings, is_loopback

__all__ = ["Authenticator", "TokenEntry", "exposure_problem", "parse_tokens"]

log = logging.getLogger("embedgate.gateway")

_ALL: Final = "*"
_SCHEME: Final = "bearer"


@dataclass(frozen=True)
class TokenEntry:
    """One line of the tokens file; ``models`` is None for a token valid on every model."""

    token: bytes
    models: frozenset[str] | None


def parse_tokens(text: str, source: str = "tokens file") -> list[TokenEntry]:
    """Entries of a tokens file; ``ValueError`` names the line (never the token) when a line is malformed."""
    out: list[TokenEntry] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(
                f"{source} line {n}: expected `<token> [model,model...]`, got {len(parts)} fields"
            )
        token = parts[0]
        if not token.isascii() or not token.isprintable():
            raise ValueError(f"{source} line {n}: a token must be printable ASCII")
        models: frozenset[str] | None = None
        if len(parts) == 2 and parts[1] != _ALL:
            names = [m for m in parts[1].split(",") if m]
            if not names:
                raise ValueError(f"{source} line {n}: empty model list")
            models = frozenset(names)
        out.append(TokenEntry(token.encode("ascii"), models))
    return out


class Authenticator:
    """Checks ``Authorization: Bearer <token>`` against the tokens file; see the module docstring."""

    def __init__(self, path: Path, *, reload_interval_s: float = 1.0) -> None:
        self.path = path
        self._interval = reload_interval_s
        self._entries: list[TokenEntry] = []
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self.generation = 0  # how many times tokens were loaded (a front holding a copy compares it)
        self._load(initial=True)

    def _load(self, *, initial: bool = False) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            entries = parse_tokens(self.path.read_text(encoding="utf-8"), str(self.path))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            if initial:
                raise ValueError(f"auth.tokens_file: cannot use {self.path}: {exc}") from None
            log.warning("tokens file not reloaded; keeping the previous tokens", extra={"reason": str(exc)})
            return
        if not entries:
            if initial:
                raise ValueError(f"auth.tokens_file: {self.path} has no tokens")
            # an empty file is refused at start, and so at reload (a file being rewritten can look empty)
            log.warning(
                "tokens file not reloaded; keeping the previous tokens", extra={"reason": "no tokens"}
            )
            self._stamp = stamp
            return
        self._entries = entries
        self._stamp = stamp
        self.generation += 1
        if not initial:
            log.info("tokens file reloaded", extra={"tokens": len(entries)})

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked >= self._interval:
            self._checked = now
            self._load()

    def tokens(self) -> list[bytes]:
        """Every token now valid, whatever its models (re-reading the file when due): what the native gRPC gate
        checks before it receives a message (``gateway.grpc_front.server``)."""
        self._maybe_reload()
        return [e.token for e in self._entries]

    def scope(self, authorization: str | Sequence[str] | None) -> frozenset[str] | None:
        """The models the token in ``authorization`` may use (None: every model); raises 401 errors when there is
        no valid token. ``authorization`` is the header's value, or every value the request carried (REST headers,
        gRPC metadata entries): more than one is refused (401), whatever they hold."""
        self._maybe_reload()
        authorization = _single(authorization)
        if not authorization:
            raise Unauthenticated("Missing bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != _SCHEME or not token:
            raise Unauthenticated("Malformed Authorization header: expected 'Bearer <token>'")
        given = token.encode("utf-8", "surrogateescape")
        match: TokenEntry | None = None
        for entry in self._entries:  # every entry is compared: the time does not depend on which one matches
            if hmac.compare_digest(entry.token, given) and match is None:
                match = entry
        if match is None:
            raise Unauthenticated("Invalid bearer token")
        return match.models

    def check(self, authorization: str | Sequence[str] | None, model: str | None) -> None:
        """``None`` when ``authorization`` carries a token valid for ``model``; raises 401/403 errors otherwise
        (see :meth:`scope` for several values)."""
        models = self.scope(authorization)
        if model is not None and models is not None and model not in models:
            raise PermissionDenied(f"Token is not allowed to use model {clip(model)}")


def _single(authorization: str | Sequence[str] | None) -> str | None:
    """The one Authorization value (None when absent); 401 when the request carried several."""
    if authorization is None or isinstance(authorization, str):
        return authorization
    if len(authorization) > 1:
        raise Unauthenticated(
            f"Malformed Authorization header: {len(authorization)} Authorization values, expected one"
        )
    return authorization[0] if authorization else None


def exposure_problem(settings: GatewaySettings) -> str | None:
    """Why ``settings`` must not start (no tokens on a non-loopback address), or None."""
    if settings.auth.tokens_file is not None or settings.auth.allow_unauthenticated:
        return None
    if is_loopback(settings.host):
        return None
    return (
        f"host {settings.host} is reachable from other machines but auth.tokens_file is not set; set "
        "auth.tokens_file (EMBEDGATE_AUTH__TOKENS_FILE) or, only behind an authenticating proxy, "
        "auth.allow_unauthenticated: true"
    )
