"""Wake-ups (mechanism 5): NOTIFY is a hint, the rows are the truth.

Channels (all payloads are ids):
  ledger_ready      a campaign became claimable          (payload: campaign id)
  ledger_cancel     a lease holder was fenced out        (payload: campaign id)
  ledger_event      a campaign's journal grew            (payload: campaign id)
  ledger_attempted  a candidate awaits a verifier         (payload: campaign id)
  ledger_outbox     a side effect awaits a dispatcher     (payload: side effect id)

A subscriber asks for a channel, optionally narrowed to one key (a campaign
id): the hub demultiplexes in process. Every waiter also has a timeout (its poll
tick), so a lost notification costs latency, never correctness. Subscribe
*before* reading rows, so a wake-up between the read and the wait is kept.

``NullHub`` is the hub of a process without LISTEN: waits simply time out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

CHANNELS = ("ledger_ready", "ledger_cancel", "ledger_event", "ledger_attempted", "ledger_outbox")


class Subscription(Protocol):
    """A subscriber's view of one channel (and key)."""

    async def wait(self, timeout: float) -> bool:
        """Wait for a wake-up; ``True`` if woken, ``False`` if the timeout passed."""

    def drain(self) -> list[str]:
        """Payloads received since the last drain (may have dropped some on overflow)."""


class WakeSource(Protocol):
    """What runtimes need from a hub."""

    @contextmanager
    def subscribe(self, channel: str, key: str | None = None) -> Iterator[Subscription]:
        """Subscribe for the length of the ``with`` block."""


class _Sleeper:
    async def wait(self, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    def drain(self) -> list[str]:
        return []


class NullHub:
    """No LISTEN connection: every wait is a poll tick."""

    @contextmanager
    def subscribe(self, channel: str, key: str | None = None) -> Iterator[Subscription]:
        if channel not in CHANNELS:
            raise ValueError(f"unknown channel {channel!r}")
        yield _Sleeper()
