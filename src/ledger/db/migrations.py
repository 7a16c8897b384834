"""Schema migrations: the history of the schema, and how it is applied.

Two things live apart (CONTRIBUTING.md, "Working on the schema"):

- ``src/ledger/db/sql/`` is the schema as it is now, one file per concern,
  applied in ``SCHEMA_FILES`` order: the readable source, never run in
  production by itself.
- ``migrations/`` is the history: one Alembic revision per change, each with
  its SQL frozen in ``migrations/sql/<revision>/`` -- ``before.sql`` (what
  alters existing tables), ``schema/`` (copies of the schema files as the
  revision left them, applied after), ``after.sql`` and, where it can be
  undone, ``down.sql``. A released revision never changes:
  ``migrations/released.txt`` holds a digest of each, checked by
  tests/test_upgrade.py, which also holds a database built by the history
  equal to one built from the files.

``upgrade`` runs each pending revision in a transaction of its own under a
session advisory lock (two processes migrating at once: the second waits,
then finds nothing to do), with a lock timeout: a revision that cannot get
its lock within ``lock_timeout_s`` is rolled back -- so the workers queued
behind it go on -- and tried again, up to ``lock_retries`` times; a revision
that fails leaves the database at the last one that succeeded. Every run
ends with the privilege self-check (``finish``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, LiteralString

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from ledger.errors import CodeTooOld, LedgerError, MigrationFailed, Unavailable, from_sqlstate
from ledger.release import RELEASE, SCHEMA, describe

#: Key of the advisory lock that serialises migrations of one database.
MIGRATION_LOCK = 0x4C45444745520001  # "LEDGER" 0001

#: How long one revision waits for a table lock before it gives way.
LOCK_TIMEOUT_S = 5.0
#: How many times a revision that gave way is tried again.
LOCK_RETRIES = 3

#: The schema files in apply order. Each may be applied again (every statement
#: in them is idempotent: IF NOT EXISTS, OR REPLACE, ON CONFLICT DO NOTHING).
SCHEMA_FILES: tuple[str, ...] = (
    "roles.sql",            # roles and the two schemas (run as the administrator)
    "meta_and_clock.sql",   # settings, role names, ledger.now()
    "state_machine.sql",    # states, actors, transitions; begin/end_transition
    "campaign.sql",         # classes, campaigns, their indexes, guard and journal triggers
    "journal.sql",          # campaign_event: append-only, notify, append_event
    "attempt.sql",
    "observation.sql",
    "verification.sql",
    "outbox.sql",           # side_effect
    "merge_queue.sql",      # promotions waiting in order per target; merge batches
    "approval.sql",         # approval before promotion: the approvals, their invariants
    "limits.sql",           # caps per key, rate buckets, usage and budgets
    "security_event.sql",
    "web.sql",              # browser sessions, bulk jobs
    "class_event.sql",      # what operators did to a class (pause, resume)
    "sensor_tick.sql",
    "api_helpers.sql",      # internal helpers the role APIs share
    "api_sensor.sql",
    "api_worker.sql",
    "api_reaper.sql",
    "api_verifier.sql",
    "api_dispatcher.sql",
    "api_operator.sql",
    "process.sql",          # the registry of live processes, one report function per role
    "compatibility.sql",    # which code may use this schema (ledger_api.hello)
    "views.sql",
    "grants.sql",           # the function -> role table, and the self-check
)

#: Files run as the administrator; all others run as the owner role.
ADMIN_FILES = frozenset({"roles.sql"})


def migrations_dir() -> Path:
    """The migrations directory: packaged in a wheel, or at the repository top."""
    packaged = Path(__file__).parent.parent / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "migrations"


def schema_dir() -> Path:
    """The folder of the schema files (inside the package, so a wheel has it)."""
    return Path(__file__).parent / "sql"


def engine_for(url: str) -> Engine:
    """A SQLAlchemy engine over psycopg for ``url`` (a URL or a conninfo string)."""
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url),
                         poolclass=NullPool)


@dataclass
class Run:
    """What one ``upgrade`` or ``downgrade`` asks of env.py, and what it saw."""

    url: str
    role_prefix: str
    lock_timeout_s: float = LOCK_TIMEOUT_S
    #: called with each revision as it starts and as it is done
    progress: Callable[[str, str], None] | None = None
    #: revisions applied (or undone) by this run, in order
    done: list[str] = field(default_factory=list)
    #: the revision being applied when the run stopped
    running: str | None = None


def alembic_config(url: str, role_prefix: str, run: Run | None = None) -> Config:
    """An Alembic config for ``url``; env.py reads the run from it."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["ledger_run"] = run or Run(url, role_prefix)
    return cfg


