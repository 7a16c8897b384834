"""Usage an attempt reports (the attempt protocol's ``LEDGER_USAGE`` lines):
read from the command's output as it runs, checked against
``ledger.protocol.UsageReport``, and written through ``report_usage`` in the
order printed. A malformed or lying line is refused with its reason (a
``usage.refused`` journal event) and nothing else is lost; the database
checks every figure again (a report that passes here but not there is
refused the same way)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from ledger.db.kernel import Kernel
from ledger.errors import InvalidInput, LedgerError, StaleLease
from ledger.logs import get_logger
from ledger.protocol import USAGE_LINE_BYTES, USAGE_PREFIX, USAGE_REPORTS, UsageReport

Journal = Callable[[str, dict[str, Any]], Awaitable[None]]


def parse_usage(line: str) -> UsageReport:
    """A usage line's report, or ``ValueError`` saying why it is refused."""
    body = line[len(USAGE_PREFIX):].strip()
    if len(line.encode()) > USAGE_LINE_BYTES:
        raise ValueError(f"a usage line is at most {USAGE_LINE_BYTES} bytes")
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError("a usage line carries one JSON object after LEDGER_USAGE") from None
    if not isinstance(data, dict):
        raise ValueError("a usage line carries one JSON object after LEDGER_USAGE")
    if isinstance(data.get("cost"), int) and not isinstance(data.get("cost"), bool):
        data["cost"] = float(data["cost"])  # 2 is a cost as much as 2.0
    try:
        return UsageReport.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "report"
        raise ValueError(f"{where}: {first['msg']}") from None


class UsageReporter:
    """Feed it the command's output (``feed``); it sends each usage line's
    report in order, and ``drain`` waits until every one is in."""

    def __init__(self, kernel: Kernel, campaign_id: int, generation: int, journal: Journal):
        self.kernel = kernel
        self.campaign_id = campaign_id
        self.generation = generation
        self.journal = journal
        self.log = get_logger("usage", campaign=campaign_id, generation=generation)
        self._partial = b""
        self._queue: asyncio.Queue[UsageReport | str] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.seen = 0
        self.reported = 0
        self.refused = 0
        self.over_budget = False

    def feed(self, data: bytes) -> None:
        """Output of the command: complete lines are looked at."""
        self._partial += data
        *lines, self._partial = self._partial.split(b"\n")
        if len(self._partial) > USAGE_LINE_BYTES * 4:
            self._partial = self._partial[-USAGE_LINE_BYTES:]  # no line: keep only what could start one
        for raw in lines:
            self._line(raw)

    def _line(self, raw: bytes) -> None:
        text = raw.decode(errors="replace").rstrip("\r")
        if not text.startswith(USAGE_PREFIX):
            return
        self.seen += 1
        if self.seen > USAGE_REPORTS:
            item: UsageReport | str = f"more than {USAGE_REPORTS} usage reports: no more are taken"
        else:
            try:
                item = parse_usage(text)
            except ValueError as exc:
                item = str(exc)
        self._queue.put_nowait(item)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, str):
                await self._refuse(item)
                continue
            n = self.reported + self.refused + 1
            try:
                result = await self.kernel.report_usage(
                    self.campaign_id, self.generation, tokens_in=item.tokens_in,
                    tokens_out=item.tokens_out, requests=item.requests, cost=item.cost,
                    key=f"usage-{self.generation}-{n}")
            except InvalidInput as exc:
                await self._refuse(exc.message)
                continue
            except StaleLease:
                return  # the lease is gone: the attempt learns it from its heartbeat
            except LedgerError as exc:
                self.log.warning("a usage report could not be written", error=exc.message)
                self.refused += 1
                continue
            self.reported += 1
            self.over_budget = self.over_budget or result.over_budget

    async def _refuse(self, reason: str) -> None:
        self.refused += 1
        self.log.warning("usage report refused", reason=reason)
        try:
            await self.journal("usage.refused", {"reason": reason[:500]})
        except LedgerError:
            pass

    async def drain(self) -> None:
        """Every report fed so far is written (or refused)."""
        if self._partial:
            self._line(self._partial)
            self._partial = b""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        if not self._queue.empty():
            await self._send()
