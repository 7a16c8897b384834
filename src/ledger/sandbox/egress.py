"""Egress for cells that must reach named hosts (``cell.network = "proxy"``).

The design at length: docs/internals.md (``ledger.sandbox.egress``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import ipaddress
import os
import re
import socket
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Where the cell's forwarder listens, inside the cell.
INSIDE_PORT = 3128
INSIDE_SOCKET = "/run/proxy.sock"
_HEADER_LIMIT = 16 * 1024
_CONNECT_TIMEOUT_S = 10.0


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_WILDCARD = re.compile(r"[*?\[]")
_NUMERIC = re.compile(r"^[0-9a-fA-F.:\[\]%]*$")


def check_pattern(pattern: str) -> str:
    """``ValueError`` unless ``pattern`` is ``HOST:PORT`` (``*`` allowed in
    the host) and its wildcards could match a name: one that could only
    match IP addresses (``10.*:443``, ``127.0.0.?:80``) is refused -- an
    address is allowed only by naming it exactly."""
    host, sep, port = pattern.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"cell.allow entries are HOST:PORT (e.g. api.example.com:443), not {pattern!r}")
    if _WILDCARD.search(host):
        rest = _WILDCARD.sub("", host)
        if _NUMERIC.match(rest) and re.search(r"[0-9:\[]", rest):
            raise ValueError(f"cell.allow entry {pattern!r} would match IP addresses: name an address "
                             "exactly (10.0.0.5:443), or hosts by name (*.example.com:443)")
    return pattern


def literal(host: str) -> Address | None:
    """``host`` as an IP address, however it is spelt (dotted, shortened,
    decimal, octal or hexadecimal IPv4 as ``inet_aton`` reads it; IPv6 with
    or without brackets and a zone), or ``None`` for a name."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if text and re.fullmatch(r"[0-9a-fA-FxX.]+", text) and re.match(r"[0-9]", text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def _embedded(ip: Address) -> list[Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, compatible, 6to4, Teredo, NAT64)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    found: list[Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found += list(ip.teredo)
    packed = ip.packed
    if packed[:12] == bytes(12) and int(ip) > 1:  # ::a.b.c.d (deprecated IPv4-compatible)
        found.append(ipaddress.IPv4Address(packed[12:]))
    if ip in ipaddress.IPv6Network("64:ff9b::/96") or ip in ipaddress.IPv6Network("64:ff9b:1::/48"):
        found.append(ipaddress.IPv4Address(packed[12:]))
    return found


def own_network(ip: Address) -> bool:
    """Whether ``ip`` is of this host's own networks (or not of the Internet
    at all): loopback, private, link-local, shared, multicast, reserved,
    unspecified -- or an IPv6 address carrying one."""
    if not ip.is_global or ip.is_multicast or ip.is_reserved or ip.is_unspecified or ip.is_link_local:
        return True
    return any(own_network(inner) for inner in _embedded(ip))


def _public(address: str) -> bool:
    ip = literal(address)
    return ip is not None and not own_network(ip)


@dataclass
class EgressProxy:
    """One cell's way out: ``async with EgressProxy(allow).serving() as socket_path``."""

    allow: Sequence[str]
    refused: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)

    def permits(self, host: str, port: int) -> bool:
        """Whether a pattern allows ``host:port``: a name by any matching
        pattern, an IP address only by a pattern naming it (and the port) exactly."""
        address = literal(host)
        if address is not None:
            for pattern in self.allow:
                named, _, named_port = pattern.rpartition(":")
                if not _WILDCARD.search(named) and literal(named) == address and int(named_port) == port:
                    return True
            return False
        target = f"{host.lower()}:{port}"
        return any(fnmatch.fnmatchcase(target, pattern.lower()) for pattern in self.allow)

    def _refuse(self, what: str) -> None:
        if len(self.refused) < 1000:
            self.refused.append(what)

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
            self._refuse(f"{method} {authority[:200]} (only CONNECT is relayed)")
            await self._answer(writer, 405, "only CONNECT (HTTPS) is relayed")
            return
        host, sep, port_text = authority.rpartition(":")
        host = host.strip("[]")
        if not sep or not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            self._refuse(f"CONNECT {authority[:200]} (not HOST:PORT)")
            await self._answer(writer, 400, "CONNECT HOST:PORT")
            return
        port = int(port_text)
        if not self.permits(host, port):
            address = literal(host)
            if address is not None and own_network(address):
                self._refuse(f"{host[:200]}:{port} (an address of this host's own networks)")
            elif address is not None:
                self._refuse(f"{host[:200]}:{port} (an IP address no pattern names exactly)")
            else:
                self._refuse(f"{host[:200]}:{port}")
            await self._answer(writer, 403, f"{host[:200]}:{port} is not allowed for this class")
            return
        named = literal(host)
        if named is not None:  # named exactly by a pattern: the operator's own choice
            usable = [str(named)]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                     proto=6)
            except OSError as exc:
                await self._answer(writer, 502, f"cannot resolve {host}: {exc}")
                return
            addresses = [str(i[4][0]) for i in infos]
            usable = [a for a in addresses if _public(a)]
            if not usable:
                self._refuse(f"{host}:{port} (resolves to {', '.join(sorted(set(addresses)))}, "
                             "of this host's own networks)")
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
