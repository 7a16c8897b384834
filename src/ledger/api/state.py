"""What one server process's routes share: its options (``ApiOptions``) and
its state at ``app.state.ledger`` (``ApiState``), built by the app factory
(``ledger.api.app``) and read by the routes and the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger.api.auth import TokenTable
from ledger.api.metrics import ProcessCounters
from ledger.api.roles import RolePools
from ledger.api.throttle import AuthThrottle
from ledger.db.database import Database
from ledger.db.hub import NOTIFY_QUEUE_ALARM, Hub
from ledger.settings import Settings, default, forwarded_hosts


@dataclass(frozen=True)
class ApiOptions:
    """Tunables of one server process."""

    keepalive_s: float = default("api_keepalive_s")  # SSE comment keepalive while a stream is idle
    poll_s: float = 1.0  # a tail re-reads at least this often (NOTIFY is only a hint)
    max_body_bytes: int = default("api_max_body")
    pool_max_size: int = default("api_pool_size")  # connections per role
    ready_timeout_s: float = 5.0
    #: /readyz is degraded (and a warning logged) above this share of the
    #: server's notification queue
    notify_queue_alarm: float = NOTIFY_QUEUE_ALARM
    hub: bool = True  # LISTEN for wake-ups (else tails poll every poll_s)
    #: Signs the session cookie and keys bulk selection tokens (HMAC); unset:
    #: the cookie key is derived from the configured tokens and bulk tokens are
    #: keyed by a secret made once per database (``ledger.bulk``).
    session_secret: str | None = default("session_secret")
    secure_cookies: bool = default("secure_cookies")  # the session cookie only over HTTPS (always, not only on https)
    session_ttl_s: float = 12 * 3600  # a browser signs in again after this long
    #: Failed sign-ins or bearer checks per minute from one address, and with
    #: one credential prefix (then 429 for wrong credentials, never a valid one).
    auth_failures_per_minute: int = default("api_auth_failures_per_minute")
    #: Requests per minute of one valid token, its sessions' included (then 429).
    requests_per_minute: int = default("api_requests_per_minute")
    #: Proxies whose X-Forwarded-For / X-Forwarded-Proto are believed
    #: (``forwarded_hosts``: addresses, networks, or "*"); empty: none.
    forwarded_allow_ips: tuple[str, ...] = ()
    #: How long a bulk preview may be confirmed.
    bulk_token_ttl_s: float = default("api_bulk_token_ttl_s")
    #: A confirmed bulk action on more campaigns than this runs in the background.
    bulk_inline_max: int = 100

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> ApiOptions:
        """The options ``settings`` give, with ``overrides`` (a command's own
        options) on top: an override never drops a setting it does not name."""
        configured: dict[str, Any] = {
            "session_secret": settings.session_secret, "secure_cookies": settings.secure_cookies,
            "auth_failures_per_minute": settings.api_auth_failures_per_minute,
            "requests_per_minute": settings.api_requests_per_minute,
            "forwarded_allow_ips": forwarded_hosts(settings.forwarded_allow_ips),
            "bulk_token_ttl_s": settings.api_bulk_token_ttl_s,
        }
        return cls(**{**configured, **overrides})

    def __post_init__(self) -> None:
        if self.keepalive_s <= 0 or self.poll_s <= 0 or self.ready_timeout_s <= 0:
            raise ValueError("keepalive_s, poll_s and ready_timeout_s must be positive")
        if not 0 < self.notify_queue_alarm <= 1:
            raise ValueError("notify_queue_alarm must be a share in (0, 1]")
        if self.max_body_bytes < 1 or self.pool_max_size < 1:
            raise ValueError("max_body_bytes and pool_max_size must be positive")
        if self.session_ttl_s < 60 or self.bulk_token_ttl_s < 1 or self.bulk_inline_max < 1 \
                or self.auth_failures_per_minute < 1 or self.requests_per_minute < 1:
            raise ValueError("session_ttl_s (>= 60), bulk_token_ttl_s, bulk_inline_max, "
                             "auth_failures_per_minute and requests_per_minute must be positive")
        forwarded_hosts(",".join(self.forwarded_allow_ips))  # ValueError naming a bad entry


@dataclass
class ApiState:
    """What the routes share, at ``app.state.ledger``."""

    database: Database
    tokens: TokenTable
    options: ApiOptions
    pools: RolePools
    counters: ProcessCounters = field(default_factory=ProcessCounters)
    hub: Hub | None = None
    queue_alarmed: bool = False  # the notification queue was over the alarm at the last look
    query_names: dict[tuple[str, str], frozenset[str]] | None = None
    throttle: AuthThrottle = field(default_factory=lambda: AuthThrottle(
        default("api_auth_failures_per_minute"), default("api_requests_per_minute")))
    #: The key of bulk selection tokens (``ledger.bulk``), once known.
    bulk_key: bytes | None = None
    #: Bulk jobs running in this process, by id (``ledger.api.bulk_jobs``).
    jobs: dict[str, Any] = field(default_factory=dict)
