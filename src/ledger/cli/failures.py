"""Every failure of a command is one readable line on stderr and a documented
exit code -- never a traceback.

``report`` turns whatever escaped a command into that line. Ledger's own
errors carry their exit code; driver errors that escaped a translation
(Alembic runs on SQLAlchemy) are translated here; and when the database could
not be used, ``readiness`` is asked why, so the line says whether the server
is unreachable, the database missing or not migrated, and what to do.
``LEDGER_DEBUG=1`` prints the traceback as well, for a bug report.
"""

from __future__ import annotations

import sys
import traceback
from typing import TextIO

from ledger.errors import (
    DatabaseMissing,
    InvalidInput,
    LedgerError,
    NotMigrated,
    OutcomeUnknown,
    ReadOnly,
    Unavailable,
)
from ledger.settings import environment

#: Exit codes of ``ledger``, documented in ``--help`` and docs/reference/errors.md (generated).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "an error without a more specific code; a drill failed"),
    (2, "bad usage or invalid input"),
    (3, "stale lease (the generation is no longer current); a drill was under-exercised"),
    (4, "illegal transition (the state machine has no such move)"),
    (5, "forbidden (the role or identity may not do this)"),
    (6, "not found (no such campaign, class ...)"),
    (7, "duplicate objective (open under another class or target)"),
    (8, "repeated approach (the same fix failed before)"),
    (9, "immutable record"),
    (10, "idempotency key reused for a different request"),
    (11, "objective conflict (already open with a different request)"),
    (12, "gc finished with errors"),
    (13, "the database does not exist (create it, or `ledger migrate --create-database`)"),
    (14, "the database is not migrated, or older than this Ledger (`ledger migrate`)"),
    (15, "the database server refused the login (user, password, or pg_hba.conf)"),
    (16, "cannot listen: the port is already in use, or the address is not this machine's"),
    (17, "a migration failed and was rolled back (the database stays at the revision before it)"),
    (18, "a limit key was at its cap or a rate bucket empty at the write (a claim moves on; LimitReached)"),
    (69, "the database server cannot be reached, or is read-only"),
    (70, "internal error (a bug: rerun with LEDGER_DEBUG=1 and report it), or a service left a task or child process running at exit"),
    (74, "a file could not be read or written"),
    (75, "outcome unknown: the reply was lost; read back before retrying"),
    (78, "invalid configuration (a setting, ledger.toml, or a malformed database URL)"),
    (130, "interrupted (Ctrl-C)"),
)

INTERNAL_ERROR = 70  # EX_SOFTWARE
IO_ERROR = 74  # EX_IOERR

#: SQLSTATEs that mean the schema (or a role) is missing or older than the code.
_NOT_READY_SQLSTATES = frozenset({"3D000", "3F000", "42P01", "42883"})


def exit_codes_text() -> str:
    """The exit-code table as plain lines (for ``--help``)."""
    return "\n".join(f"{code:>3}  {meaning}" for code, meaning in EXIT_CODES)


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def as_ledger_error(exc: BaseException) -> LedgerError | None:
    """Ledger's error for ``exc``, translating driver errors; ``None`` if it
    is not a database or Ledger error."""
    if isinstance(exc, LedgerError):
        return exc
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None and isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig  # SQLAlchemy (under Alembic) wraps the driver's error
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(exc, psycopg.Error):
        from ledger.db.database import _translate

        # Whether it was sent is unknown here; nothing retries past this point.
        return _translate(exc, sent=False)
    return None


def _wants_diagnosis(error: LedgerError) -> bool:
    if isinstance(error, (DatabaseMissing, NotMigrated, OutcomeUnknown, ReadOnly)):
        return False
    if isinstance(error, Unavailable) or error.sqlstate in _NOT_READY_SQLSTATES:
        return True
    # SET ROLE to a role that was never created (an unmigrated cluster)
    return isinstance(error, InvalidInput) and error.sqlstate == "22023"


def explain(exc: BaseException, url: str | None, role_prefix: str) -> tuple[str, int]:
    """The one line (without the ``ledger:`` prefix) and the exit code for ``exc``."""
    exc = _leaf(exc)
    error = as_ledger_error(exc)
    if error is None:
        if isinstance(exc, OSError):
            where = f" {exc.filename}" if exc.filename else ""
            return f"{exc.strerror or exc}{':' if where else ''}{where}", IO_ERROR
        return (f"internal error: {type(exc).__name__}: {exc} "
                f"(rerun with LEDGER_DEBUG=1 for the traceback, and report it)"), INTERNAL_ERROR
    if url and _wants_diagnosis(error):
        from ledger.db.readiness import diagnose

        error = diagnose(url, role_prefix) or error
    line = " ".join(error.message.split())  # one line, whatever the server said
    if error.hint:
        line = f"{line} (hint: {error.hint})"
    return line, error.exit_code


def report(exc: BaseException, url: str | None, role_prefix: str,
           stream: TextIO | None = None) -> int:
    """Print ``exc`` as one line on stderr; return the exit code."""
    stream = stream or sys.stderr
    if environment("debug"):
        traceback.print_exception(exc, file=stream)
    line, code = explain(exc, url, role_prefix)
    print(f"ledger: {line}", file=stream, flush=True)
    return code
