"""Browser sign-in: a signed session cookie that the API's authentication also accepts.

A browser cannot send ``Authorization: Bearer`` by itself (an ``EventSource``
cannot send headers at all), so the dashboard's sign-in form takes a token
and keeps it in the session. The session is Starlette's ``SessionMiddleware``
(a cookie signed with itsdangerous, so nobody can edit what it holds):
``HttpOnly`` (no script can read it), ``SameSite=Strict`` (no other site's
page makes the browser send it), ``Secure`` when the server is configured so.
It holds the token -- checked against ``TokenTable`` on every request exactly
as a bearer token is, so any server process can serve any browser and
revoking a token from ``LEDGER_API_TOKENS`` signs its browsers out -- and a
random CSRF token made at sign-in.

State-changing requests authenticated by the session must also carry that
CSRF token (a form field on the dashboard, the ``X-CSRF-Token`` header on the
API): the synchronizer-token pattern, which a signed session makes a few
lines. A CSRF middleware (asgi-csrf, starlette-csrf) was not used: they are
double-submit-cookie schemes that read every form body of the whole app and
would have to be taught to exempt bearer-token API calls, which need no CSRF
protection at all. ``SameSite=Strict`` alone would leave other ports of the
same host (the same "site") able to post.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.requests import HTTPConnection

COOKIE = "ledger_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf"
#: A browser signs in again after this long.
MAX_AGE_S = 12 * 3600
#: Methods that change nothing: no CSRF token needed.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class BrowserSession:
    """One sign-in: the token it was made with and its CSRF token."""

    token: str
    csrf: str

    def csrf_matches(self, given: str | None) -> bool:
        """Whether ``given`` is this sign-in's CSRF token (in constant time)."""
        return given is not None and hmac.compare_digest(self.csrf, given.strip())


def sign_in(connection: HTTPConnection, token: str) -> BrowserSession:
    """Start a sign-in with ``token`` (a fresh session, a fresh CSRF token)."""
    connection.session.clear()
    connection.session.update(token=token, csrf=secrets.token_hex(32))
    return BrowserSession(token, connection.session["csrf"])


def sign_out(connection: HTTPConnection) -> None:
    """End the sign-in (the middleware then expires the cookie)."""
    connection.session.clear()


def session_of(connection: HTTPConnection) -> BrowserSession | None:
    """The sign-in the request's session carries, if any (not yet checked
    against the configured tokens)."""
    if "session" not in connection.scope:
        return None
    token, csrf = connection.session.get("token"), connection.session.get("csrf")
    if not isinstance(token, str) or not isinstance(csrf, str) or not token or not csrf:
        return None
    return BrowserSession(token, csrf)


def session_secret(configured: str | None, token_digests: Iterable[str]) -> str:
    """The key that signs sessions: the configured one, else one derived from
    the configured tokens' digests -- the same in every server process with the
    same configuration, and a new one (signing every browser out) when the
    tokens change."""
    if configured:
        return configured
    material = "\n".join(sorted(token_digests)).encode()
    return hashlib.sha256(b"ledger-session-key\n" + material).hexdigest()
