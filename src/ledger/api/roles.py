"""One connection pool per role, and the caller a route works for.

Each pool's connections ``SET ROLE`` to their role (``ledger.db.database``), so a
request authenticated as a reader can only ever run what the reader role may
run: the database is the authority, the token only picks the pool. Pools open
on first use, so a server starts (and answers ``/livez``, ``/readyz``) while
the database is still down or not migrated.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from ledger.api.auth import Principal, authenticate
from ledger.db.database import Database, Session
from ledger.db.kernel import Kernel
from ledger.db.reads import Reads
from ledger.errors import LedgerError, Unavailable


class RolePools:
    """Lazily opened ``Session`` pools, one per role."""

    def __init__(self, database: Database, *, max_size: int = 10, open_timeout_s: float = 10.0):
        self.database = database
        self.max_size = max_size
        self.open_timeout_s = open_timeout_s
        self._sessions: dict[str, Session] = {}
        self._lock = asyncio.Lock()

    async def session(self, role: str) -> Session:
        """The open pool acting as ``role``; ``Unavailable`` if it cannot open."""
        session = self._sessions.get(role)
        if session is not None:
            return session
        async with self._lock:
            session = self._sessions.get(role)
            if session is None:
                candidate = self.database.session(role, min_size=1, max_size=self.max_size)
                try:
                    await candidate.open(timeout=self.open_timeout_s)
                except Unavailable:
                    raise
                except LedgerError as exc:
                    # e.g. the role does not exist yet: the server is not ready,
                    # which is not the client's fault.
                    raise Unavailable(f"cannot act as {role}: {exc.message}") from exc
                self._sessions[role] = session = candidate
        return session

    async def kernel(self, role: str) -> Kernel:
        """A kernel acting as ``role``."""
        return Kernel(await self.session(role))

    async def reads(self, role: str) -> Reads:
        """Reads acting as ``role``."""
        return Reads(await self.session(role))

    async def close(self) -> None:
        """Close every pool."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()


@dataclass(frozen=True)
class Caller:
    """An authenticated caller and a kernel acting as its role (its writes;
    ``reads`` for the rest)."""

    principal: Principal
    kernel: Kernel

    @property
    def reads(self) -> Reads:
        """Reads as the caller's role (over the same pool)."""
        return Reads(self.kernel.executor)


async def caller(request: Request,
                 principal: Annotated[Principal, Depends(authenticate)]) -> Caller:
    """The route's caller: authenticated, with a kernel acting as its role."""
    pools: RolePools = request.app.state.ledger.pools
    return Caller(principal, await pools.kernel(principal.role))


CallerDep = Annotated[Caller, Depends(caller)]
