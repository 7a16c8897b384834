"""The reaper: returns expired leases to ready (README "What a lease guarantees"),
and decides the approvals whose deadline passed as their class says
(docs/approval.md).

It runs in every worker process -- there is no singleton to lose -- and once at
boot (the reconciler). Concurrent reapers are harmless: the kernel re-tests
expiry inside its UPDATE, so a lease renewed a moment ago, or reaped by another
process a moment ago, is left alone.
"""

from __future__ import annotations

from ledger.db.kernel import Kernel
from ledger.identity import process_identity
from ledger.runtime.registry import Registration
from ledger.runtime.service import Loop


class Reaper(Loop):
    """Expire leases older than their expiry plus ``grace_s``."""

    name = "reaper"

    def __init__(self, kernel: Kernel, *, grace_s: float = 5.0, interval_s: float = 5.0,
                 batch: int = 100):
        super().__init__(interval_s)
        if grace_s < 0:
            raise ValueError("reaper grace must not be negative")
        self.kernel = kernel
        self.grace_s = grace_s
        self.batch = batch
        self.reaped = 0
        #: approvals this reaper decided on their deadline
        self.timed_out = 0
        self.registration = Registration(kernel, "reaper", self.name, process_identity("reaper"),
                                         interval_s)

    async def run_once(self) -> int:
        total = 0
        while True:
            reaped = await self.kernel.expire_leases(self.grace_s, self.batch)
            for r in reaped:
                self.log.info("lease expired; attempt recorded as lost", campaign=r.campaign_id,
                              lost_worker=r.worker, generation=r.generation, state=r.state)
            total += len(reaped)
            if len(reaped) < self.batch:
                break
        self.reaped += total
        while True:
            expired = await self.kernel.expire_approvals(self.batch)
            for e in expired:
                self.log.info("approval timed out; decided as its class says", campaign=e.campaign_id,
                              approval=e.approval_id, decision=e.decision, state=e.state)
            total += len(expired)
            self.timed_out += len(expired)
            if len(expired) < self.batch:
                break
        return total
