"""A compiled read statement: the one thing ``ledger.database`` needs to know
of ``ledger.queries``, kept apart so that it can be imported without SQLAlchemy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Query:
    """A compiled read statement and the defaults of its parameters."""

    text: str
    defaults: dict[str, Any] = field(default_factory=dict)
