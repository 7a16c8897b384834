"""Every error the HTTP API answers is ``application/problem+json`` (RFC 9457).

``type`` is stable per error class: Ledger's own errors use
``LedgerError.problem_type`` (``/problems/stale-lease`` ...), so the CLI's exit
code and the API's problem type name the same thing. What the framework
refuses before a route runs (validation, unknown routes, wrong methods, bodies
too large) gets a type of its own here. Nothing that a client sends can turn
into a 500: an unexpected exception is logged and answered with an opaque
``internal-error`` problem.

Every ``type`` resolves: ``GET /problems/{slug}`` is a page that says what the
error means, its HTTP status and the CLI's exit code for it (``/problems``
lists them all), so a client that follows a type URI learns something.
"""

from __future__ import annotations

import html
import inspect
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ledger.errors import InvalidInput, LedgerError, NotFound
from ledger.logs import get_logger

PROBLEM_MEDIA_TYPE = "application/problem+json"
log = get_logger("api")

#: Problem slugs of refusals that are not LedgerErrors, by HTTP status.
_HTTP_SLUGS = {
    400: "bad-request", 401: "unauthenticated", 403: "forbidden", 404: "not-found",
    405: "method-not-allowed", 406: "not-acceptable", 413: "payload-too-large",
    415: "unsupported-media-type", 422: "invalid-input", 429: "too-many-requests",
}


class Problem(BaseModel):
    """An RFC 9457 problem: ``type`` identifies the kind of error, for good."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="Stable URI reference naming the error class")
    title: str = Field(description="Short summary of the error class")
    status: int = Field(description="The HTTP status code")
    detail: str | None = Field(default=None, description="What went wrong this time")
    instance: str | None = Field(default=None, description="The request path")


class Unauthenticated(LedgerError):
    """No bearer token, or one that is not configured."""

    slug = "unauthenticated"
    http_status = 401
    exit_code = 77  # EX_NOPERM


class PayloadTooLarge(LedgerError):
    """The request body is larger than the server accepts."""

    slug = "payload-too-large"
    http_status = 413
    exit_code = 2


class TooManyRequests(LedgerError):
    """A limit of ``ledger.api.throttle`` was reached: too many failed
    authentications from this address or with this credential's prefix (a
    wrong credential is refused, a valid one still served), or too many
    requests by this token. The problem's ``limit`` names which; wait for
    ``Retry-After`` seconds."""

    slug = "too-many-requests"
    http_status = 429
    exit_code = 75  # EX_TEMPFAIL

    def __init__(self, message: str, *, retry_after_s: int = 60, limit: str | None = None):
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)
        #: which limit it was (``ledger.api.throttle``: ADDRESS_LIMIT ...)
        self.limit = limit


class CursorBeyondEnd(InvalidInput):
    """A stream was asked to resume after a seq its journal has not reached."""

    slug = "cursor-beyond-end"


def title_of(slug: str) -> str:
    """A readable title from a slug: ``stale-lease`` -> ``Stale lease``."""
    return slug.replace("-", " ").capitalize()


def problem_response(
    status: int,
    slug: str,
    detail: str | None,
    request: Request | None = None,
    *,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    """A problem+json response."""
    body = Problem(type=f"/problems/{slug}", title=title_of(slug), status=status, detail=detail,
                   instance=request.url.path if request is not None else None, **extensions)
    return JSONResponse(jsonable_encoder(body.model_dump(exclude_none=True)), status_code=status,
                        media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def problem_for(exc: LedgerError, request: Request | None = None) -> JSONResponse:
    """The problem response of one of Ledger's errors."""
    headers = {"WWW-Authenticate": 'Bearer realm="ledger"'} if exc.http_status == 401 else None
    extensions: dict[str, Any] = {}
    if isinstance(exc, TooManyRequests):
        headers = {"Retry-After": str(exc.retry_after_s)}
        extensions = {"limit": exc.limit, "retry_after_s": exc.retry_after_s}
    detail = exc.message if not exc.detail else f"{exc.message} ({exc.detail})"
    return problem_response(exc.http_status, exc.slug, detail, request, headers=headers,
                            **extensions)


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    # loc/msg/type only: "input" may echo a large or sensitive body back.
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")),
             "type": str(e.get("type", ""))} for e in exc.errors()]


