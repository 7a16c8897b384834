"""Ledger's error tree and the one table that maps SQLSTATEs to it.

Kernel functions raise Ledger's own SQLSTATEs (``LG001`` ...); PostgreSQL's own
codes that mean the same thing to a caller (``42501`` insufficient privilege,
``23514`` check violation, ...) map onto the same classes. Nothing here looks at
message text: the code decides the class, the message is only shown.

Each class carries a stable problem ``type`` slug (HTTP problem+json), an HTTP
status and a CLI exit code, so every surface reports an error the same way.
"""

from __future__ import annotations

from typing import ClassVar


class LedgerError(Exception):
    """Base of every error Ledger raises on purpose."""

    slug: ClassVar[str] = "ledger-error"
    http_status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, *, sqlstate: str | None = None, detail: str | None = None,
                 hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.detail = detail
        #: What the user can do about it (the CLI prints it on the same line).
        self.hint = hint

    @property
    def problem_type(self) -> str:
        """The stable URI reference used as ``type`` in problem+json bodies."""
        return f"/problems/{self.slug}"


class StaleLease(LedgerError):
    """The write carried a generation that is no longer current: stand down."""

    slug = "stale-lease"
    http_status = 409
    exit_code = 3


class IllegalTransition(LedgerError):
    """The state machine has no such transition from the campaign's state."""

    slug = "illegal-transition"
    http_status = 409
    exit_code = 4


class Forbidden(LedgerError):
    """The acting role or identity may not do this."""

    slug = "forbidden"
    http_status = 403
    exit_code = 5


class SameIdentity(Forbidden):
    """A verdict from the identity that made the attempt."""

    slug = "same-identity"


class NotFound(LedgerError):
    """No such campaign, class, verification or side effect."""

    slug = "not-found"
    http_status = 404
    exit_code = 6


class DuplicateObjective(LedgerError):
    """The objective is already open under another class or target."""

    slug = "duplicate-objective"
    http_status = 409
    exit_code = 7


class RepeatedApproach(LedgerError):
    """The attempt's fingerprint already failed or was rejected: the next one must differ."""

    slug = "repeated-approach"
    http_status = 409
    exit_code = 8


class InvalidInput(LedgerError):
    """The arguments are malformed or out of range."""

    slug = "invalid-input"
    http_status = 422
    exit_code = 2


class ImmutableRecord(LedgerError):
    """An append-only or migration-only record was asked to change."""

    slug = "immutable-record"
    http_status = 409
    exit_code = 9


class IdempotencyConflict(LedgerError):
    """An idempotency key was reused for a different request."""

    slug = "idempotency-conflict"
    http_status = 422
    exit_code = 10


class Unavailable(LedgerError):
    """The database cannot be reached (or the schema is not ready)."""

    slug = "unavailable"
    http_status = 503
    exit_code = 69  # EX_UNAVAILABLE


class DatabaseMissing(Unavailable):
    """The server answers, but the database named in the URL does not exist:
    create it, or run ``ledger migrate --create-database``."""

    slug = "database-missing"
    exit_code = 13


class LoginRefused(Unavailable):
    """The server answers, but refuses the login the URL gives: no such user, a
    wrong password, a role without LOGIN or CONNECT, or a ``pg_hba.conf`` rule."""

    slug = "login-refused"
    exit_code = 15


class NotMigrated(Unavailable):
    """The database has no Ledger schema or roles yet, or an older schema than
    this code: run ``ledger migrate``."""

    slug = "not-migrated"
    exit_code = 14


class SchemaMismatch(LedgerError):
    """This code and the database's schema cannot work together: the schema
    is older than the code needs (run ``ledger migrate`` with this code), or
    the code is older than the schema still serves (upgrade Ledger here). The
    database refuses the process's greeting (``ledger_api.hello``), so nothing
    it would have written is."""

    slug = "schema-mismatch"
    http_status = 503
    exit_code = 14


class CodeTooOld(SchemaMismatch):
    """This code is older than the oldest the database's schema still serves:
    only a newer Ledger on this machine mends it (waiting does not)."""

    slug = "code-too-old"


class MigrationFailed(LedgerError):
    """A revision could not be applied -- it failed, or could not get its
    locks in time -- and was rolled back: the database stays at the revision
    before it, which the message names."""

    slug = "migration-failed"
    http_status = 500
    exit_code = 17


class OutcomeUnknown(Unavailable):
    """The call was sent but its reply was lost (the connection dropped, or the
    call's deadline passed): it may or may not have taken effect. Idempotent
    calls are retried by ``Session``; others must be resolved by reading back."""

    slug = "outcome-unknown"
    exit_code = 75  # EX_TEMPFAIL


