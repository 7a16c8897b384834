"""How the HTTP API is served: uvicorn, hardened against slow and greedy clients,
for ``ledger serve`` (the whole process) and for callers that serve it from
inside another asyncio program (``BackgroundServer``: ``ledger demo --ui``,
tests), which keep their own signal handling.

uvicorn bounds a request's headers (``h11_max_incomplete_event_size``), the
idle time between requests of a kept-alive connection (``timeout_keep_alive``)
and how many connections and requests it takes at once (``limit_concurrency``:
above it, a request is answered 503). It has no deadline for a request that
is sent slowly: its keep-alive timer starts only after a response, and the
first byte of the next request stops it, so a client sending a byte now and
then (slowloris), or headers and half a body, held a file descriptor (and a
task) forever. ``DeadlineH11Protocol`` adds that deadline: from the moment a
connection is made, or its last response finished, the next request must
arrive whole -- headers and body -- within ``request_timeout_s``, or the
connection is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class ServerLimits:
    """What one server process takes from its clients."""

    #: A request (headers and body) must arrive whole within this, counted from
    #: the connection's start or its previous response.
    request_timeout_s: float = 15.0
    #: Connections and requests at once (event streams included); above: 503.
    max_connections: int = 500
    #: Idle seconds between two requests of a kept-alive connection.
    keepalive_timeout_s: int = 5
    #: Largest request head (request line and headers), in bytes.
    max_header_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if self.request_timeout_s <= 0 or self.keepalive_timeout_s <= 0:
            raise ValueError("request_timeout_s and keepalive_timeout_s must be positive")
        if self.max_connections < 1 or self.max_header_bytes < 1024:
            raise ValueError("max_connections must be positive, max_header_bytes at least 1024")


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request to arrive whole."""

    request_timeout_s: float = 15.0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            # Closing the transport also tells an app waiting for the rest of
            # the body that the client is gone (http.disconnect).
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        # The request is whole once h11 has its end: no deadline while the
        # app answers (an event stream may run for hours).
        if self._deadline is not None and self.conn.their_state in (h11.DONE, h11.MUST_CLOSE,
                                                                     h11.CLOSED, h11.ERROR):
            self._disarm()

    def on_response_complete(self) -> None:
        # Armed first: the call below may already take a pipelined request
        # whole (and handle_events then disarms).
        self._arm()  # the next request of this connection, if any
        super().on_response_complete()


def _protocol(request_timeout_s: float) -> type[DeadlineH11Protocol]:
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,),
                {"request_timeout_s": request_timeout_s})


def uvicorn_config(app: FastAPI, *, host: str, port: int, limits: ServerLimits | None = None,
                   log_level: str = "warning", graceful_s: int = 5,
                   lifespan: bool = True) -> uvicorn.Config:
    """The uvicorn configuration every Ledger server runs with."""
    limits = limits or ServerLimits()
    # uvicorn's own loggers go through the structured root logger; the API
    # writes its own request log, so uvicorn's access log stays off. Its
    # proxy headers stay off too: the app applies LEDGER_FORWARDED_ALLOW_IPS
    # with the same middleware itself (ledger.api.app), and uvicorn's default
    # would trust 127.0.0.1 besides.
    return uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, log_level=log_level,
        timeout_graceful_shutdown=graceful_s, lifespan="on" if lifespan else "off", proxy_headers=False,
        server_header=False, http=_protocol(limits.request_timeout_s),
        limit_concurrency=limits.max_connections, timeout_keep_alive=limits.keepalive_timeout_s,
        h11_max_incomplete_event_size=limits.max_header_bytes)


class _Guest(uvicorn.Server):
    """A uvicorn server that leaves the host's signal handlers alone."""

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class BackgroundServer:
    """Serve ``app`` on ``host:port`` (0: any free port) in a task of this loop."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                 limits: ServerLimits | None = None, lifespan: bool = True):
        """``lifespan=False``: the caller runs the app's lifespan itself."""
        self.host = host
        self._server = _Guest(uvicorn_config(app, host=host, port=port, limits=limits,
                                             graceful_s=2, lifespan=lifespan))
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 15.0) -> BackgroundServer:
        """Start serving; return once the socket listens."""
        self._task = asyncio.create_task(self._server.serve(), name="ledger-ui-server")
        async with asyncio.timeout(timeout_s):
            while not self._server.started:
                if self._task.done():
                    self._task.result()  # raises what stopped it (e.g. the port is taken)
                    raise RuntimeError("the server stopped before it started")
                await asyncio.sleep(0.02)  # polling interval of the condition above
        return self

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """Where the dashboard is."""
        return f"http://{self.host}:{self.port}/ui/"

    @property
    def base(self) -> str:
        """The server's root URL."""
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving (open event streams are closed)."""
        if self._task is None:
            return
        self._server.should_exit = True
        self._server.force_exit = True  # don't wait for browsers' event streams to end
        await self._task
        self._task = None