def _script() -> ScriptDirectory:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return ScriptDirectory.from_config(cfg)


def upgrade(url: str, role_prefix: str = "ledger_", revision: str = "head", *,
            lock_timeout_s: float = LOCK_TIMEOUT_S, lock_retries: int = LOCK_RETRIES,
            progress: Callable[[str, str], None] | None = None) -> list[str]:
    """Bring the schema up to ``revision`` (idempotent), then re-apply the
    database-level privileges (see ``secure_database``). Returns the
    revisions applied, in order.

    A revision that waits longer than ``lock_timeout_s`` for a lock is rolled
    back and tried again after a pause, ``lock_retries`` times; then
    ``MigrationFailed`` names what held the lock."""
    applied: list[str] = []
    for attempt in range(lock_retries + 1):
        run = Run(url, role_prefix, lock_timeout_s, progress)
        try:
            _run(command.upgrade, run, revision)
            applied += run.done
            break
        except _LockTimeout as exc:
            applied += run.done
            if attempt == lock_retries:
                raise MigrationFailed(
                    f"revision {exc.revision} waited {lock_timeout_s:g}s for a lock "
                    f"{lock_retries + 1} time(s) and gave way each time: {exc.holder}; "
                    f"nothing of it applied, the database stays at {describe(current(url))}",
                    hint="end that transaction, or run `ledger migrate` again with a longer "
                         "--lock-timeout") from None
            if progress:
                progress(exc.revision, f"gave way after {lock_timeout_s:g}s waiting for a lock "
                                       f"({exc.holder}); trying again")
            time.sleep(min(1.0 * (attempt + 1), 5.0))
    secure_database(url)
    return applied


def secure_database(url: str) -> None:
    """Re-apply what a database copied from a template lacks (no TEMPORARY for PUBLIC)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if _scalar(conn, "SELECT to_regprocedure('ledger.secure_database()') IS NOT NULL"):
            # Two processes migrating at once would update the database's ACL
            # together ("tuple concurrently updated"): one at a time.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('ledger.secure_database'))")
                conn.execute("SELECT ledger.secure_database()")


def downgrade(url: str, role_prefix: str = "ledger_", revision: str = "base") -> list[str]:
    """Take the schema down to ``revision``: ``base`` drops Ledger's schemas
    (roles stay: they are cluster-wide); another revision undoes the ones
    after it, each by its ``down.sql``, and refuses at the first that has none."""
    run = Run(url, role_prefix)
    if revision == "base":
        _drop_everything(url, role_prefix)
        return ["base"]
    _run(command.downgrade, run, revision)
    return run.done


def _drop_everything(url: str, role_prefix: str) -> None:
    """The baseline's ``down.sql`` and no migration record, under the lock."""
    with psycopg.connect(url) as conn:
        prepare(conn, role_prefix)
        _execute(conn, (migrations_dir() / "sql" / "0001_baseline" / "down.sql").read_text(),
                 as_owner=False)
        conn.execute("DROP TABLE IF EXISTS public.alembic_version")


#: The run env.py is carrying out (one at a time per process: Alembic's own
#: context is a module global too).
active: Run | None = None


