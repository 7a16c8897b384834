"""Self-fencing by the holder's own clock (README "What a lease guarantees" and
"When the database restarts, or the network goes quiet").

The design at length: docs/internals.md (``ledger.roles.lease``).
"""

from __future__ import annotations

import time

#: The rate error allowed between the local monotonic clock and the database's.
DRIFT = 1e-3


def margin(lease_s: float) -> float:
    """How long before the computed expiry a holder stops: 15 % of the lease, at most 5 s."""
    return min(5.0, 0.15 * max(lease_s, 0.0))


class LeaseClock:
    """The local deadline of one lease, moved forward by each confirmed renewal."""

    def __init__(self) -> None:
        self.deadline = float("-inf")
        self.renewals = 0

    @staticmethod
    def now() -> float:
        """The local monotonic clock the deadline is kept in."""
        return time.monotonic()

    def confirm(self, sent_at: float, remaining_s: float) -> None:
        """A renewal sent at local time ``sent_at`` was answered: the lease
        had ``remaining_s`` seconds left by the database's clock."""
        deadline = sent_at + remaining_s * (1 - DRIFT) - margin(remaining_s)
        if deadline > self.deadline:
            self.deadline = deadline
        self.renewals += 1

    def remaining(self) -> float:
        """Seconds until the holder must stop (negative once past)."""
        return self.deadline - self.now()

    @property
    def lapsed(self) -> bool:
        """Whether the holder must stop now."""
        return self.remaining() <= 0
