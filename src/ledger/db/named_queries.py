"""The named read queries: plain SQL in ``src/ledger/db/sql/reads/``, loaded by name.

Each file holds the reads of one group of views; each query starts at a
``-- name: <name>`` line and runs to the next one. Its parameters are
psycopg's (``%(name)s``; a literal ``%`` is ``%%``); comment lines are the
query's documentation and are not sent. ``ledger.db.reads.Reads`` has one method
per name, and ``ledger.db.database`` runs them. Loading reads a dozen small files
once, at import: no SQL is built or compiled in Python.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Where the named queries live (inside the package, so a wheel has them).
FOLDER = Path(__file__).parent / "sql" / "reads"

_NAME = re.compile(r"^--[ \t]*name:[ \t]*([a-z_][a-z0-9_]*)[ \t]*$", re.MULTILINE)
#: Lines that are blank or only a comment: documentation, not sent.
_NOISE = re.compile(r"^[ \t]*(?:--[^\n]*)?\n", re.MULTILINE)


@dataclass(frozen=True)
class Query:
    """A read statement (psycopg's parameter style) and the defaults of its parameters."""

    text: str
    defaults: dict[str, Any] = field(default_factory=dict)
    name: str = ""


def parse(source: str, origin: str = "<sql>") -> dict[str, Query]:
    """The named queries of one file's text, in file order."""
    found: dict[str, Query] = {}
    parts = _NAME.split(source)  # [header, name, body, name, body, ...]
    for name, body in zip(parts[1::2], parts[2::2]):
        text = _NOISE.sub("", body + "\n").strip().rstrip(";").rstrip()
        if not text:
            raise ValueError(f"{origin}: query {name} is empty")
        if name in found:
            raise ValueError(f"{origin}: query {name} is named twice")
        found[name] = Query(text, name=name)
    return found


def load(folder: Path = FOLDER) -> dict[str, Query]:
    """Every named query under ``folder``; a name used twice is an error."""
    queries: dict[str, Query] = {}
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".sql")):
        with open(folder / file, encoding="utf-8") as source:
            parsed = parse(source.read(), file)
        for name, query in parsed.items():
            if name in queries:
                raise ValueError(f"{file}: query {name} is also named in another file")
            queries[name] = query
    return queries


#: The named queries, by name.
QUERIES: dict[str, Query] = load()
