"""Retention of the journal as a service: the trimmer.

Output and progress deltas of a campaign are worth keeping while someone may
read its attempts' logs; once it has been closed for ``older_than_s`` they go
(``ledger_api.trim_journal``, as the operator role). Transitions and every
other structural event stay for good. ``ledger trim`` runs one pass;
with ``--every``, or in ``ledger run --trim-after``, the host runs it on an
interval.
"""

from __future__ import annotations

from ledger.db.kernel import Kernel
from ledger.identity import process_identity
from ledger.runtime.registry import Registration
from ledger.runtime.service import Loop

#: A pass an hour: trimming is housekeeping, and each pass deletes in bulk.
TRIM_INTERVAL_S = 3600.0


class Trimmer(Loop):
    """Delete journal deltas of campaigns closed longer ago than ``older_than_s``,
    every ``interval_s``; ``kernel`` acts as the operator role."""

    name = "trimmer"

    def __init__(self, kernel: Kernel, *, older_than_s: float, interval_s: float = TRIM_INTERVAL_S):
        super().__init__(interval_s)
        if not 0 <= older_than_s <= 1e9:
            raise ValueError(f"trimmer: older_than_s must be in [0, 1e9], not {older_than_s}")
        self.kernel = kernel
        self.older_than_s = older_than_s
        self.removed = 0
        self.registration = Registration(kernel, "operator", self.name,
                                         process_identity("trimmer"), interval_s)

    async def run_once(self) -> int:
        removed = await self.kernel.trim_journal(self.older_than_s)
        self.removed += removed
        return removed
