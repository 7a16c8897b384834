"""Ledger: durable campaigns for fleets of automation and AI-agent workers.

The public API: ``Database`` (where and as whom to connect), ``Kernel`` (one
typed method per write function), ``Reads`` (typed queries over the read
views) and the error classes.
"""

from .database import Database, Session
from .errors import (
    DuplicateObjective,
    Forbidden,
    IllegalTransition,
    LedgerError,
    NotFound,
    ObjectiveConflict,
    OutcomeUnknown,
    RepeatedApproach,
    SameIdentity,
    StaleLease,
    Unavailable,
)
from .kernel import Kernel
from .reads import Reads

__all__ = [
    "Database", "DuplicateObjective", "Forbidden", "IllegalTransition", "Kernel", "LedgerError",
    "NotFound", "ObjectiveConflict", "OutcomeUnknown", "Reads", "RepeatedApproach", "SameIdentity",
    "Session", "StaleLease", "Unavailable",
]