def _starting(revision: str, what: str) -> None:
    if active is not None:
        active.running = revision
        if active.progress:
            active.progress(revision, what)


def step_done(revision: str) -> None:
    """Called by env.py as each revision's transaction commits."""
    if active is not None:
        active.done.append(revision)
        active.running = None
        if active.progress:
            active.progress(revision, "done")


class _LockTimeout(Exception):
    def __init__(self, revision: str, holder: str):
        super().__init__(revision)
        self.revision = revision
        self.holder = holder


def _run(fn: Callable[..., Any], run: Run, revision: str) -> None:
    try:
        fn(alembic_config(run.url, run.role_prefix, run), revision)
    except psycopg.OperationalError as exc:
        if exc.sqlstate == "55P03" and run.running:  # lock_not_available: lock_timeout
            raise _LockTimeout(run.running, lock_holders(run.url)) from None
        if exc.sqlstate is None or exc.sqlstate.startswith("08"):
            raise Unavailable(f"cannot reach the database to migrate: {_first_line(exc)}") from exc
        raise _failed(run, exc) from exc
    except psycopg.Error as exc:
        raise _failed(run, exc) from exc
    except CommandError as exc:
        at = current(run.url)
        if at is not None and at not in known_revisions():
            raise CodeTooOld(
                f"cannot migrate: the database is at schema {at}, which Ledger {RELEASE} "
                f"(schema {SCHEMA}) does not know", hint="migrate with the Ledger that made it, "
                "or a newer one") from None
        raise LedgerError(f"cannot migrate: {exc}") from exc


def _failed(run: Run, exc: psycopg.Error) -> LedgerError:
    message = exc.diag.message_primary or _first_line(exc)
    if run.running is None:
        # e.g. the privilege self-check (LG009) after the revisions
        return from_sqlstate(exc.sqlstate, f"migration failed: {message}")
    return MigrationFailed(
        f"revision {run.running} failed: {message}; nothing of it applied, the database stays "
        f"at {describe(current(run.url))}", sqlstate=exc.sqlstate)


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def lock_holders(url: str) -> str:
    """Who holds locks on Ledger's tables now: the longest-open transaction
    first (pid, application, state, for how long), for a message."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute("""
                SELECT a.pid, a.application_name, a.state,
                       extract(epoch FROM now() - a.xact_start)::int AS open_s
                  FROM pg_stat_activity a
                 WHERE a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL
                   AND EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                                JOIN pg_namespace n ON n.oid = c.relnamespace
                               WHERE l.pid = a.pid AND l.granted
                                 AND n.nspname IN ('ledger', 'ledger_api'))
                 ORDER BY a.xact_start LIMIT 3""").fetchall()
    except psycopg.Error:
        return "the holder could not be read"
    if not rows:
        return "no transaction holds one now"
    return "; ".join(f"pid {pid} ({app or 'no application name'}, {state}, open {open_s}s)"
                     for pid, app, state, open_s in rows)


def current(url: str) -> str | None:
    """The revision the database is at (``None``: never migrated)."""
    engine = engine_for(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision this code knows."""
    revision = _script().get_current_head()
    assert revision is not None
    return revision


def known_revisions() -> set[str]:
    """Every revision this code knows."""
    return {script.revision for script in _script().walk_revisions()}


def history() -> list[str]:
    """Every revision this code knows, oldest first."""
    return [script.revision for script in _script().walk_revisions()][::-1]


@dataclass(frozen=True)
class Pending:
    """A revision ``upgrade`` would apply: its id, what it says of itself and its SQL."""

    revision: str
    doc: str
    sql: str


