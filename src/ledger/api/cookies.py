"""Browser sign-in: a session cookie that the API's authentication also accepts.

A browser cannot send ``Authorization: Bearer`` by itself (an ``EventSource``
cannot send headers at all), so the dashboard's sign-in form takes a token and
puts it in a cookie -- ``HttpOnly`` (no script can read it), ``SameSite=Strict``
(no other site's page makes the browser send it), ``Secure`` over HTTPS. The
cookie is ``<nonce>.<token>``: the token is what ``TokenTable`` checks, exactly
as for a bearer token, so any server process can serve any browser and
revoking a token from ``LEDGER_API_TOKENS`` signs its browsers out.

State-changing requests authenticated by the cookie must also carry the
session's CSRF token (a form field on the dashboard, the ``X-CSRF-Token``
header on the API): an HMAC of the nonce keyed by the token, so it differs per
sign-in, needs no server-side storage, and cannot be computed without the
token. ``SameSite=Strict`` alone would leave other ports of the same host
(the same "site") able to post.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from starlette.requests import HTTPConnection
from starlette.responses import Response

COOKIE = "ledger_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"
#: A browser signs in again after this long.
MAX_AGE_S = 12 * 3600
#: Methods that change nothing: no CSRF token needed.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class BrowserSession:
    """One sign-in: a random nonce and the token it was made with."""

    nonce: str
    token: str

    @classmethod
    def new(cls, token: str) -> BrowserSession:
        """A fresh sign-in with ``token``."""
        return cls(secrets.token_urlsafe(16), token)

    @property
    def value(self) -> str:
        """The cookie's value."""
        return f"{self.nonce}.{self.token}"

    @property
    def csrf(self) -> str:
        """The CSRF token of this sign-in."""
        return hmac.new(self.token.encode(), b"ledger-csrf:" + self.nonce.encode(),
                        hashlib.sha256).hexdigest()

    def csrf_matches(self, given: str | None) -> bool:
        """Whether ``given`` is this sign-in's CSRF token (in constant time)."""
        return given is not None and hmac.compare_digest(self.csrf, given.strip())


def session_of(connection: HTTPConnection) -> BrowserSession | None:
    """The sign-in the request's cookie carries, if any (not yet checked against
    the configured tokens)."""
    value = connection.cookies.get(COOKIE)
    if not value or "." not in value or len(value) > 512:
        return None
    nonce, token = value.split(".", 1)
    return BrowserSession(nonce, token) if nonce and token else None


def set_session(response: Response, session: BrowserSession, *, secure: bool) -> None:
    """Sign the browser in (see the module docstring for the attributes)."""
    response.set_cookie(COOKIE, session.value, max_age=MAX_AGE_S, path="/", httponly=True,
                        samesite="strict", secure=secure)


def clear_session(response: Response) -> None:
    """Sign the browser out."""
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
