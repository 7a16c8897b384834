"""The one backoff: how long to pause after ``failures`` consecutive failures.

Every retry in Ledger waits by this function -- a maintenance loop whose pass
failed, the hub reconnecting, a database call retried, the wait for the
database at start-up, the host restarting a service, the dispatcher's next
try of an intent -- each with its own base and cap.
"""

from __future__ import annotations

import random


def backoff(failures: int, *, base_s: float, cap_s: float, jitter: float = 0.5) -> float:
    """The pause after the ``failures``-th consecutive failure (1 for the first):
    ``base_s`` doubling with each failure, at most ``cap_s``, of which the top
    ``jitter`` fraction is random (0: exact; the default 0.5 is "equal jitter":
    between half and all of it). The random part keeps processes that lost the
    same server from retrying in lockstep; the fixed part keeps it from zero."""
    if base_s < 0 or cap_s < 0 or not 0 <= jitter <= 1:
        raise ValueError(f"backoff: base_s and cap_s must not be negative and jitter must be in "
                         f"[0, 1], not {base_s}, {cap_s}, {jitter}")
    # The exponent is bounded so a long outage never overflows a float.
    ceiling = min(cap_s, base_s * 2.0 ** min(max(failures - 1, 0), 64))
    return ceiling * (1 - jitter * random.random())
