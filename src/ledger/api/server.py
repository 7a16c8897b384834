"""The HTTP API (and its dashboard) served from inside another asyncio program,
e.g. ``ledger demo --ui``: uvicorn on the caller's event loop, started and
stopped by the caller, which keeps its own signal handling (``ledger serve``
runs uvicorn as the whole process instead)."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI


class _Guest(uvicorn.Server):
    """A uvicorn server that leaves the host's signal handlers alone."""

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class BackgroundServer:
    """Serve ``app`` on ``host:port`` (0: any free port) in a task of this loop."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self._server = _Guest(uvicorn.Config(app, host=host, port=port, log_config=None,
                                             access_log=False, log_level="warning",
                                             timeout_graceful_shutdown=2, lifespan="on"))
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

    async def stop(self) -> None:
        """Stop serving (open event streams are closed)."""
        if self._task is None:
            return
        self._server.should_exit = True
        self._server.force_exit = True  # don't wait for browsers' event streams to end
        await self._task
        self._task = None
