"""Which release this code is, which schema it was written for, and the
releases before it (CHANGELOG.md says what changed in each).

Imports nothing: ``ledger --version`` and every connection's greeting read
these constants without loading the database layer.

A release's schema is the Alembic revision at its head. A process says both
to the database before its first statement (``ledger_api.hello``); the
database refuses code whose schema it does not have yet, and code older than
the oldest it still serves (docs/upgrading.md: what may run together).
"""

from __future__ import annotations

from typing import NamedTuple

#: This release (semver 0.x: a minor release may change the schema).
RELEASE = "0.3.0"
#: The schema revision this code was written for: the newest it knows. Held
#: equal to the migrations' head by tests/test_upgrade.py.
SCHEMA = "0011_limits"


class Release(NamedTuple):
    """A published release: its version, its commit and its schema's head."""

    version: str
    commit: str
    schema: str


#: Every earlier release, oldest first. Each is tagged ``v<version>`` in git;
#: a database of any of them upgrades to this one (tests/test_upgrade.py
#: builds and fills each with its own code first).
RELEASES: tuple[Release, ...] = (
    Release("0.1.0", "ba4fed60b36ce1e44ee430554b2e89604b54fbcd", "0001_baseline"),
    Release("0.2.0", "53cfadf31faeb9e367b33c8a4c20e457cddbe635", "0003_trace_context"),
)


def revision_number(revision: str) -> int:
    """The number a revision id starts with (``0003_trace_context`` -> 3)."""
    head, _, _ = revision.partition("_")
    return int(head)


def release_of(revision: str | None) -> str | None:
    """The release whose schema ``revision`` is (``None``: not one of them)."""
    if revision == SCHEMA:
        return RELEASE
    for release in RELEASES:
        if release.schema == revision:
            return release.version
    return None


def describe(revision: str | None) -> str:
    """``revision`` for a message: with its release where it is one."""
    if revision is None:
        return "no schema"
    release = release_of(revision)
    return f"{revision} (Ledger {release})" if release else revision
