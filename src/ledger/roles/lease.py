"""Self-fencing by the holder's own clock (README "What a lease guarantees" and
"When the database restarts, or the network goes quiet").

The database judges every lease: a write from a holder whose
``lease_expires_at`` has passed is refused, whoever else is running. But a
holder that cannot reach the database (a silent path, a paused server) cannot
learn that its lease lapsed, and would keep working -- an attempt command
editing towards an objective that another worker has meanwhile claimed.
So each holder also keeps a *local* deadline and stops on its own when it
cannot confirm the lease before it.

How the local deadline is derived, and why it is never later than the
database's expiry: a renewal answers with the lease's remaining length ``L``
measured by the database's clock at the statement, and that statement ran
after the holder sent it. So the lease lasts at least until
``sent + L`` in real time, where ``sent`` is the local monotonic time just
before sending. The local clock may run at a slightly different rate from the
database's (``DRIFT``, 1,000 ppm, ten times what ordinary quartz clocks and
NTP-disciplined clocks show), and stopping takes a moment, so the holder stops
at ``sent + L * (1 - DRIFT) - margin(L)``. The margin is 15 % of the lease,
at most 5 s (9 s of slack out of a 60 s lease: 5 s of margin, 4 s of a
heartbeat interval that may be late).

The local clock only ever makes a holder stop *early*. It never makes a write
acceptable: the database's clock still decides that. (A database server whose
wall clock is stepped forward expires leases early by its own judgement; the
fence holds, and the holder learns it at its next heartbeat.)
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