class ReadOnly(Unavailable):
    """The server is read-only (a standby): no primary is reachable on this URL."""

    slug = "read-only"
    PREFIX: ClassVar[str] = "Unavailable: read-only: "

    def __init__(self, message: str, *, sqlstate: str | None = None, detail: str | None = None):
        # Logged as it is, the message says which kind of unavailable this is.
        super().__init__(message if message.startswith(self.PREFIX) else self.PREFIX + message,
                         sqlstate=sqlstate, detail=detail)


class ObjectiveConflict(LedgerError):
    """The objective is already open with a different request (priority,
    labels, desired state ...): the open campaign is left as it is."""

    slug = "objective-conflict"
    http_status = 409
    exit_code = 11


class LimitReached(LedgerError):
    """A limit key was at its cap (of leases or of verifications) or a rate
    bucket was empty at the write: raised inside a claim that lost the last
    slot to a concurrent one (the claim catches it and moves on); seen
    outside only from a direct write of the counters' rows."""

    slug = "limit-reached"
    http_status = 429
    exit_code = 18


class CannotListen(LedgerError):
    """A server could not listen where it was told: the port is already in use,
    or the address is not one of this machine's (or needs privileges)."""

    slug = "cannot-listen"
    http_status = 500
    exit_code = 16


class ConfigError(LedgerError):
    """A configuration file or setting is invalid."""

    slug = "config-error"
    http_status = 500
    exit_code = 78  # EX_CONFIG


#: SQLSTATE -> error class. Ledger's own codes first, then PostgreSQL's.
SQLSTATES: dict[str, type[LedgerError]] = {
    "LG001": StaleLease,
    "LG002": IllegalTransition,
    "LG003": Forbidden,
    "LG004": NotFound,
    "LG005": DuplicateObjective,
    "LG006": RepeatedApproach,
    "LG007": InvalidInput,
    "LG008": SameIdentity,
    "LG009": ImmutableRecord,
    "LG010": IdempotencyConflict,
    "LG011": ObjectiveConflict,
    "LG012": SchemaMismatch,
    "LG013": CodeTooOld,
    "LG014": LimitReached,
    "25006": ReadOnly,  # read_only_sql_transaction: connected to a standby
    "42501": Forbidden,  # insufficient_privilege: the role may not call this
    "22P02": InvalidInput,  # invalid_text_representation
    "22007": InvalidInput,  # invalid_datetime_format
    "22008": InvalidInput,  # datetime_field_overflow
    "22003": InvalidInput,  # numeric_value_out_of_range
    "22001": InvalidInput,  # string_data_right_truncation
    "22023": InvalidInput,  # invalid_parameter_value
    "22004": InvalidInput,  # null_value_not_allowed
    "23502": InvalidInput,  # not_null_violation
    "23503": NotFound,  # foreign_key_violation: refers to something missing
    "23514": InvalidInput,  # check_violation
    "22021": InvalidInput,  # character_not_in_repertoire (e.g. NUL bytes)
    "22P05": InvalidInput,  # untranslatable_character
    "3D000": Unavailable,  # invalid_catalog_name: the database does not exist
    "3F000": Unavailable,  # invalid_schema_name: not migrated
    "42883": Unavailable,  # undefined_function: schema older than this code
    "42P01": Unavailable,  # undefined_table: not migrated
}

#: SQLSTATEs after which the statement certainly did not take effect and is
#: worth retrying with backoff (ledger.db.database does, in one place).
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})

#: SQLSTATEs that end a connection. Met while connecting, nothing was sent
#: (``Unavailable``); met during a call, its reply may be lost after the commit
#: (``OutcomeUnknown``).
CONNECTION_LOST_SQLSTATES = frozenset({"08000", "08003", "08006", "08007", "57P01", "57P02"})
#: SQLSTATEs that refuse a connection before anything runs.
CONNECTION_REFUSED_SQLSTATES = frozenset({"08001", "08004", "57P03", "53300"})


def from_sqlstate(sqlstate: str | None, message: str, detail: str | None = None, *,
                  sent: bool = True, hint: str | None = None) -> LedgerError:
    """Build the Ledger error for a database error's SQLSTATE. ``sent`` says
    whether a call had been sent when the error arrived (a lost connection is
    then ``OutcomeUnknown``, else ``Unavailable``); ``hint`` is the server's
    (``ledger_api.hello`` says what to do)."""
    code = sqlstate or ""
    cls: type[LedgerError]
    if code in CONNECTION_LOST_SQLSTATES:
        cls = OutcomeUnknown if sent else Unavailable
    elif code in CONNECTION_REFUSED_SQLSTATES:
        cls = Unavailable
    else:
        cls = SQLSTATES.get(code, LedgerError)
        if cls is LedgerError and code.startswith("08"):
            cls = OutcomeUnknown if sent else Unavailable
    error = cls(message, sqlstate=sqlstate, detail=detail)
    if hint:
        error.hint = hint
    return error
