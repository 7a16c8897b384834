"""The Python machine is built from the database's rows, and the diagram in
docs/ is generated from them (regenerate with LEDGER_UPDATE_SNAPSHOT=1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import Actors
from ledger.machine import StateMachine

# Only SQL on one connection: each test runs in a transaction rolled back after it.
pytestmark = [pytest.mark.anyio, pytest.mark.rollback]
DOC = Path(__file__).parents[1] / "docs" / "state_machine.md"
HEADER = """# Campaign states

Generated from the `transition` table by `ledger graph --format mermaid`; a test
keeps this file equal to what the database holds. `ledger graph` draws an SVG.

```mermaid
"""


async def test_machine_follows_the_table(actors: Actors) -> None:
    reader = await actors.reads()
    machine = await StateMachine.load(reader)
    for t in await reader.transitions():
        if t.from_state is not None:
            assert machine.next_state(t.name, t.from_state) == t.to_state
    assert machine.next_state("claim", "leased") is None
    assert machine.allowed("confirmed") == []
    assert machine.allowed("leased") == ["abandon", "dismiss", "expire_lease", "fail_attempt", "record_attempt",
                                         "release"]
    assert machine.terminal == {"confirmed", "dismissed", "abandoned"}


async def test_state_machine_doc_is_generated_from_the_table(actors: Actors) -> None:
    machine = await StateMachine.load(await actors.reads())
    text = HEADER + machine.mermaid() + "```\n"
    if os.environ.get("LEDGER_UPDATE_SNAPSHOT"):
        DOC.write_text(text)
    assert DOC.read_text() == text
    svg = machine.svg()
    for state in ("ready", "leased", "attempted", "verified", "exhausted", "confirmed"):
        assert f">{state}</text>" in svg
