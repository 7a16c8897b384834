"""ASGI middleware of the API: a body size limit, the request log, and the
headers of every HTML page (frame protection, a CSP).

Both are plain ASGI (no buffering), so streamed responses -- the SSE tails --
pass straight through. The body limit is ours because nothing maintained does
it for an ASGI app: Starlette reads bodies unbounded and uvicorn limits only
headers. Request ids come from asgi-correlation-id (``ledger.api.app``); the
log binds the id it chose.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time

import structlog
from asgi_correlation_id import correlation_id
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger.api.metrics import ProcessCounters
from ledger.api.problems import PayloadTooLarge, problem_for
from ledger.logs import get_logger

#: Probes and scrapes are logged at debug: they would drown everything else.
_QUIET = frozenset({"/livez", "/readyz", "/metrics"})


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with a 413 problem: at once when
    ``Content-Length`` says so, or as soon as a streamed body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = PayloadTooLarge(f"the request body is larger than {self.max_bytes} bytes")
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() \
                    and (len(value) > 18 or int(value) > self.max_bytes):
                await problem_for(too_large, Request(scope))(scope, receive, send)
                return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # An HTTPException, because the framework turns anything else
                    # raised while it reads a body into a generic 400.
                    raise HTTPException(413, too_large.message)
            return message

        await self.app(scope, limited, send)


class RequestLog:
    """One structured log line per request: method, route, status, duration,
    client address, caller; and the request's duration in this process's
    histogram.

    The ``request_id`` (asgi-correlation-id's: the client's ``X-Request-ID`` if
    it is sane, else a new one, returned in the response's ``X-Request-ID``) is
    bound for every line logged while the request runs."""

    def __init__(self, app: ASGIApp, counters: ProcessCounters):
        self.app = app
        self.counters = counters
        self.log = get_logger("api")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = correlation_id.get()
        started = time.perf_counter()
        status = 500  # if the app dies before it starts a response

        async def send_logged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                await self.app(scope, receive, send_logged)
            finally:
                route = scope.get("route")
                template = getattr(route, "path_format", None) or "unmatched"
                elapsed = time.perf_counter() - started
                self.counters.count_request(scope["method"], template, status, elapsed)
                principal = scope.get("state", {}).get("principal")
                level = "debug" if scope["path"] in _QUIET and status < 400 else "info"
                peer = scope.get("client")  # behind a trusted proxy: the client it names
                getattr(self.log, level)(
                    "request", method=scope["method"], path=scope["path"], route=template,
                    status=status, duration_ms=round(elapsed * 1000, 2),
                    client=peer[0] if peer else None,
                    caller=principal.identity if principal else None,
                    role=principal.role if principal else None)


#: What every HTML response says about framing, sniffing and referrers.
FRAME_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.S | re.I)


def page_policy(body: bytes) -> str:
    """A CSP for a page not written by the dashboard (``/docs``, ``/redoc``,
    ``/problems``): everything from this server, and the page's own inline
    scripts by their hashes (the docs pages start their viewer inline), styles
    inline allowed (ReDoc injects its own), never framed."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(m.group(1)).digest()).decode() + "'"
        for m in _INLINE_SCRIPT.finditer(body))
    return ("default-src 'self'; script-src 'self'" + (f" {hashes}" if hashes else "")
            + "; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "worker-src 'self' blob:; object-src 'none'; frame-ancestors 'none'; "
            "form-action 'self'; base-uri 'none'")


class HtmlHeaders:
    """Frame protection and a CSP on every HTML response: the dashboard's pages
    set their own policy; any other page (the API's docs, the problem pages)
    gets ``page_policy`` of its body. HTML responses here are whole documents
    of a few KiB (event streams are not HTML), so their bodies are held until
    the last part to hash the inline scripts."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        parts: list[bytes] = []

        async def send_with_headers(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                content_type = next((v for k, v in message.get("headers", [])
                                     if k == b"content-type"), b"")
                if not content_type.startswith(b"text/html"):
                    await send(message)
                    return
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(parts)
            head = scope.get("method") == "HEAD"  # its length is the GET's, its body empty
            headers = [(k, v) for k, v in start.get("headers", [])
                       if head or k != b"content-length"]
            present = {k.lower() for k, _ in headers}
            for name, value in FRAME_HEADERS.items():
                if name.lower().encode() not in present:
                    headers.append((name.lower().encode(), value.encode()))
            if b"content-security-policy" not in present:
                headers.append((b"content-security-policy", page_policy(body).encode()))
            if not head:
                headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, send_with_headers)
