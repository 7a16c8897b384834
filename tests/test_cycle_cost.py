"""What the cheaper cycle (issue 28) must not have changed: the rewritten
checks accept exactly what the old ones did, and the invariants they moved
still refuse what they refused.

Speed itself is measured in bench/ (``python -m bench.cost``), never here."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Admin

pytestmark = pytest.mark.anyio

# The counted forms the validators replaced, and the helper now used for each.
VALIDATORS = {
    "ledger.is_fingerprint": "^[A-Za-z0-9:_.-]{8,200}$",
    "ledger.is_commit_sha": "^[0-9a-f]{7,64}$",
    "ledger.is_event_type": "^[a-z][a-z0-9_.]{0,63}$",
}
# Strings near every edge: the lengths around each bound, each class's
# characters and their neighbours, and characters from outside ASCII.
ALPHABET = "abcfgzAZ09:_.-/ é\n"
EDGES = [c * n for c in "a0Z" for n in (0, 1, 6, 7, 8, 63, 64, 65, 199, 200, 201)]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.text(alphabet=ALPHABET, max_size=210), min_size=1, max_size=40))
def test_the_uncounted_validators_accept_exactly_what_the_counted_patterns_did(
        admin: Admin, values: list[str]) -> None:
    for function, pattern in VALIDATORS.items():
        rows = admin.execute(
            f"SELECT v, v ~ %s AS counted, {function}(v) AS now FROM unnest(%s::text[]) v",  # noqa: S608 (fixed names)
            (pattern, values + EDGES)).fetchall()
        assert [r for r in rows if r["counted"] is not r["now"]] == [], function


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
def test_the_event_type_check_refuses_what_the_counted_pattern_refused(admin: Admin) -> None:
    check = admin.execute(
        "SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint "
        "WHERE conrelid = 'ledger.campaign_event'::regclass AND contype = 'c' "
        "AND pg_get_constraintdef(oid) LIKE '%type%'").fetchone()
    assert check is not None
    expression = check["d"].removeprefix("CHECK ")
    samples = [*EDGES, "a" * 64, "a" * 65, "x.y_z9", "9x", "Xy", "a-b", ""]
    rows = admin.execute(
        f"SELECT type, type ~ '^[a-z][a-z0-9_.]{{0,63}}$' AS counted, {expression} AS now "  # noqa: S608 (catalog text)
        "FROM unnest(%s::text[]) type", (samples,)).fetchall()
    assert [r for r in rows if r["counted"] is not r["now"]] == []
