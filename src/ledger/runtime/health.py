"""``--health HOST:PORT``: a long-running service's own ``/livez`` and ``/readyz``.

A worker, verifier or sensors process has no HTTP API; an orchestrator still
wants to know whether it works. With ``--health`` it answers, on that address:

* ``GET /livez``: 200 while the process runs (it answers at all);
* ``GET /readyz``: 200 ``{"status": "ready"}`` once its services run, 503
  ``{"status": "not ready", "reasons": [...]}`` while it starts or waits out
  a start-up fault (``ledger.runtime.startup``: the cause and the fix, one
  line per part) -- also a fault that keeps it from the database, which the
  registry of processes cannot show.

Plain HTTP/1.0 on asyncio, one request per connection: nothing to configure,
nothing to import. The answers name no host, user or secret beyond what the
one line of the cause does (a missing login's user name, a repository's
path): bind it where only the orchestrator reaches (the default is nowhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from ledger.errors import CannotListen, ConfigError
from ledger.logs import get_logger
from ledger.runtime.startup import READINESS, Readiness
from ledger.settings import check_address

log = get_logger("health")

#: How long a client may take to send its request line.
REQUEST_TIMEOUT_S = 5.0


def answer(path: str, readiness: Readiness = READINESS) -> tuple[int, dict[str, object]]:
    """The status and the JSON body for a GET of ``path``."""
    if path == "/livez":
        return 200, {"status": "alive"}
    if path == "/readyz":
        if readiness.ready:
            return 200, {"status": "ready"}
        return 503, {"status": "not ready", "reasons": readiness.reasons()}
    return 404, {"status": "not found", "paths": ["/livez", "/readyz"]}


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)
        parts = line.decode("latin-1").split()
        path = parts[1].split("?", 1)[0] if len(parts) >= 2 and parts[0] in ("GET", "HEAD") else ""
        status, body = answer(path) if path else (405, {"status": "GET only"})
        payload = json.dumps(body).encode()
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
                  503: "Service Unavailable"}[status]
        head = (f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nCache-Control: no-store\r\n"
                "Connection: close\r\n\r\n").encode()
        writer.write(head + (payload if parts[:1] != ["HEAD"] else b""))
        await writer.drain()
    except (OSError, TimeoutError, UnicodeError, IndexError):
        pass  # a client that went away or spoke nonsense: nothing to tell it
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def serving_health(address: str | None) -> AsyncIterator[int | None]:
    """Answer ``/livez`` and ``/readyz`` on ``address`` (HOST:PORT) while the
    block runs; yields the port (``None``: no address, nothing served)."""
    if address is None:
        yield None
        return
    try:
        host, port = check_address(address)
    except ValueError as exc:
        raise ConfigError(f"--health / LEDGER_HEALTH: {exc}") from None
    try:
        server = await asyncio.start_server(_serve_one, host, port)
    except OSError as exc:
        raise CannotListen(f"cannot answer health probes on {address}: {exc.strerror or exc}",
                           hint="choose another --health address") from None
    bound = server.sockets[0].getsockname()[1]
    log.info("answering health probes", address=f"{host}:{bound}")
    try:
        yield int(bound)
    finally:
        server.close()
        await server.wait_closed()