async def _on_ledger_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, LedgerError)
    if exc.http_status >= 500:
        log.warning("request failed", path=request.url.path, error=exc.slug, detail=exc.message)
    return problem_for(exc, request)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = _validation_errors(exc)
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(str(part) for part in first["loc"])
    return problem_response(422, InvalidInput.slug, f"{where}: {first['msg']}" if where
                            else str(first["msg"]), request, errors=errors)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    slug = _HTTP_SLUGS.get(exc.status_code, f"http-{exc.status_code}")
    detail = exc.detail if isinstance(exc.detail, str) else None
    return problem_response(exc.status_code, slug, detail, request,
                            headers=dict(exc.headers) if exc.headers else None)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", path=request.url.path, error=type(exc).__name__)
    return problem_response(500, "internal-error", "the server failed; see its log", request)


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` with problem+json."""
    app.add_exception_handler(LedgerError, _on_ledger_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of the problems a route may answer."""
    schema = Problem.model_json_schema()
    return {status: {"description": title_of(_HTTP_SLUGS.get(status, "error")),
                     "content": {PROBLEM_MEDIA_TYPE: {"schema": schema}}}
            for status in statuses}


# --- a page per problem type ---------------------------------------------------------

router = APIRouter(tags=["problems"])

#: What the framework's own refusals mean (they are not LedgerErrors).
_HTTP_MEANINGS = {
    "bad-request": "The request could not be read.",
    "method-not-allowed": "The path exists, but not with this method.",
    "not-acceptable": "The server cannot answer in a format the client accepts.",
    "unsupported-media-type": "The body is not in a format this route takes.",
    "internal-error": "The server failed on its own account; its log says why. Nothing the "
                      "client sent causes this.",
}


@dataclass(frozen=True)
class ProblemType:
    """What one problem ``type`` means."""

    slug: str
    status: int
    meaning: str
    exit_code: int | None  # the CLI's, for the same error


def _error_classes() -> list[type[LedgerError]]:
    found: list[type[LedgerError]] = []
    pending: list[type[LedgerError]] = [LedgerError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def problem_types() -> dict[str, ProblemType]:
    """Every problem type this API answers, by slug."""
    types: dict[str, ProblemType] = {}
    for cls in _error_classes():
        types.setdefault(cls.slug, ProblemType(cls.slug, cls.http_status,
                                               inspect.getdoc(cls) or "", cls.exit_code))
    for status, slug in _HTTP_SLUGS.items():
        types.setdefault(slug, ProblemType(slug, status, _HTTP_MEANINGS.get(slug, ""), None))
    for slug, meaning in _HTTP_MEANINGS.items():
        types.setdefault(slug, ProblemType(slug, 500 if slug == "internal-error" else 400,
                                           meaning, None))
    return dict(sorted(types.items()))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} · Ledger problem types</title>
<link rel="stylesheet" href="/ui/static/dashboard.css"></head>
<body data-page="problem"><main class="narrow"><section class="panel">{body}</section></main></body></html>
"""


def _describe(t: ProblemType) -> str:
    exit_code = f"<dt>CLI exit code</dt><dd>{t.exit_code}</dd>" if t.exit_code is not None else ""
    return (f'<h1 id="{html.escape(t.slug)}">{html.escape(title_of(t.slug))}</h1>'
            f"<p>{html.escape(t.meaning)}</p><dl class=\"facts\">"
            f"<dt>type</dt><dd><code>/problems/{html.escape(t.slug)}</code></dd>"
            f"<dt>HTTP status</dt><dd>{t.status}</dd>{exit_code}</dl>"
            '<p class="muted small">Every error of the Ledger API is '
            "<code>application/problem+json</code> (RFC 9457) with one of these types: "
            '<a href="/problems">all problem types</a>.</p>')


@router.get("/problems", response_class=HTMLResponse, include_in_schema=False)
async def problem_index() -> HTMLResponse:
    """Every problem type, with what it means."""
    rows = "".join(f'<li><a href="/problems/{html.escape(t.slug)}">{html.escape(t.slug)}</a> '
                   f"({t.status}): {html.escape(t.meaning.splitlines()[0] if t.meaning else '')}"
                   "</li>" for t in problem_types().values())
    return HTMLResponse(_PAGE.format(title="Problem types", body=(
        f'<h1>Problem types</h1><ul class="problem-types">{rows}</ul>')))


@router.get("/problems/{slug}", response_class=HTMLResponse, include_in_schema=False)
async def problem_page(slug: str) -> HTMLResponse:
    """What one problem type means; 404 (a problem) for a type that does not exist."""
    found = problem_types().get(slug)
    if found is None:
        raise NotFound(f"there is no problem type {slug!r}; see /problems")
    return HTMLResponse(_PAGE.format(title=html.escape(title_of(slug)), body=_describe(found)))
