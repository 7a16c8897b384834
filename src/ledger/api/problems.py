"""Every error the HTTP API answers is ``application/problem+json`` (RFC 9457).

``type`` is stable per error class: Ledger's own errors use
``LedgerError.problem_type`` (``/problems/stale-lease`` ...), so the CLI's exit
code and the API's problem type name the same thing. What the framework
refuses before a route runs (validation, unknown routes, wrong methods, bodies
too large) gets a type of its own here. Nothing that a client sends can turn
into a 500: an unexpected exception is logged and answered with an opaque
``internal-error`` problem.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import InvalidInput, LedgerError
from ..logs import get_logger

PROBLEM_MEDIA_TYPE = "application/problem+json"
log = get_logger("api")

#: Problem slugs of refusals that are not LedgerErrors, by HTTP status.
_HTTP_SLUGS = {
    400: "bad-request", 401: "unauthenticated", 403: "forbidden", 404: "not-found",
    405: "method-not-allowed", 406: "not-acceptable", 413: "payload-too-large",
    415: "unsupported-media-type", 422: "invalid-input",
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
    detail = exc.message if not exc.detail else f"{exc.message} ({exc.detail})"
    return problem_response(exc.http_status, exc.slug, detail, request, headers=headers)


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
                            else first["msg"], request, errors=errors)


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
