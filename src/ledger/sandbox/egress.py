"""Egress for cells that must reach named hosts (``cell.network = "proxy"``).

An agent usually has to reach its model's API, and nothing else. A cell with
``network = "proxy"`` still has no network of its own (its own network
namespace, only a loopback); what it has is one way out: an HTTP ``CONNECT``
proxy run by the trusted worker (this module) behind a Unix socket bound into
the cell, and a forwarder in the cell's monitor (``cell_init``) that listens
on the cell's ``127.0.0.1:3128`` and carries each connection to that socket.
The command gets ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` pointing there.

The proxy allows a ``CONNECT`` only to a ``host:port`` matching the class's
``cell.allow`` patterns (``api.example.com:443``, ``*.example.com:443``); it
resolves the name itself (the cell has no DNS) and refuses a name that
resolves to an address of this host's own networks -- loopback, private,
link-local, multicast, reserved -- so an allowed name cannot be pointed at
the database or the metadata service; an IP literal is allowed only when a
pattern names it exactly. Everything it refuses is reported (``refused``),
and the worker records it as a security event.

What it cannot prevent, and docs/running/cell.md says: whatever the command sends *to
an allowed host* (an agent's API is the one place it may talk to, so it can
talk there about anything it read in its cell), and programs that ignore the
proxy variables simply get no connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import ipaddress
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Where the cell's forwarder listens, inside the cell.
INSIDE_PORT = 3128
INSIDE_SOCKET = "/cell/.egress.sock"
_HEADER_LIMIT = 16 * 1024
_CONNECT_TIMEOUT_S = 10.0


def check_pattern(pattern: str) -> str:
    """``ValueError`` unless ``pattern`` is ``HOST:PORT`` (``*`` allowed in the host)."""
    host, sep, port = pattern.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"cell.allow entries are HOST:PORT (e.g. api.example.com:443), not {pattern!r}")
    return pattern


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                or ip.is_reserved or ip.is_unspecified)


@dataclass
class EgressProxy:
    """One cell's way out: ``async with EgressProxy(allow).serving() as socket_path``."""

    allow: Sequence[str]
    refused: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)

    def permits(self, host: str, port: int) -> bool:
        """Whether a pattern allows ``host:port``."""
        target = f"{host.lower()}:{port}"
        return any(fnmatch.fnmatchcase(target, pattern.lower()) for pattern in self.allow)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Path]:
        """Serve on a fresh Unix socket until the block ends; yields its path."""
        with tempfile.TemporaryDirectory(prefix="ledger-egress-") as scratch:
            path = Path(scratch) / "egress.sock"
            server = await asyncio.start_unix_server(self._serve, path=str(path))
            os.chmod(path, 0o666)  # the cell's user (65534 inside) connects to it
            try:
                yield path
            finally:
                server.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        if len(head) > _HEADER_LIMIT:
            await self._answer(writer, 431, "request header too large")
            return
        request = head.split(b"\r\n", 1)[0].decode("latin-1")
        method, _, rest = request.partition(" ")
        authority = rest.split(" ", 1)[0]
        if method != "CONNECT":
            self.refused.append(f"{method} {authority[:200]} (only CONNECT is relayed)")
            await self._answer(writer, 405, "only CONNECT (HTTPS) is relayed")
            return
        host, sep, port_text = authority.rpartition(":")
        host = host.strip("[]")
        if not sep or not port_text.isascii() or not port_text.isdigit():
            self.refused.append(f"CONNECT {authority[:200]} (not HOST:PORT)")
            await self._answer(writer, 400, "CONNECT HOST:PORT")
            return
        port = int(port_text)
        if not self.permits(host, port):
            self.refused.append(f"{host}:{port}")
            await self._answer(writer, 403, f"{host}:{port} is not allowed for this class")
            return
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=0, proto=6)
        except OSError as exc:
            await self._answer(writer, 502, f"cannot resolve {host}: {exc}")
            return
        addresses = [str(i[4][0]) for i in infos]
        usable = [a for a in addresses if literal is not None or _public(a)]
        if not usable:
            self.refused.append(f"{host}:{port} (resolves to {', '.join(sorted(set(addresses)))})")
            await self._answer(writer, 403, f"{host} resolves to an address of this host's own networks")
            return
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(usable[0], port), _CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            await self._answer(writer, 502, f"cannot reach {host}:{port}: {exc}")
            return
        self.allowed.append(f"{host}:{port}")
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer),
                             return_exceptions=True)

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, text: str) -> None:
        body = (text + "\n").encode()
        writer.write(f"HTTP/1.1 {status} {text[:60]}\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.close()


def proxy_environment() -> dict[str, str]:
    """What a command in a proxied cell is told (upper and lower case: tools differ)."""
    url = f"http://127.0.0.1:{INSIDE_PORT}"
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
    return {**{n: url for n in names}, **{n.lower(): url for n in names}, "NO_PROXY": "", "no_proxy": ""}