def pending(url: str, revision: str = "head") -> list[Pending]:
    """The revisions an ``upgrade`` to ``revision`` would apply, in order, with
    the SQL each would run (``ledger migrate --dry-run``)."""
    at = current(url)
    script = _script()
    target = script.get_revision(revision)
    assert target is not None
    chain = list(script.iterate_revisions(target.revision, at))[::-1]
    out = []
    for rev in chain:
        step = step_of(rev.module)
        out.append(Pending(rev.revision, (rev.doc or "").strip(),
                           step.script() if step else "-- (no SQL)"))
    return out


def step_of(module: ModuleType) -> Step | None:
    """The ``Step`` a revision module declares (``step = Step(...)``)."""
    found = getattr(module, "step", None)
    return found if isinstance(found, Step) else None


def prepare(connection: Connection | psycopg.Connection, role_prefix: str) -> None:
    """The settings a migration transaction needs, and the advisory lock for
    its length (used where a run is one transaction: ``_drop_everything``,
    building from the files in tests)."""
    raw = _driver(connection)
    raw.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
    raw.execute("SELECT set_config('ledger.role_prefix', %s, true)", (role_prefix,))
    raw.execute("SELECT set_config('ledger.migrating', 'on', true)")


def prepare_session(connection: Connection, run: Run) -> None:
    """Called by env.py before any revision, outside a transaction: the
    advisory lock and the settings, for the whole session, so that each
    revision can run in a transaction of its own."""
    raw = _driver(connection)
    raw.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    raw.execute("SELECT set_config('ledger.role_prefix', %s, false)", (run.role_prefix,))
    raw.execute("SELECT set_config('ledger.migrating', 'on', false)")
    # the revision waits this long for a lock, then gives way (see upgrade)
    raw.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(run.lock_timeout_s * 1000)}ms",))
    raw.execute("SELECT set_config('statement_timeout', '0', false)")
    raw.commit()


def finish(connection: Connection | psycopg.Connection) -> None:
    """Called by env.py after the revisions: the privilege self-check
    (grants.sql) fails the migration if any function is executable by PUBLIC
    or is not granted and pinned as the API must be; and the owner may read
    the migration record (``ledger_api.hello`` does)."""
    raw = _driver(connection)
    if _scalar(raw, "SELECT to_regprocedure('ledger.check_privileges()') IS NOT NULL"):
        raw.execute("SELECT ledger.check_privileges()")
    if _scalar(raw, "SELECT to_regclass('public.alembic_version') IS NOT NULL"):
        prefix = _scalar(raw, "SELECT current_setting('ledger.role_prefix')")
        raw.execute(sql.SQL("GRANT SELECT ON public.alembic_version TO {}").format(
            sql.Identifier(f"{prefix}owner")))
    raw.commit()


def apply_schema(connection: Connection | psycopg.Connection, *names: str,
                 folder: Path | None = None, order: Sequence[str] = SCHEMA_FILES) -> None:
    """Apply schema files from ``folder`` (default ``schema_dir()``): the named
    ones, or all of them, in ``order`` whatever the order named, each as one
    script: ``roles.sql`` as the administrator, the others as the owner role,
    so that what they create is owned by the owner.

    Production never applies the live files: the revisions apply their frozen
    copies (``Step``). Tests build a database from the live files to hold the
    history equal to them."""
    unknown = sorted(set(names) - set(order))
    if unknown:
        raise ValueError(f"not schema files: {', '.join(unknown)} (see SCHEMA_FILES)")
    raw = _driver(connection)
    for name in order:
        if not names or name in names:
            text = ((folder or schema_dir()) / name).read_text()
            _execute(raw, text, as_owner=name not in ADMIN_FILES)


