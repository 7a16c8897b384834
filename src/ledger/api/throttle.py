"""The HTTP API's throttles: failed authentications, and each credential's requests.

The design at length: docs/internals.md (``ledger.api.throttle``).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Hashable

from ledger.api.problems import TooManyRequests
from ledger.settings import SETTINGS

#: How much of a wrong credential keys its throttle: ``ldg_`` and 8 random
#: characters (48 bits: two real tokens share them by chance practically never).
PREFIX_CHARS = 12
#: The names a 429 gives its limit (the problem's ``limit`` member).
ADDRESS_LIMIT = "auth-failures-per-address"
PREFIX_LIMIT = "auth-failures-per-credential"
CREDENTIAL_LIMIT = "requests-per-credential"
# slack for the float arithmetic of window_s / limit * limit
_EPSILON_S = 1e-9


class Throttle:
    """At most ``limit`` events a key within ``window_s``; bounded memory."""

    def __init__(self, limit: int, window_s: float = 60.0, max_keys: int = 100_000):
        if limit < 1 or not window_s > 0 or max_keys < 1:
            raise ValueError("limit, window_s and max_keys must be positive")
        self.limit = limit
        self.window_s = window_s
        self.max_keys = max_keys
        self._interval = window_s / limit
        # key -> the instant its allowance is whole again, least recently counted first
        self._full_at: OrderedDict[Hashable, float] = OrderedDict()

    def wait_s(self, key: Hashable) -> float:
        """Seconds until ``key`` may have another event (0: now)."""
        full_at = self._full_at.get(key)
        if full_at is None:
            return 0.0
        wait = full_at + self._interval - self.window_s - time.monotonic()
        return wait if wait > _EPSILON_S else 0.0

    def count(self, key: Hashable) -> None:
        """Count one event of ``key`` (allowed or not: the caller asked ``wait_s``)."""
        now = time.monotonic()
        full_at = max(self._full_at.pop(key, now), now) + self._interval
        self._full_at[key] = full_at  # now the most recent
        while len(self._full_at) > self.max_keys:
            self._full_at.popitem(last=False)

    def take(self, key: Hashable) -> float:
        """Count an event of ``key`` if it may have one now and return 0; else
        how long it must wait (a refused event is not counted)."""
        wait = self.wait_s(key)
        if wait == 0.0:
            self.count(key)
        return wait

    def __len__(self) -> int:
        return len(self._full_at)


def address_key(host: str) -> str:
    """What the failure throttle counts a client address as: an IPv4 address
    itself, an IPv6 one by its /64 (a host is given a whole /64), anything
    else (a Unix socket's peer) as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def credential_prefix(credential: str) -> str:
    """What the failure throttle counts a wrong credential as."""
    return credential[:PREFIX_CHARS]


def _refusal(throttle: Throttle, knob: str, what: str, wait: float, limit: str) -> TooManyRequests:
    seconds = max(1, math.ceil(wait))
    window = "a minute" if throttle.window_s == 60 else f"{throttle.window_s:g} s"
    return TooManyRequests(f"{what}: more than {throttle.limit} in {window} "
                           f"({SETTINGS[knob].envvar}); retry in {seconds} s",
                           retry_after_s=seconds, limit=limit)


class AuthThrottle:
    """The failure throttle (per address, per credential prefix) and the
    per-credential request limit of one server process."""

    def __init__(self, failures: int, requests: int, window_s: float = 60.0,
                 max_keys: int = 100_000):
        """At most ``failures`` failed authentications per address and per
        prefix, and ``requests`` requests per token, within ``window_s``."""
        # Two tables, not one: a sender of made-up prefixes must not push the
        # addresses it is counted by out of memory.
        self.addresses = Throttle(failures, window_s, max_keys)
        self.prefixes = Throttle(failures, window_s, max_keys)
        self.credentials = Throttle(requests, window_s, max_keys)

    def failed(self, address: str, credential: str) -> None:
        """After ``credential`` from ``address`` was found not valid:
        ``TooManyRequests`` naming the limit if the address or the
        credential's prefix failed too often (not counted: the window drains
        while a client keeps trying), else count the failure against both."""
        where, prefix = address_key(address), credential_prefix(credential)
        by_address, by_prefix = self.addresses.wait_s(where), self.prefixes.wait_s(prefix)
        knob = "api_auth_failures_per_minute"
        if by_address and by_address >= by_prefix:
            raise _refusal(self.addresses, knob, "failed authentications from this address "
                           "(a valid credential is served meanwhile)", by_address, ADDRESS_LIMIT)
        if by_prefix:
            raise _refusal(self.prefixes, knob, "failed authentications with a credential "
                           "starting like this one", by_prefix, PREFIX_LIMIT)
        self.addresses.count(where)
        self.prefixes.count(prefix)

    def admit(self, token_name: str) -> None:
        """Count a request of the valid token ``token_name``; ``TooManyRequests``
        naming the limit (and not counted) if it made too many."""
        wait = self.credentials.take(token_name)
        if wait:
            raise _refusal(self.credentials, "api_requests_per_minute",
                           f"requests by token {token_name!r}", wait, CREDENTIAL_LIMIT)
