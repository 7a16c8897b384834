"""What the cheaper cycle (bench/README.md, "the cycle's cost") must not have changed: the rewritten
checks accept exactly what the old ones did, and the invariants they moved
still refuse what they refused.

Speed itself is measured in bench/ (``python -m bench.cost``), never here."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Actors, Admin
from drive import Driver
from ledger.db.database import _argument, _TextArray

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
        admin: Admin, pg_admin_url: str, values: list[str]) -> None:
    # (pg_admin_url: the server is started before the leak check looks, if this runs first)
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


# Each rule of campaign and attempt that was a CHECK constraint and is now kept
# by the table's guard trigger: a write that breaks it, straight into the
# table (as the owner could, past every API function), and the constraint
# the refusal names -- the same SQLSTATE (23514) and name as the CHECK gave.
CAMPAIGN_RULES = [
    ("objective_key = ''", "campaign_objective_key_check"),
    ("objective_key = repeat('k', 501)", "campaign_objective_key_check"),
    ("target = ''", "campaign_target_check"),
    ("target = repeat('t', 2001)", "campaign_target_check"),
    ("attempt_count = -1", "campaign_attempt_count_check"),
    ("max_attempts = 0", "campaign_max_attempts_check"),
    ("seat = ''", "campaign_seat_check"),
    ("lease_owner = 'nobody', lease_expires_at = now()", "campaign_lease_iff_leased"),  # ready, with a lease
    ("waiting_on = 'bored', waiting_reason = 'x'", "campaign_waiting_on_check"),
    ("waiting_on = 'target'", "campaign_waiting_says_why"),
    ("waiting_on = 'target', waiting_reason = repeat('r', 4001)", "campaign_waiting_reason_check"),
    ("fault_count = -1", "campaign_fault_count_check"),
]
ATTEMPT_RULES = [
    ("attempt_no = 0", "attempt_attempt_no_check"),
    ("outcome = 'won'", "attempt_ended"),  # (also attempt_outcome_check: the first by name is named)
    ("outcome = 'won', ended_at = now()", "attempt_outcome_check"),
    ("verdict = 'maybe'", "attempt_verdict_after_record"),  # (also attempt_verdict_check)
    ("outcome = 'attempted', ended_at = now(), verdict = 'maybe'", "attempt_verdict_check"),
    ("ended_at = now()", "attempt_ended"),  # still running
    ("verdict = 'accepted'", "attempt_verdict_after_record"),  # not attempted
    ("diff = decode(repeat('00', 67108865), 'hex')", "attempt_diff_check"),
    ("candidate_ref = 'heads/x'", "attempt_candidate_ref_check"),
    ("candidate_ref = 'refs/heads/a b'", "attempt_candidate_ref_check"),
]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_every_rule_that_was_a_check_constraint_still_refuses_a_direct_write(
        actors: Actors, admin: Admin, test_class: str) -> None:
    driver = Driver(actors, test_class)
    leased, _ = await driver.leased()
    ready = await driver.open()
    refused = {}
    for change, _ in CAMPAIGN_RULES:
        try:
            admin.execute(f"UPDATE ledger.campaign SET {change} WHERE id = %s", (ready,))  # noqa: S608 (fixed text)
        except psycopg.errors.CheckViolation as exc:
            refused[change] = exc.diag.constraint_name
    for change, _ in ATTEMPT_RULES:
        try:
            admin.execute(f"UPDATE ledger.attempt SET {change} WHERE campaign_id = %s", (leased,))  # noqa: S608 (fixed text)
        except psycopg.errors.CheckViolation as exc:
            refused[change] = exc.diag.constraint_name
    assert refused == dict(CAMPAIGN_RULES + ATTEMPT_RULES)
    # and on INSERT: an attempt numbered 0, and a ready campaign with a lease
    with pytest.raises(psycopg.errors.CheckViolation) as attempt_zero:
        admin.execute("INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker, claimed_at, "
                      "lease_expires_at) VALUES (%s, 0, 99, 'w', now(), now())", (ready,))
    assert attempt_zero.value.diag.constraint_name == "attempt_attempt_no_check"
    with pytest.raises(psycopg.errors.CheckViolation) as with_lease:
        admin.execute("SELECT ledger.begin_transition('open', 'sensor', 'test')")
        admin.execute("INSERT INTO ledger.campaign (class, objective_key, target, state, max_attempts, "
                      "lease_owner, lease_expires_at, next_attempt_at, created_at, updated_at) "
                      "VALUES (%s, 'k-with-lease', 't', 'ready', 3, 'w', now(), now(), now(), now())",
                      (test_class,))
    assert with_lease.value.diag.constraint_name == "campaign_lease_iff_leased"
    # the rules still let every legal row through: the campaigns above were opened and leased
    states = admin.execute("SELECT state FROM ledger.campaign WHERE id = ANY(%s) ORDER BY id",
                           ([leased, ready],)).fetchall()
    assert [r["state"] for r in states] == ["leased", "ready"]


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# (no lone surrogates: they cannot be encoded, and the literal raises the same
# UnicodeEncodeError as psycopg's own list dumping)
@given(values=st.lists(st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))),
                       max_size=8))
def test_a_list_of_strings_reaches_the_server_as_itself(admin: Admin, pg_admin_url: str,
                                                       values: list[str | None]) -> None:
    """Kernel arguments that are lists of strings go as one untyped array
    literal (``_TextArray``): quotes, backslashes, braces, commas, the word
    NULL and empty strings arrive as they were sent, None as NULL."""
    sent = _argument(list(values))
    assert isinstance(sent, _TextArray)
    got = admin.execute("SELECT %s::text[] AS a, %s::text[] AS b", (sent, _argument(["NULL", None, "", "{a,b}"]))).fetchone()
    assert got is not None and got["a"] == list(values)
    assert got["b"] == ["NULL", None, "", "{a,b}"]  # the word NULL is a word


def test_a_list_the_literal_cannot_carry_is_left_to_psycopg() -> None:
    # a NUL (psycopg refuses it with its own error), or anything but strings
    for values in (["a\x00b"], [1, 2], [["nested"]], ["x", 3.5]):
        assert not isinstance(_argument(values), _TextArray)
