"""Bearer tokens mapped to database roles.

A token names one of three roles -- ``reader``, ``operator``, ``sensor`` -- and
that is all the HTTP layer decides: every request then runs its database work
as that role (``ledger.api.pools``), so PostgreSQL, not Python, says what the
role may do. A reader asking to abandon is refused by the database (403).

Only a SHA-256 digest of each token is configured, never the token itself:
``LEDGER_API_TOKENS="ops:operator:<sha256 hex>,dash:reader:<sha256 hex>"``.
``ledger token create ROLE`` makes a token and prints its entry.

A browser signed in on the dashboard sends a session cookie instead
(``ledger.api.cookies``: it names a session the database keeps, never the
token); a state-changing request authenticated that way must also carry the
session's CSRF token in ``X-CSRF-Token``.

A credential is checked before any throttle: a valid one is served whatever
others sent from its address (then counted against its token's own request
limit); only a wrong one counts against, and is refused by, the failure
throttle of its address and prefix (``ledger.api.throttle``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ledger.api import cookies
from ledger.api.problems import Unauthenticated
from ledger.errors import ConfigError, Forbidden

#: The roles a token may carry (the runtimes' roles have no HTTP surface).
ROLES = ("reader", "operator", "sensor")
TOKEN_PREFIX = "ldg_"
#: What a token name may be (it is recorded as http:<name> in the journal).
TOKEN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def hash_token(token: str) -> str:
    """The SHA-256 hex digest that configuration stores for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name and the role it acts as."""

    name: str
    role: str

    @property
    def identity(self) -> str:
        """How this caller is recorded in the journal."""
        return f"http:{self.name}"


@dataclass(frozen=True)
class TokenEntry:
    """One configured token: its name, role and digest."""

    name: str
    role: str
    digest: str

    def entry(self) -> str:
        """The configuration text of this token."""
        return f"{self.name}:{self.role}:{self.digest}"


class TokenTable:
    """The configured tokens, looked up by digest."""

    def __init__(self, entries: Iterable[TokenEntry] = ()):
        self.entries = tuple(entries)
        names = [e.name for e in self.entries]
        if len(set(names)) != len(names):
            raise ConfigError("LEDGER_API_TOKENS names a token twice")

    @classmethod
    def parse(cls, text: str | None) -> TokenTable:
        """Parse ``name:role:sha256hex`` entries separated by commas or whitespace."""
        entries = []
        for raw in re.split(r"[,\s]+", text or ""):
            if not raw:
                continue
            parts = raw.split(":")
            if len(parts) != 3:
                raise ConfigError(f"API token entry {raw[:20]!r}... is not name:role:sha256hex")
            name, role, digest = parts[0], parts[1], parts[2].lower()
            if not TOKEN_NAME.match(name):
                raise ConfigError(f"API token name {name!r} is not 1-64 of [A-Za-z0-9_.@-]")
            if role not in ROLES:
                raise ConfigError(f"API token {name!r}: role {role!r} is not one of {', '.join(ROLES)}")
            if not _DIGEST.match(digest):
                raise ConfigError(f"API token {name!r}: the digest must be 64 hex digits "
                                  "(a SHA-256 of the token, not the token)")
            entries.append(TokenEntry(name, role, digest))
        return cls(entries)

    def entry_of(self, token: str) -> TokenEntry | None:
        """The configured entry of ``token``, or ``None``."""
        digest = hash_token(token)
        found: TokenEntry | None = None
        for entry in self.entries:
            # Every entry is compared, in constant time, whatever matched.
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        return found

    def authenticate(self, token: str) -> Principal | None:
        """The principal of ``token``, or ``None`` if it is not configured."""
        found = self.entry_of(token)
        return Principal(found.name, found.role) if found else None

    def session_principal(self, session: cookies.BrowserSession) -> Principal | None:
        """The principal of a browser session, while the very token that made it
        is configured (same name, role and digest): a rotated token's sessions end."""
        for entry in self.entries:
            if (entry.name == session.token_name and entry.role == session.token_role
                    and hmac.compare_digest(entry.digest, session.token_digest)):
                return Principal(entry.name, entry.role)
        return None

    def __len__(self) -> int:
        return len(self.entries)


bearer = HTTPBearer(auto_error=False, description="A token from `ledger token create ROLE`")


def client_of(request: Request) -> str:
    """The client's address: the peer's, or the client a trusted proxy names
    (``forwarded_allow_ips``: uvicorn's proxy-headers middleware has already
    put it in the request's scope)."""
    return request.client.host if request.client else "unknown"


def check_token(request: Request, token: str) -> Principal | None:
    """The principal of a presented ``token`` (compared in constant time with
    every configured one, before any throttle); ``None`` if it is not
    configured, counted as a failure of this address and prefix --
    ``TooManyRequests`` instead while they failed too often."""
    api = request.app.state.ledger
    principal: Principal | None = api.tokens.authenticate(token)
    if principal is None:
        api.throttle.failed(client_of(request), token)
    return principal


def admit(request: Request, principal: Principal) -> Principal:
    """``principal``, counted against its token's request limit
    (``TooManyRequests`` over it); recorded for the request log."""
    request.app.state.ledger.throttle.admit(principal.name)
    request.state.principal = principal  # for the request log
    return principal


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The request's principal; ``Unauthenticated`` (401) without a valid token
    (a bearer token, or a dashboard sign-in's cookie); ``TooManyRequests``
    (429) for a wrong token while its address or prefix has failed too often,
    and for a valid one over its token's request limit."""
    api = request.app.state.ledger
    tokens: TokenTable = api.tokens
    if credentials is not None:
        principal = check_token(request, credentials.credentials)
        if principal is None:
            raise Unauthenticated("the bearer token is not valid")
    else:
        if not cookies.has_session_cookie(request):
            raise Unauthenticated("a bearer token is required (Authorization: Bearer <token>)")
        # Not a failure to throttle when it is stale: the cookie is signed, so
        # nobody makes one up; a browser whose session ended just signs in again.
        session = await cookies.session_of(request, await api.pools.kernel("operator"))
        principal = tokens.session_principal(session) if session else None
        if session is None or principal is None:
            raise Unauthenticated("the session cookie is not valid; sign in again")
        # The browser sends the cookie by itself: a change must prove it comes
        # from a page of ours, which alone knows the session's CSRF token.
        if (request.method not in cookies.SAFE_METHODS
                and not session.csrf_matches(request.headers.get(cookies.CSRF_HEADER))):
            raise Forbidden(f"a change authenticated by the session cookie needs the "
                            f"session's {cookies.CSRF_HEADER} header")
    return admit(request, principal)
