"""The operator's dashboard: server-rendered pages under ``/ui`` of ``ledger serve``.

The design at length: docs/internals.md (``ledger.api.dashboard``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ledger.api.dashboard import approvals, board, bulk, campaign, classes, limits, signin, workers
from ledger.api.dashboard.board import board_changes, sensor_rows
from ledger.api.dashboard.render import HERE, Pages, describe, duration, pages_of
from ledger.api.dashboard.viewer import SignInRequired
from ledger.api.problems import TooManyRequests
from ledger.config import LedgerConfig
from ledger.errors import LedgerError

if TYPE_CHECKING:
    from ledger.api.state import ApiState

__all__ = ["board_changes", "create_dashboard", "describe", "duration", "sensor_rows"]


async def _on_sign_in(request: Request, exc: Exception) -> Response:
    if request.url.path.endswith("/events"):
        return Response("sign in first", status_code=401, media_type="text/plain")
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse("/ui/login?" + urlencode({"next": target}), status_code=303)


async def _on_ledger_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LedgerError)
    page = pages_of(request).page(request, "error.html", status=exc.http_status,
                                  title=exc.slug, message=exc.message)
    if isinstance(exc, TooManyRequests):
        page.headers["Retry-After"] = str(exc.retry_after_s)
    return page


async def _on_invalid(request: Request, exc: Exception) -> Response:
    return pages_of(request).page(request, "error.html", status=422, title="invalid-input",
                                  message="the address or form is not valid here")


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return pages_of(request).page(request, "error.html", status=exc.status_code,
                                  title=f"http-{exc.status_code}", message=str(exc.detail))


def create_dashboard(state: ApiState, config: LedgerConfig | None = None) -> FastAPI:
    """The dashboard application, to mount at ``/ui`` of the API."""
    ui = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    ui.state.ledger = state
    ui.state.pages = Pages(state, config)
    ui.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    ui.add_exception_handler(SignInRequired, _on_sign_in)
    ui.add_exception_handler(LedgerError, _on_ledger_error)
    ui.add_exception_handler(RequestValidationError, _on_invalid)
    ui.add_exception_handler(StarletteHTTPException, _on_http)
    for module in (signin, board, campaign, approvals, bulk, classes, workers, limits):
        ui.include_router(module.router)
    return ui
