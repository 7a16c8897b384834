"""Connection and runtime settings, read from the environment (``LEDGER_*``).

``LEDGER_DATABASE_URL`` names the database and the administrator that migrates
it. When it is unset, Ledger runs an embedded PostgreSQL 18 in
``LEDGER_DATA_DIR`` (default: the user's data directory) and uses that; a second
process finds the same running server.

Each runtime role's statements run as that role: every transaction starts by
setting its role (``SET LOCAL ROLE``), on the administrator's connection unless
the role has its own login: ``LEDGER_WORKER_DATABASE_URL``,
``LEDGER_VERIFIER_DATABASE_URL`` and so on (the login must be a member of the
role; ``ledger logins create`` makes them). ``LEDGER_REAPER_DATABASE_URL``
defaults to the worker's login.

Behind a transaction pooler (PgBouncer ``pool_mode=transaction``) nothing
session-level survives between transactions, so Ledger keeps none: the role and
limits are per transaction, and with ``LEDGER_POOLED=true`` (or when a pooler is
detected: the server's process id differs from the one the connection was
given) no server-side prepared statements are used. LISTEN needs a session of
its own: ``LEDGER_LISTEN_DATABASE_URL`` names a direct connection for it
(default: the main URL).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The actors that connect to the database, each as its own role.
ACTORS = ("reader", "sensor", "worker", "reaper", "verifier", "dispatcher", "operator")


class Settings(BaseSettings):
    """Ledger's settings; every field is ``LEDGER_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="LEDGER_", extra="ignore")

    database_url: str | None = Field(
        default=None, description="Administrator connection (URL or conninfo); unset: embedded"
    )
    reader_database_url: str | None = None
    sensor_database_url: str | None = None
    worker_database_url: str | None = None
    verifier_database_url: str | None = None
    dispatcher_database_url: str | None = None
    operator_database_url: str | None = None
    reaper_database_url: str | None = None
    listen_database_url: str | None = Field(
        default=None, description="Direct (unpooled) connection for LISTEN; unset: the main URL")
    pooled: bool | None = Field(
        default=None,
        description="Connections go through a transaction pooler (no server-side prepared "
                    "statements); unset: detected per connection")
    data_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_data_dir("ledger")),
        description="Where the embedded server, evidence bundles and worktrees live",
    )
    role_prefix: str = Field(default="ledger_", pattern=r"^[a-z][a-z0-9_]{0,30}$")
    config: Path = Field(default=Path("ledger.toml"), description="Campaign classes and sensors")
    hub_ping_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="How often the hub proves it hears (a NOTIFY to itself); a miss reconnects it")
    # Only SHA-256 digests of tokens are configured, never the tokens themselves
    # (ledger.api.auth parses this; `ledger token create` prints an entry).
    api_tokens: str | None = Field(
        default=None, description="HTTP API bearer tokens: name:role:sha256hex, comma-separated"
    )
    session_secret: str | None = Field(
        default=None, description="Signs dashboard sessions (unset: derived from the tokens)")
    secure_cookies: bool = Field(
        default=False, description="Send the dashboard's session cookie over HTTPS only")
    api_auth_failures_per_minute: int = Field(
        default=30, ge=1, le=100_000,
        description="Failed sign-ins or bearer checks one client may make per minute (then 429)")
    api_bulk_token_ttl_s: float = Field(
        default=900.0, ge=1, le=86_400, description="How long a bulk preview may be confirmed")
    api_request_timeout_s: float = Field(
        default=15.0, gt=0, le=3600,
        description="A request (headers and body) must arrive whole within this (slow clients)")
    api_max_connections: int = Field(
        default=500, ge=1, le=100_000,
        description="Connections and requests one server process takes at once (then 503)")

    def role_urls(self) -> dict[str, str]:
        """Per-role logins that were configured, by actor."""
        urls = {actor: getattr(self, f"{actor}_database_url", None) for actor in ACTORS}
        if urls.get("reaper") is None and urls.get("worker"):
            urls["reaper"] = urls["worker"]
        return {actor: url for actor, url in urls.items() if url}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings (read once)."""
    return Settings()
