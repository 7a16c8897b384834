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
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigError

#: The actors that connect to the database, each as its own role.
ACTORS = ("reader", "sensor", "worker", "reaper", "verifier", "dispatcher", "operator")
#: Settings that are also global options of the ``ledger`` command.
OPTIONS = {"database_url": "--database-url", "data_dir": "--data-dir", "role_prefix": "--role-prefix"}


def check_database_url(value: str) -> str:
    """``value`` if libpq can use it as a PostgreSQL URL or conninfo string;
    else ``ValueError`` saying what is wrong -- without repeating the value,
    which may hold a password."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    scheme, sep, _ = value.partition("://")
    if sep and scheme not in ("postgresql", "postgres"):
        driver = scheme.partition("+")
        hint = (f" (a SQLAlchemy URL? drop the +{driver[2]})"
                if driver[1] and driver[0] in ("postgresql", "postgres") else "")
        raise ValueError(f"not a PostgreSQL URL: it starts {scheme}://, not postgresql:// "
                         f"or postgres://{hint}")
    try:
        params = conninfo_to_dict(value)
    except ProgrammingError:
        raise ValueError("neither a postgresql:// URL nor a key=value conninfo string") from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"port {port!r} is not a number from 1 to 65535")
    return value


def settings_error(exc: ValidationError) -> ConfigError:
    """A settings validation error as one line naming the variable (and option)."""
    first = exc.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    where = f"LEDGER_{field.upper()}" + (f" / {OPTIONS[field]}" if field in OPTIONS else "")
    message = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return ConfigError(f"{where}: {message}{more}")


class Settings(BaseSettings):
    """Ledger's settings; every field is ``LEDGER_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="LEDGER_", extra="ignore")

    database_url: str | None = Field(
        default=None, description="Administrator connection (URL or conninfo); unset: embedded"
    )
    # Per-role logins (``ledger logins create``); unset: the administrator's connection.
    reader_database_url: str | None = Field(default=None, description="The reader role's login")
    sensor_database_url: str | None = Field(default=None, description="The sensor role's login")
    worker_database_url: str | None = Field(default=None, description="The worker role's login")
    verifier_database_url: str | None = Field(default=None,
                                              description="The verifier role's login")
    dispatcher_database_url: str | None = Field(default=None,
                                                description="The dispatcher role's login")
    operator_database_url: str | None = Field(default=None,
                                              description="The operator role's login")
    reaper_database_url: str | None = Field(default=None,
                                            description="The reaper's login; unset: the worker's")
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
    role_prefix: str = Field(default="ledger_", pattern=r"^[a-z][a-z0-9_]{0,30}$",
                             description="Prefix of Ledger's database roles (several Ledgers on "
                                         "one server)")
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

    @field_validator("database_url", "reader_database_url", "sensor_database_url",
                     "worker_database_url", "verifier_database_url", "dispatcher_database_url",
                     "operator_database_url", "reaper_database_url", "listen_database_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_database_url(value)

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
