"""Browser sign-in: a session kept in the database, named by a cookie.

The design at length: docs/internals.md (``ledger.api.cookies``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from ledger.db.kernel import Kernel

COOKIE = "ledger_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"
#: A browser signs in again after this long.
MAX_AGE_S = 12 * 3600
#: Methods that change nothing: no CSRF token needed.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SID = "sid"


@dataclass(frozen=True)
class BrowserSession:
    """One sign-in: its id's digest, the token entry it was made with, its CSRF token."""

    id_digest: str
    token_name: str
    token_role: str
    token_digest: str
    csrf: str

    def csrf_matches(self, given: str | None) -> bool:
        """Whether ``given`` is this sign-in's CSRF token (in constant time)."""
        return given is not None and hmac.compare_digest(self.csrf, given.strip())


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Credential(Protocol):
    """What a session is started for: a configured token (``auth.TokenEntry``)."""

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def digest(self) -> str: ...


async def sign_in(connection: HTTPConnection, entry: Credential, sessions: Kernel,
                  ttl_s: float = MAX_AGE_S) -> BrowserSession:
    """Start a sign-in with the token of ``entry``: a new session (recorded
    through ``sessions``, the operator role's kernel), a fresh CSRF token."""
    session_id, csrf = secrets.token_urlsafe(32), secrets.token_hex(32)
    digest = _digest(session_id)
    await sessions.start_web_session(digest, entry.name, entry.role, entry.digest, csrf, ttl_s)
    connection.session.clear()
    connection.session[_SID] = session_id
    return BrowserSession(digest, entry.name, entry.role, entry.digest, csrf)


async def sign_out(connection: HTTPConnection, sessions: Kernel, everywhere: bool = False) -> int:
    """End the sign-in (every copy of its cookie; with ``everywhere``, every
    session of its token); the middleware then expires the cookie."""
    session_id = _session_id(connection)
    connection.session.clear()
    if session_id is None:
        return 0
    return await sessions.end_web_sessions(_digest(session_id), everywhere)


def _session_id(connection: HTTPConnection) -> str | None:
    if "session" not in connection.scope:
        return None
    value = connection.session.get(_SID)
    return value if isinstance(value, str) and 20 <= len(value) <= 100 else None


def has_session_cookie(connection: HTTPConnection) -> bool:
    """Whether the request names a session at all (checked or not)."""
    return _session_id(connection) is not None


async def session_of(connection: HTTPConnection, sessions: Kernel) -> BrowserSession | None:
    """The live sign-in the request's cookie names, if any (not yet checked
    against the configured tokens)."""
    session_id = _session_id(connection)
    if session_id is None:
        return None
    digest = _digest(session_id)
    row = await sessions.web_session(digest)
    if row is None:
        return None
    return BrowserSession(digest, row["token_name"], row["token_role"], row["token_digest"],
                          row["csrf"])


def session_secret(configured: str | None, token_digests: Iterable[str]) -> str:
    """The key that signs the cookie: the configured one, else one derived from
    the configured tokens' digests (the same in every server process with the
    same configuration). The cookie only names a session the database keeps,
    by an id nobody can guess, so the key guards the cookie's integrity, not
    the sign-in."""
    if configured:
        return configured
    material = "\n".join(sorted(token_digests)).encode()
    return hashlib.sha256(b"ledger-session-key\n" + material).hexdigest()


class SecureOverHttps:
    """Mark the session cookie ``Secure`` on responses to HTTPS requests (the
    session middleware does so always when configured, never otherwise)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def send_secure(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = []
                for name, value in message.get("headers", []):
                    if name == b"set-cookie" and value.startswith(COOKIE.encode() + b"=") \
                            and b"secure" not in value.lower():
                        value += b"; secure"
                    headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_secure)