@dataclass(frozen=True)
class Step:
    """The SQL of one revision, frozen in ``migrations/sql/<revision>/``.

    ``upgrade`` runs ``before.sql``, then the revision's copies of the schema
    files it changed (``schema/``, in ``files`` order), then ``after.sql``;
    each as the owner but ``roles.sql``, which the administrator runs.
    ``downgrade`` runs ``down.sql`` and then puts back, for each file this
    revision froze, the copy the revision before it left; without a
    ``down.sql`` the revision cannot be undone and says so."""

    revision: str
    #: the schema files this revision froze, in the order they are applied
    files: tuple[str, ...] = ()

    @property
    def folder(self) -> Path:
        return migrations_dir() / "sql" / self.revision

    def parts(self) -> Iterator[tuple[str, str, bool]]:
        """``(name, sql, as_owner)`` of what ``upgrade`` runs, in order."""
        before = self.folder / "before.sql"
        if before.exists():
            yield "before.sql", before.read_text(), True
        for name in self.files:
            yield f"schema/{name}", (self.folder / "schema" / name).read_text(), name not in ADMIN_FILES
        after = self.folder / "after.sql"
        if after.exists():
            yield "after.sql", after.read_text(), True

    def script(self) -> str:
        """Everything ``upgrade`` runs, as one text (``ledger migrate --dry-run``)."""
        return "\n".join(f"-- {self.revision}/{name}{'' if owner else ' (as the administrator)'}\n{text}"
                         for name, text, owner in self.parts())

    def upgrade(self, connection: Connection) -> None:
        _starting(self.revision, "applying")
        raw = _driver(connection)
        for _, text, as_owner in self.parts():
            _execute(raw, text, as_owner=as_owner)

    def downgrade(self, connection: Connection) -> None:
        down = self.folder / "down.sql"
        if not down.exists():
            raise LedgerError(
                f"revision {self.revision} cannot be undone (it has no down.sql): roll forward, "
                "or restore the backup taken before the upgrade")
        _starting(self.revision, "undoing")
        raw = _driver(connection)
        _execute(raw, down.read_text(), as_owner=True)
        for name in self.files:
            previous = frozen_copy(name, before=self.revision)
            if previous is not None:
                _execute(raw, previous.read_text(), as_owner=name not in ADMIN_FILES)

    def digest(self) -> str:
        """A digest of the revision's module and every file of its folder
        (``migrations/released.txt``)."""
        h = hashlib.sha256()
        h.update((migrations_dir() / "versions" / f"{self.revision}.py").read_bytes() + b"\0")
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            h.update(path.relative_to(self.folder).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
        return "sha256:" + h.hexdigest()


def steps() -> list[Step]:
    """Every revision's ``Step``, oldest first."""
    found = []
    for rev in history():
        script = _script().get_revision(rev)
        assert script is not None
        step = step_of(script.module)
        if step is not None:
            found.append(step)
    return found


def frozen_copy(name: str, *, before: str) -> Path | None:
    """The copy of schema file ``name`` that the newest revision older than
    ``before`` froze (``None``: none did)."""
    copy = None
    for step in steps():
        if step.revision == before:
            return copy
        if name in step.files:
            copy = step.folder / "schema" / name
    return copy


def released() -> dict[str, str]:
    """``migrations/released.txt``: each released revision and its digest."""
    path = migrations_dir() / "released.txt"
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            revision, digest = line.split()
            out[revision] = digest
    return out


def load_revision_module(path: Path) -> ModuleType:
    """A revision file as a module, outside Alembic (tests)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _driver(connection: Connection | psycopg.Connection) -> psycopg.Connection:
    if isinstance(connection, psycopg.Connection):
        return connection
    raw = connection.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    return raw


def _scalar(conn: psycopg.Connection[Any], query: LiteralString) -> Any:
    """The one value a one-row query returns."""
    row = conn.execute(query).fetchone()
    assert row is not None, query
    return row[0]


def _execute(raw: psycopg.Connection, text: str, *, as_owner: bool) -> None:
    if as_owner:
        prefix = _scalar(raw, "SELECT current_setting('ledger.role_prefix')")
        raw.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"{prefix}owner")))
    # No parameters: psycopg sends the script as-is (several statements, and
    # %-signs inside format() calls untouched).
    raw.execute(text.encode())
    raw.execute("RESET ROLE")
