"""Connection and runtime settings, read from the environment (``LEDGER_*``):
every knob declared once (its variable, option, default, range and help).

The design at length: docs/internals.md (``ledger.settings``).
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger.errors import ConfigError

if TYPE_CHECKING:
    from datetime import datetime

    from pydantic import ValidationError

#: Every variable is this and the knob's name in capitals.
ENV_PREFIX = "LEDGER_"
#: The actors that connect to the database, each as its own role.
ACTORS = ("reader", "sensor", "worker", "reaper", "verifier", "dispatcher", "operator")


def check_address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; port 0: any free one) as a pair; else
    ``ValueError`` saying what is wrong."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("not HOST:PORT (e.g. 127.0.0.1:9101; port 0: any free one)")
    return host, int(port)


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


def forwarded_hosts(value: str | None) -> tuple[str, ...]:
    """The trusted proxies ``value`` names (``forwarded_allow_ips``), one entry
    each, as uvicorn's proxy-headers middleware takes them; ``ValueError``
    naming an entry that is neither an address, a network nor ``*``. (uvicorn
    itself takes any other text as a literal host name, which never matches a
    peer's address: a typo would trust nobody, silently.)"""
    import ipaddress

    hosts = tuple(item.strip() for item in (value or "").split(",") if item.strip())
    for host in hosts:
        if host == "*":
            if len(hosts) > 1:
                raise ValueError("* (any peer) stands alone, not in a list")
            continue
        try:
            # strict, as uvicorn reads it: 10.0.0.1/8 (host bits set) would trust nobody there
            ipaddress.ip_network(host) if "/" in host else ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{host!r} is neither an IP address nor a network "
                             "(its first address/prefix length, e.g. 10.0.0.0/8)") from None
    return hosts


def check_forwarded_allow_ips(value: str) -> str:
    """``value`` if ``forwarded_hosts`` can read it (else its ``ValueError``)."""
    forwarded_hosts(value)
    return value


def _user_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("ledger"))


class Knob:
    """One knob: its default, range and help; its name comes from the
    attribute it is declared as, its variable from its name. (A plain class,
    not a dataclass: ``ledger --help`` builds every knob, and a dataclass costs
    it a few milliseconds.)"""

    __slots__ = ("default", "help", "flags", "ge", "gt", "le", "lt", "pattern", "check",
                 "default_factory", "metavar", "name")

    def __init__(self, default: Any = None, help: str = "", flags: tuple[str, ...] = (), *,
                 ge: float | None = None, gt: float | None = None, le: float | None = None,
                 lt: float | None = None, pattern: str | None = None,
                 check: Callable[[Any], Any] | None = None,
                 default_factory: Callable[[], Any] | None = None, metavar: str | None = None):
        self.default = default
        self.help = help
        #: the command line's names for it (empty: no option)
        self.flags = flags
        self.ge, self.gt, self.le, self.lt = ge, gt, le, lt
        self.pattern = pattern
        #: a further check of a set value (raises ``ValueError`` saying why)
        self.check = check
        self.default_factory = default_factory
        self.metavar = metavar
        self.name = ""

    def __repr__(self) -> str:
        return f"Knob({self.name or '?'})"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @property
    def envvar(self) -> str:
        """The environment variable: derived from the name, never written out."""
        return ENV_PREFIX + self.name.upper()

    @property
    def option(self) -> str:
        """How a message names it: its first flag and its variable."""
        return f"{self.flags[0]} / {self.envvar}" if self.flags else self.envvar

    def range_text(self) -> str:
        """The range in words ("" when any value goes)."""
        words = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
        return ", ".join(f"{sign} {_number(getattr(self, attr))}" for attr, sign in words
                         if getattr(self, attr) is not None)

    def out_of_range(self, value: Any) -> str | None:
        """Why ``value`` is outside the range, or ``None`` when it is inside
        (an unset value, ``None``, always is)."""
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        low_ok = ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt))
        high_ok = ((self.le is None or value <= self.le) and (self.lt is None or value < self.lt))
        if low_ok and high_ok and value == value:  # (NaN is in no range)
            return None
        return f"must be {self.range_text().replace(', ', ' and ')}, not {_number(value)}"


