"""Signing in with a token (kept in the signed session) and signing out."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ...logs import get_logger
from .. import cookies
from .render import pages_of, redirect
from .viewer import local_path, read_form, viewer_of

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
    """Sign in with a configured token."""
    state = request.app.state.ledger
    form = await read_form(request, None)
    token, target = (form.get("token") or "").strip(), local_path(form.get("next"))
    principal = state.tokens.authenticate(token) if token else None
    if principal is None:
        return pages_of(request).page(request, "login.html", status=401, next=target,
                                      error="That token is not configured on this server.",
                                      configured=len(state.tokens) > 0)
    cookies.sign_in(request, token)
    log.info("signed in", caller=principal.identity, role=principal.role)
    return redirect(request, target)


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Sign out."""
    viewer = await viewer_of(request)
    await read_form(request, viewer)
    cookies.sign_out(request)
    return redirect(request, "/ui/login")
