"""Signing in with a token (a session the database keeps), signing out, and the
theme a browser keeps (a cookie: no sign-in needed to choose a colour)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ledger.api import cookies
from ledger.api.auth import client_of
from ledger.api.dashboard.render import THEME_COOKIE, THEMES, pages_of, redirect
from ledger.api.dashboard.viewer import local_path, read_form, viewer_of
from ledger.api.problems import TooManyRequests
from ledger.logs import get_logger

router = APIRouter()
log = get_logger("dashboard")


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> Response:
    """The sign-in form."""
    state = request.app.state.ledger
    return pages_of(request).page(request, "login.html",
                                  next=local_path(request.query_params.get("next")),
                                  error=None, configured=len(state.tokens) > 0)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Sign in with a configured token. The token is checked first: a valid
    one signs in whatever others sent from this address (counted against its
    own request limit); a wrong one is answered 429 while this address or
    the token's prefix has failed too often."""
    state = request.app.state.ledger
    form = await read_form(request, None)
    token, target = (form.get("token") or "").strip(), local_path(form.get("next"))
    entry = state.tokens.entry_of(token)
    if entry is None:
        error, status, wait = "That token is not configured on this server.", 401, None
        try:
            state.throttle.failed(client_of(request), token)
        except TooManyRequests as exc:
            # The form again, not an error page: a valid token still signs in.
            status, wait = 429, exc.retry_after_s
            error += (f" Too many wrong tokens came from here: the next is checked in {wait} s"
                      " (a configured token signs in at once).")
        page = pages_of(request).page(request, "login.html", status=status, next=target,
                                      error=error, configured=len(state.tokens) > 0)
        if wait is not None:
            page.headers["Retry-After"] = str(wait)
        return page
    state.throttle.admit(entry.name)
    await cookies.sign_in(request, entry, await state.pools.kernel("operator"),
                          state.options.session_ttl_s)
    log.info("signed in", caller=f"http:{entry.name}", role=entry.role)
    return redirect(request, target)


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Sign out: this session ends for every copy of its cookie; with
    ``everywhere`` set, every session of the same token ends too."""
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    ended = await cookies.sign_out(request, await request.app.state.ledger.pools.kernel("operator"),
                                   everywhere=bool(form.get("everywhere")))
    log.info("signed out", caller=viewer.principal.identity, sessions=ended)
    return redirect(request, "/ui/login")


@router.post("/theme")
async def theme(request: Request) -> Response:
    """Keep a theme (light, dark, or auto: the browser's preference) in a
    cookie, and go back. ``dashboard.js`` does the same without a reload;
    this is the form's way for a browser without it."""
    form = await read_form(request, None)  # a preference: same origin is all it needs
    chosen = form.get("theme") or "auto"
    response = redirect(request, local_path(form.get("next")))
    if chosen in THEMES:
        response.set_cookie(THEME_COOKIE, chosen, max_age=365 * 86400, path="/ui",
                            samesite="lax", secure=request.url.scheme == "https")
    else:
        response.delete_cookie(THEME_COOKIE, path="/ui")
    return response