def _number(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def knob(default: Any = None, help: str = "", *flags: str, **rest: Any) -> Any:
    """Declare a knob (typed as its attribute says: the declaration, like a
    dataclass field, stands for the value)."""
    return Knob(default, help, flags, **rest)


_LOG_LEVEL = "debug, info, warning or error."


class SettingKnobs:
    """Ledger's settings: read by every command from its ``LEDGER_<NAME>``
    variable (some also have a global option)."""

    database_url: str | None = knob(
        None, "Administrator connection (URL or conninfo). Unset: the embedded PostgreSQL.",
        "--database-url", check=check_database_url)
    # Per-role logins (``ledger logins create``); unset: the administrator's connection.
    reader_database_url: str | None = knob(None, "The reader role's login",
                                           check=check_database_url)
    sensor_database_url: str | None = knob(None, "The sensor role's login",
                                           check=check_database_url)
    worker_database_url: str | None = knob(None, "The worker role's login",
                                           check=check_database_url)
    verifier_database_url: str | None = knob(None, "The verifier role's login",
                                             check=check_database_url)
    dispatcher_database_url: str | None = knob(None, "The dispatcher role's login",
                                               check=check_database_url)
    operator_database_url: str | None = knob(None, "The operator role's login",
                                             check=check_database_url)
    reaper_database_url: str | None = knob(None, "The reaper's login; unset: the worker's",
                                           check=check_database_url)
    listen_database_url: str | None = knob(
        None, "Direct (unpooled) connection for LISTEN; unset: the main URL",
        check=check_database_url)
    pooled: bool | None = knob(
        None, "Connections go through a transaction pooler (no server-side prepared "
              "statements); unset: detected per connection")
    data_dir: Path = knob(None, "Where the embedded server, evidence bundles and worktrees live.",
                          "--data-dir", default_factory=_user_data_dir)
    role_prefix: str = knob("ledger_", "Prefix of Ledger's database roles (several Ledgers on "
                                       "one server).", "--role-prefix",
                            pattern=r"^[a-z][a-z0-9_]{0,30}$")
    config: Path = knob(Path("ledger.toml"), "Campaign classes and sensors (default "
                                             "./ledger.toml).", "--config")
    releases_dir: Path | None = knob(
        None, "Where earlier releases are installed to run beside this one (the upgrade "
              "drill); unset: .venv-releases in the clone")
    hub_ping_s: float = knob(
        10.0, "How often the hub proves it hears (a NOTIFY to itself); a miss reconnects it",
        gt=0, le=3600)
    # Only SHA-256 digests of tokens are configured, never the tokens themselves
    # (ledger.api.auth parses this; `ledger token create` prints an entry).
    api_tokens: str | None = knob(
        None, "HTTP API bearer tokens: name:role:sha256hex, comma-separated")
    session_secret: str | None = knob(
        None, "Signs dashboard sessions (unset: derived from the tokens)")
    secure_cookies: bool = knob(False, "Send the dashboard's session cookie over HTTPS only")
    api_auth_failures_per_minute: int = knob(
        30, "Failed sign-ins or bearer checks per minute from one client address, and with one "
            "credential prefix (a burst of this many, then 429 for wrong credentials only: a "
            "valid token or session is always served)",
        ge=1, le=100_000)
    api_requests_per_minute: int = knob(
        6000, "Requests per minute one token may make, its dashboard sessions included (a "
              "burst of this many, then 429 naming the limit)",
        ge=1, le=10_000_000)
    forwarded_allow_ips: str | None = knob(
        None, "Reverse proxies trusted to say who the client is: addresses or networks "
              "(10.0.0.0/8), comma-separated, or * for any peer. A request from one of them "
              "is taken to come from its X-Forwarded-For client (and X-Forwarded-Proto "
              "scheme); from any other peer these headers are ignored. Unset: none trusted",
        check=check_forwarded_allow_ips)
    api_bulk_token_ttl_s: float = knob(900.0, "How long a bulk preview may be confirmed",
                                       ge=1, le=86_400)
    api_request_timeout_s: float = knob(
        15.0, "A request (headers and body) must arrive whole within this (slow clients)",
        gt=0, le=3600)
    api_max_connections: int = knob(
        500, "Connections and requests one server process takes at once (then 503)",
        ge=1, le=100_000)


class OptionKnobs:
    """Options of the commands that take them; each is also read from its
    ``LEDGER_<NAME>`` variable, by those commands only."""

    json: bool = knob(False, "Print JSON for machines (`ledger tail`: one object per line; "
                              "`ledger drill`: the report, the narration then on stderr).", "--json")
    log_level: str = knob("info", _LOG_LEVEL, "--log-level")
    # the long-running services
    listen: bool = knob(True, "Wake on LISTEN/NOTIFY (needs a direct connection, not a "
                              "transaction pooler); without it, poll only.", "--listen/--no-listen")
    wait_for_database_s: float = knob(
        600.0, "At start-up, wait this long for an unreachable or starting database (retrying, "
               "a log line per try) before exiting with 69.", "--wait-for-database", ge=0,
        le=86_400, metavar="SECONDS")
    wait_for_start_s: float | None = knob(
        None, "At start-up, how long to wait, not ready, for a cause of the host or the "
              "configuration to go (no sandbox, a bad ledger.toml, a repository that is not "
              "there, a refused role login, a schema not yet migrated): said once, re-checked "
              "with backoff; then exit with the cause's code. Unset: as long as it takes; 0: "
              "exit at once.", "--wait-for-start", ge=0, le=31_536_000, metavar="SECONDS")
    health: str | None = knob(
        None, "HOST:PORT where a long-running service answers /livez and /readyz (503 with the "
              "reason while it waits to start). Unset: nowhere.", "--health", metavar="HOST:PORT")
    poll_s: float = knob(5.0, "Seconds between polls when nothing wakes the service (each part "
                              "of `ledger run`).", "--poll", ge=0.01, le=3600)
    concurrency: int = knob(1, "Attempts in flight at once.", "--concurrency", "-c", ge=1,
                            le=1000)
    workers: int = knob(2, "Attempts in flight at once.", "--workers", "-w", ge=1, le=1000)
    drain_timeout_s: float = knob(30.0, "On SIGTERM, how long in-flight attempts may finish.",
                                  "--drain-timeout", ge=0, le=86_400)
    reaper_grace_s: float = knob(5.0, "Reaper grace past a lease's expiry.", "--grace", ge=0,
                                 le=3600)
    model_family: str = knob("none", "The model family the verifier runs on (recorded with "
                                     "every verdict).", "--model-family")
    verification_lease_s: float = knob(
        30.0, "Verification lease: how soon another verifier may take over if this one dies "
              "(heartbeated every third of it).", "--lease",
        ge=0.1, le=86_400)
    dispatcher_lease_s: float = knob(
        60.0, "Claim lease per intent; another dispatcher may take over (reading back first) "
              "once it lapses.", "--lease", ge=0.1, le=86_400)
    trim_after: str | None = knob(
        None, "Also trim journal deltas (output, progress) of campaigns closed longer ago than "
              "this (90s, 30m, 24h, 7d), hourly.", "--trim-after", metavar="DURATION")
    create_database: bool = knob(
        False, "Create the database the URL names if the server lacks it (the URL's user needs "
               "CREATEDB).", "--create-database")
    migrate_lock_timeout_s: float = knob(
        5.0, "How long one revision waits for a table lock before it gives way (rolled back, so "
             "the work queued behind it goes on) and is tried again.", "--lock-timeout",
        ge=0.1, le=3600)
    migrate_lock_retries: int = knob(3, "How many times a revision that gave way is tried again.",
                                     "--lock-retries", ge=0, le=100)
    # the HTTP API and the MCP server
    api_host: str = knob("127.0.0.1", "Address to listen on.", "--host")
    api_port: int = knob(8080, "Port to listen on.", "--port", ge=0, le=65535)
    api_keepalive_s: float = knob(15.0, "Seconds between keepalive comments on idle event "
                                        "streams.", "--keepalive", ge=0.01, le=3600)
    api_max_body: int = knob(1024 * 1024, "Largest request body, in bytes.", "--max-body", ge=1,
                             le=1024 ** 3)
    api_pool_size: int = knob(10, "Database connections per role.", "--pool-size", ge=1, le=100)
    token_name: str | None = knob(None, "Name recorded as http:<name> in the journal (default: "
                                        "<role>-<random>).", "--name")
    mcp_transport: str = knob(
        "stdio", "stdio (one agent host; the token is LEDGER_MCP_TOKEN) or http (streamable "
                 "HTTP on /mcp; each request its own bearer token).", "--transport")
    mcp_host: str = knob("127.0.0.1", "Address to listen on (http).", "--host")
    mcp_port: int = knob(8090, "Port to listen on (http).", "--port", ge=0, le=65535)
    mcp_pool_size: int = knob(5, "Database connections per role.", "--pool-size", ge=1, le=100)
    # campaigns
    open_priority: int = knob(0, "Higher is claimed first (-1000000 to 1000000).", "--priority",
                              ge=-1_000_000, le=1_000_000)
    open_label: list[str] = knob(None, "Labels (repeatable; space-separated in the variable).",
                                 "--label", default_factory=list)
    list_state: list[str] = knob(None, "Filter by state (repeatable).", "--state",
                                 default_factory=list)
    list_class: list[str] = knob(None, "Filter by class (repeatable).", "--class",
                                 default_factory=list)
    list_target: str | None = knob(None, "Filter by target.", "--target")
    list_objective: str | None = knob(None, "Filter by objective key.", "--objective")
    list_label: str | None = knob(None, "Filter by label.", "--label")
    list_updated_since: datetime | None = knob(
        None, "Only campaigns changed since (ISO time, UTC if no zone).", "--updated-since")
    list_search: str | None = knob(None, "Only objective keys containing this text.", "--search")
    list_limit: int = knob(50, "Page size.", "--limit", ge=1, le=1000)
    list_cursor: str | None = knob(
        None, "Continue after this cursor (printed on stderr when there is a next page; the "
              "API's next_cursor works too).", "--cursor")
    status_expiring_within: float = knob(60.0, "Show leases that end within this many seconds.",
                                         "--expiring-within", ge=0, le=10 ** 9, metavar="SECONDS")
    abandon_reason: str = knob("abandoned by operator", "Why (kept in the journal).", "--reason")
    reopen_extra_attempts: int | None = knob(None, "Attempts to add (default: the class's).",
                                             "--extra-attempts", ge=1, le=1_000_000)
    report_days: int = knob(7, "How many UTC days, today included.", "--days", ge=1, le=366)
    # approvals (docs/approval.md)
    approve_reason: str | None = knob(None, "Why (kept in the journal with your identity).", "--reason")
    deny_reason: str | None = knob(None, "Why (required: the next attempt is told it as a rejection).",
                                   "--reason")
    deny_abandon: bool = knob(False, "Abandon the campaign rather than send it back to be attempted.",
                              "--abandon")
    approvals_class: str | None = knob(None, "Only this class's.", "--class")
    approvals_limit: int = knob(100, "At most this many, oldest first.", "--limit", ge=1, le=1000)
    # limits (docs/limits.md); the database checks every figure's range
    limit_max_leased: int | None = knob(None, "Campaigns under the key leased at once (unset: no cap).",
                                        "--max-leased")
    limit_max_verifying: int | None = knob(None, "Campaigns under the key in verification at once "
                                                 "(unset: no cap).", "--max-verifying")
    limit_max_cost_per_day: float | None = knob(None, "Cost reported under the key per UTC day "
                                                      "(unset: no budget).", "--max-cost-per-day")
    limit_weight: int = knob(1, "The key's share of claims among the keys of a class.", "--weight")
    bucket_requests_per_minute: float | None = knob(None, "Attempts started per minute (unset: not "
                                                          "limited).", "--requests-per-minute")
    bucket_tokens_per_minute: float | None = knob(None, "Tokens reported per minute (unset: not "
                                                        "limited).", "--tokens-per-minute")
    budget_max_cost: float = knob(0.0, "The campaign's new budget (above what it spent).", "--max-cost")
    budget_reason: str | None = knob(None, "Why (kept in the journal with your identity).", "--reason")
    # the demo and the drills
    demo_ui: bool = knob(False, "Also serve the dashboard (prints its URL and a token), and keep "
                                "serving it after the loop closes, until Ctrl-C.", "--ui")
    demo_ui_port: int = knob(0, "The dashboard's port (0: any free one).", "--ui-port", ge=0,
                             le=65535)
    demo_require_sandbox: bool = knob(
        False, "Refuse (exit 78) where no cell can be built, instead of running the demo's own "
               "scripted agent and checks outside one.", "--require-sandbox")
    drill_report: Path | None = knob(None, "Write a JSON report here.", "--report")
    drill_scale: float = knob(1.0, "Size of the load drill (CI runs it at 0.1).", "--scale",
                              ge=0.01, le=10)
    drill_minutes: float | None = knob(
        None, "How long the chaos drill injects faults (default: 2 minutes x --scale).",
        "--minutes", ge=0.1, le=1440)


class EnvironmentKnobs:
    """Variables without an option, read where they are used (``environment``)."""

    debug: str | None = knob(None, "Set (to anything): a failing command prints its traceback "
                                   "as well as its one line, for a bug report.")
    tables: str | None = knob(None, "`tsv` or `rich`: force plain tab-separated tables or drawn "
                                    "ones (default: drawn on a terminal, TSV anywhere else).")
    mcp_token: str | None = knob(None, "`ledger mcp` over stdio: the bearer token whose role the "
                                       "agent's session acts as.")
    git_config: str | None = knob(
        None, "A git configuration file of the operator's that Ledger's own git reads instead "
              "of the user's (credentials, transport settings); its program-valued keys are "
              "still overridden (`ledger.git.hardened_git`).")
    git_credential_helper: str | None = knob(
        None, "The credential helper Ledger's own git uses for remotes (as git writes one: "
              "`store --file=...`); never given to attempt commands.")
    fault_points: str | None = knob(
        None, "Fault injection for drills and tests (`ledger.ops.faults`): which armed fault points "
              "fire, comma-separated. Never set in production.")
    fault_dir: str | None = knob(None, "Fault injection for drills and tests: where armed fault "
                                       "points keep their state (default: the working directory).")
    patroni_pg_bin: str | None = knob(
        None, "The Patroni drill and test: where the PostgreSQL binaries its members run are "
              "(default: Debian's PostgreSQL 15).")


def _knobs(owner: type) -> dict[str, Knob]:
    return {name: value for name, value in vars(owner).items() if isinstance(value, Knob)}


#: Every knob of each kind, by name.
SETTINGS = _knobs(SettingKnobs)
OPTIONS = _knobs(OptionKnobs)
ENVIRONMENT = _knobs(EnvironmentKnobs)
#: Every knob, by name (a name is one knob: one variable).
KNOBS = {**SETTINGS, **OPTIONS, **ENVIRONMENT}
assert len(KNOBS) == len(SETTINGS) + len(OPTIONS) + len(ENVIRONMENT), "a knob declared twice"


def default(name: str) -> Any:
    """The knob ``name``'s default: what a service's options start from."""
    knob = KNOBS[name]
    return knob.default_factory() if knob.default_factory is not None else knob.default


def environment(name: str) -> str | None:
    """The value of the ``EnvironmentKnobs`` knob ``name`` now (``None``: unset or empty)."""
    return os.environ.get(ENVIRONMENT[name].envvar) or None


def inherited_environment() -> Mapping[str, str]:
    """This process's environment, for what is not configuration: the
    environment a child process starts from, a terminal's ``COLUMNS``, the
    ``PATH`` a program is looked up on. Ledger's own knobs are read through
    ``Settings``, the options and ``environment``, never from this."""
    return os.environ


def settings_error(exc: ValidationError) -> ConfigError:
    """A settings validation error as one line naming the variable (and option)."""
    first = exc.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else ""
    knob = SETTINGS.get(name)
    where = ENV_PREFIX + name.upper() + (f" / {knob.flags[0]}" if knob and knob.flags else "")
    message = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return ConfigError(f"{where}: {message}{more}")


def role_urls(settings: Settings) -> dict[str, str]:
    """Per-role logins that were configured, by actor (``Settings.role_urls``)."""
    urls = {actor: getattr(settings, f"{actor}_database_url", None) for actor in ACTORS}
    if urls.get("reaper") is None and urls.get("worker"):
        urls["reaper"] = urls["worker"]
    return {actor: url for actor, url in urls.items() if url}


def _build_settings() -> type:
    """The pydantic model of ``SettingKnobs`` (see ``Settings``)."""
    from pydantic import Field, field_validator
    from pydantic_settings import BaseSettings, SettingsConfigDict

    hints = typing.get_type_hints(SettingKnobs)
    checks: dict[Callable[[Any], Any], list[str]] = {}
    namespace: dict[str, Any] = {
        "__module__": __name__, "__qualname__": "Settings", "__doc__": SettingKnobs.__doc__,
        "__annotations__": {name: hints[name] for name in SETTINGS},
        "model_config": SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore"),
        "role_urls": role_urls,
    }
    for name, k in SETTINGS.items():
        if k.check is not None:
            checks.setdefault(k.check, []).append(name)
        default = ({"default_factory": k.default_factory} if k.default_factory is not None
                   else {"default": k.default})
        namespace[name] = Field(**default, ge=k.ge, gt=k.gt, le=k.le, lt=k.lt, pattern=k.pattern,
                                description=k.help)

    def validator(check: Callable[[Any], Any]) -> Any:
        return lambda cls, value: None if value is None else check(value)

    # one validator per check, over every field it checks
    for i, (check, names) in enumerate(checks.items()):
        namespace[f"_check_{i}"] = field_validator(*names)(classmethod(validator(check)))
    # the class statement's equivalent: one model, built once
    metaclass: Any = type(BaseSettings)
    model: type = metaclass("Settings", (BaseSettings,), namespace)
    return model


if TYPE_CHECKING:
    class Settings(SettingKnobs):
        """The settings (a pydantic model of ``SettingKnobs``, built on first use)."""

        model_fields: typing.ClassVar[dict[str, Any]]

        def __init__(self, **values: Any) -> None: ...

        def role_urls(self) -> dict[str, str]: ...
else:
    def __getattr__(name: str) -> Any:
        if name == "Settings":
            return _settings_model()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@lru_cache(maxsize=1)
def _settings_model() -> type:
    return _build_settings()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings (read once)."""
    try:
        return _settings_model()()  # type: ignore[no-any-return]
    except Exception as exc:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):  # one line naming the variable, never the value
            raise settings_error(exc) from None
        raise
