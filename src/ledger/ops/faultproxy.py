"""A TCP proxy that makes network faults on demand, for tests and drills.

Put in front of PostgreSQL, it forwards bytes both ways until told to:

* ``silence()`` -- drop every byte both ways while keeping every socket open
  (a partition, a NAT that forgot the flow: no reset, no error, nothing); new
  connections are accepted and then hear nothing either. ``heal()`` ends it
  and closes the connections that lost bytes (their protocol state is gone).
* ``drop_reply(marker)`` -- the next statement whose bytes contain ``marker``
  reaches the server (which runs and commits it), but its reply never reaches
  the client: the connection is then closed (``close=True``) or left silent.
* ``cut()`` -- close every connection at once.

It runs its own event loop in a daemon thread, so synchronous code, an asyncio
test and a drill orchestrating processes can all drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict, make_conninfo


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    silent: bool = False
    drop: str | None = None  # None, "close" or "silent": what to do with the next reply
    lost_bytes: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for writer in (self.client, self.server):
            with contextlib.suppress(Exception):
                writer.close()


class FaultProxy:
    """A proxy to ``host:port``, listening on ``listen`` (``127.0.0.1``; the
    address of a bridge for machines in network namespaces of their own:
    ``ledger.ops.netns``) at a free port."""

    def __init__(self, host: str, port: int, *, listen: str = "127.0.0.1"):
        self.host = host
        self.target_port = port
        self.listen = listen
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._links: set[_Link] = set()
        self._silent = False
        self._marker: tuple[bytes, str] | None = None
        #: set when a reply was dropped (``drop_reply``)
        self.dropped = threading.Event()
        #: connections accepted so far
        self.accepted = 0
        #: set when bytes were swallowed by silence (a statement sent into it)
        self.swallowed = threading.Event()

    @classmethod
    def before(cls, url: str, *, listen: str = "127.0.0.1") -> FaultProxy:
        """A started proxy in front of the server ``url`` names (its TCP
        address, or its Unix socket directory: clients reach the proxy by TCP
        either way)."""
        params = conninfo_to_dict(url)
        return cls(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432),
                   listen=listen).start()

    def url(self, url: str) -> str:
        """``url`` pointed at this proxy instead of its server."""
        params = conninfo_to_dict(url)
        params.update(host=self.listen, port=str(self.port))
        return make_conninfo("", **params)

    # --- lifecycle ----------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Listen (on a free port) and forward."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        """Close everything and end the proxy's thread."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- faults --------------------------------------------------------------------

    def silence(self) -> None:
        """Drop every byte both ways, new connections included; keep sockets open."""
        self.swallowed.clear()
        self._call(self._set_silent, True)

    def heal(self) -> None:
        """Forward again; connections that lost bytes are closed."""
        self._call(self._set_silent, False)

    def drop_reply(self, marker: bytes, *, close: bool = True) -> None:
        """Swallow the reply to the next statement containing ``marker``
        (the statement itself reaches the server); then close that client
        connection, or with ``close=False`` leave it silent."""
        self.dropped.clear()
        self._call(self._arm, (marker, "close" if close else "silent"))

    def cut(self) -> None:
        """Close every connection now."""
        self._call(self._cut)

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._links)

    # --- inside the proxy's loop -----------------------------------------------------

    def _call(self, fn: object, *args: object) -> None:
        async def run() -> None:
            fn(*args)  # type: ignore[operator]
        asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def _set_silent(self, silent: bool) -> None:
        self._silent = silent
        for link in list(self._links):
            if silent:
                link.silent = True
            elif link.silent or link.lost_bytes:
                self._drop_link(link)

    def _arm(self, marker: tuple[bytes, str]) -> None:
        self._marker = marker

    def _cut(self) -> None:
        for link in list(self._links):
            self._drop_link(link)

    def _drop_link(self, link: _Link) -> None:
        link.close()
        for task in link.tasks:
            task.cancel()
        self._links.discard(link)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        self._cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            if self.host.startswith("/"):  # a Unix socket directory, as libpq names it
                server_r, server_w = await asyncio.open_unix_connection(
                    f"{self.host}/.s.PGSQL.{self.target_port}")
            else:
                server_r, server_w = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            client_w.close()
            return
        link = _Link(client_w, server_w, silent=self._silent)
        self._links.add(link)
        link.tasks = [asyncio.create_task(self._pipe(client_r, server_w, link, up=True)),
                      asyncio.create_task(self._pipe(server_r, client_w, link, up=False))]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link, *,
                    up: bool) -> None:
        try:
            while chunk := await reader.read(65536):
                if up and self._marker is not None and self._marker[0] in chunk:
                    link.drop, self._marker = self._marker[1], None
                if link.silent:
                    link.lost_bytes = True
                    self.swallowed.set()
                    continue
                if not up and link.drop is not None:
                    self.dropped.set()
                    if link.drop == "close":
                        self._drop_link(link)
                        return
                    link.silent = link.lost_bytes = True
                    continue
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if not link.silent and link in self._links:
                # one side closed on its own: close the other, as TCP would
                self._drop_link(link)
