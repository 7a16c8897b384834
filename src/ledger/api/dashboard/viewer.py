"""Who is looking at a page, and the forms they post (with their CSRF checks)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs

from fastapi import Request

from ledger.api import cookies
from ledger.api.auth import Principal, TokenTable, admit, check_token
from ledger.db.kernel import Kernel
from ledger.db.reads import Reads
from ledger.errors import Forbidden, InvalidInput


class SignInRequired(Exception):
    """The request carries no valid token or sign-in."""


@dataclass(frozen=True)
class Viewer:
    """The signed-in caller: principal, browser sign-in (if by cookie), kernel."""

    principal: Principal
    session: cookies.BrowserSession | None
    kernel: Kernel

    @property
    def reads(self) -> Reads:
        """What the pages show, read as the viewer's role."""
        return Reads(self.kernel.executor)

    @property
    def can_act(self) -> bool:
        """Whether to offer operator actions (the database decides in the end)."""
        return self.principal.role == "operator"

    @property
    def csrf(self) -> str:
        """The CSRF token forms carry (empty for a bearer caller: nothing to forge)."""
        return self.session.csrf if self.session else ""


async def _authenticate(request: Request) -> tuple[Principal, cookies.BrowserSession | None]:
    api = request.app.state.ledger
    tokens: TokenTable = api.tokens
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        principal = check_token(request, header[7:].strip())  # 429 if wrong and throttled
        if principal is None:
            raise SignInRequired()
        return principal, None
    if not cookies.has_session_cookie(request):
        raise SignInRequired()
    session = await cookies.session_of(request, await api.pools.kernel("operator"))
    principal = tokens.session_principal(session) if session else None
    if principal is None:
        raise SignInRequired()
    return principal, session


async def viewer_of(request: Request) -> Viewer:
    """The caller of a page; ``SignInRequired`` if none."""
    principal, session = await _authenticate(request)
    admit(request, principal)  # the token's own request limit
    kernel = await request.app.state.ledger.pools.kernel(principal.role)
    return Viewer(principal, session, kernel)


@dataclass(frozen=True)
class Form:
    """A posted form: the last value of each field, and every value of one."""

    fields: dict[str, list[str]]

    def get(self, name: str, default: str | None = None) -> str | None:
        """The field's (last) value."""
        values = self.fields.get(name)
        return values[-1] if values else default

    def get_all(self, name: str) -> list[str]:
        """Every value of a repeated field."""
        return self.fields.get(name, [])


def same_origin(request: Request) -> None:
    """``Forbidden`` if the browser says the form comes from another origin."""
    origin = request.headers.get("origin")
    if origin and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise Forbidden("the form was posted from another origin")


async def read_form(request: Request, viewer: Viewer | None) -> Form:
    """A POSTed form, after the CSRF checks; ``Forbidden`` if they fail."""
    same_origin(request)
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise InvalidInput("expected a form (application/x-www-form-urlencoded)")
    body = (await request.body()).decode("utf-8", errors="replace")
    form = Form(parse_qs(body, keep_blank_values=True))
    if viewer is not None and viewer.session is not None \
            and not viewer.session.csrf_matches(form.get(cookies.CSRF_FIELD)):
        raise Forbidden("the form's CSRF token does not match this sign-in; reload the page")
    return form


def local_path(target: str | None, default: str = "/ui/") -> str:
    """``target`` if it is a path of this dashboard (never another site)."""
    if target and target.startswith("/ui") and not target.startswith("//") \
            and "\\" not in target and "\n" not in target and "\r" not in target:
        return target
    return default
