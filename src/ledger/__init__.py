"""Ledger: durable campaigns for fleets of automation and AI-agent workers.

The public API: ``Database`` (where and as whom to connect), ``Kernel`` (one
typed method per write function), ``Reads`` (typed queries over the read
views) and the error classes.

``Database``, ``Session``, ``Kernel`` and ``Reads`` are imported on first use
(PEP 562), so that ``import ledger.cli`` -- every ``ledger`` command -- does
not pay for the database layer until a command needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ledger.errors import (
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

if TYPE_CHECKING:
    from ledger.db.database import Database, Session
    from ledger.db.kernel import Kernel
    from ledger.db.reads import Reads

_LAZY = {"Database": "db.database", "Session": "db.database", "Kernel": "db.kernel",
         "Reads": "db.reads"}

__all__ = [
    "Database", "DuplicateObjective", "Forbidden", "IllegalTransition", "Kernel", "LedgerError",
    "NotFound", "ObjectiveConflict", "OutcomeUnknown", "Reads", "RepeatedApproach", "SameIdentity",
    "Session", "StaleLease", "Unavailable",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
