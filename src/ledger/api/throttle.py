"""A per-client throttle on failed authentication: sign-ins and bearer checks.

Every failure (a token that is not configured, a session that does not
exist) counts against the client's address; a client with ``limit`` failures
within ``window_s`` is answered 429 with ``Retry-After`` -- for every attempt,
right or wrong, until the oldest failure leaves the window, so guessing gains
nothing from the answer's status. Kept per server process (each process of a
deployment throttles on its own: the bound is then ``limit`` times the
number of processes), and bounded in memory: at most ``max_clients``
addresses are remembered, the least recently failing forgotten first.

Behind a reverse proxy every client has the proxy's address (``ledger
serve`` does not trust forwarded headers): the throttle then holds for the
proxy as a whole, which should throttle on its own.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque

from ledger.api.problems import TooManyRequests


class Throttle:
    """Failures per client within a sliding window."""

    def __init__(self, limit: int = 30, window_s: float = 60.0, max_clients: int = 10_000):
        if limit < 1 or window_s <= 0 or max_clients < 1:
            raise ValueError("limit, window_s and max_clients must be positive")
        self.limit = limit
        self.window_s = window_s
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def check(self, client: str) -> None:
        """``TooManyRequests`` if ``client`` failed ``limit`` times within the window."""
        failures = self._failures.get(client)
        if failures is None or len(failures) < self.limit:
            return
        wait = self.window_s - (time.monotonic() - failures[0])
        if wait > 0:
            raise TooManyRequests(
                f"too many failed authentications from this client; retry in {math.ceil(wait)} s",
                retry_after_s=math.ceil(wait))

    def fail(self, client: str) -> None:
        """Count one failed authentication of ``client``."""
        failures = self._failures.pop(client, None)
        if failures is None:
            failures = deque(maxlen=self.limit)
        failures.append(time.monotonic())
        self._failures[client] = failures  # now the most recent
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
