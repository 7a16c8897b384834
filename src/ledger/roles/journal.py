"""A lease holder's journal writer (README "How it works": an append-only
journal).

Structural events (attempt started, command started/exited, commit made) are
written through at once; output is coalesced in memory and flushed at most every
``flush_s`` (250 ms), so a burst of lines becomes a few rows. Every append is
fenced by the lease's generation inside the INSERT (``append_events``): once the
lease is gone, a batch writes nothing -- not even its NOTIFY -- and the writer
goes quiet for good.

Each batch carries a key of its own, so a batch whose reply was lost is sent
again without being appended twice, and every append is bounded by the
lease's remaining time by the holder's own clock (``budget``): past it the
writer goes quiet as if fenced.
"""

from __future__ import annotations

import asyncio
import codecs
import uuid
from collections.abc import Callable
from typing import Any

from ledger.db.kernel import Kernel
from ledger.errors import LedgerError, StaleLease, Unavailable
from ledger.sandbox.processes import storable

#: Largest output payload in one journal row; longer flushes are split. Large
#: enough that one 250 ms flush of a very chatty command (10,000 lines/s is
#: ~0.2 MiB per flush) stays one row: rows per second, not bytes, are what
#: cost the database (bench/journal.py).
CHUNK_CHARS = 1024 * 1024


class JournalWriter:
    """Appends to one campaign's journal for one lease (generation)."""

    def __init__(self, kernel: Kernel, campaign_id: int, generation: int, *,
                 flush_s: float = 0.25, limit_bytes: int = 256 * 1024,
                 budget: Callable[[], float] | None = None):
        self.kernel = kernel
        self.campaign_id = campaign_id
        self.generation = generation
        self.flush_s = flush_s
        self.limit_bytes = limit_bytes
        self.budget = budget
        self.fenced = False
        self.rows_written = 0
        self.output_bytes = 0
        self._pending: list[str] = []
        self._truncated = False
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one writer at a time keeps seq order = write order
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    async def event(self, type_: str, payload: dict[str, Any] | None = None) -> None:
        """Write a structural event now (after any output still buffered)."""
        await self._append([{"type": type_, "payload": payload or {}}], with_output=True)

    def output(self, data: bytes) -> None:
        """Buffer command output; a flush follows within ``flush_s``."""
        if self.fenced:
            return
        text = storable(self._decoder.decode(data))
        if not text:
            return
        encoded = text.encode()
        room = max(self.limit_bytes - self.output_bytes, 0)
        if len(encoded) > room:
            encoded = encoded[:room]
            text = encoded.decode(errors="ignore")  # never half a character
            if not self._truncated:
                self._truncated = True
                text += f"\n[ledger: output beyond {self.limit_bytes} bytes not journaled]\n"
        if not text:
            return
        self.output_bytes += len(encoded)
        self._pending.append(text)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        # Output that arrives while a flush is being written is flushed by the
        # next round of this loop: the timer ends only with nothing pending.
        while self._pending and not self.fenced:
            await asyncio.sleep(self.flush_s)  # the coalescing window itself, not a synchronisation
            try:
                await self.flush()
            except LedgerError:
                return  # fenced or out of time: the attempt learns it from its lease

    async def flush(self) -> None:
        """Write buffered output now."""
        await self._append([], with_output=True)

    async def close(self) -> None:
        """Flush what is left; stop the timer."""
        tail = storable(self._decoder.decode(b"", final=True))
        if tail:
            self._pending.append(tail)
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
        await self.flush()

    def _take_output(self) -> list[dict[str, Any]]:
        text = "".join(self._pending)
        self._pending.clear()
        return [{"type": "output", "delta": True, "payload": {"text": text[i:i + CHUNK_CHARS]}}
                for i in range(0, len(text), CHUNK_CHARS)]

    async def _append(self, events: list[dict[str, Any]], *, with_output: bool) -> None:
        async with self._lock:
            batch = (self._take_output() if with_output else []) + events
            if self.fenced or not batch:
                return
            timeout_s = self.budget() if self.budget is not None else None
            try:
                if timeout_s is not None and timeout_s <= 0:
                    raise StaleLease("the lease lapsed by the holder's own clock: nothing more is written")
                await self.kernel.append_events(self.campaign_id, self.generation, batch,
                                                key=uuid.uuid4().hex, timeout_s=timeout_s)
                self.rows_written += len(batch)
            except (StaleLease, Unavailable):
                # Unavailable here means the lease's remaining time ran out
                # while retrying: as good as fenced.
                self.fenced = True
                self._pending.clear()
                raise
