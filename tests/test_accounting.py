"""One accounting of attempts (README "Faults that are not the attempt's own"): a stateful property test
(hypothesis) against real PostgreSQL that drives a campaign down every path
back to ``ready`` -- fail, refuse, reject, lease expiry, regression after
promotion, promote_failed, a rebase and its verdict, release (a system fault),
drained, a released verification, a promotion waiting on a system fault or on
its target, a promotion that failed for a reason outside the candidate --
each call at a pinned ``ledger.now()``, and after every step checks:

* ``attempt_count`` is what the model charged: +1 for the attempt's own
  failures (a candidate recorded, a failure, a refusal, a lost lease), -1 for
  an accepted candidate that cannot land on its moved target (the attempt is
  given back), and nothing for a fault that is not the attempt's own -- so no
  system fault is ever charged;
* ``attempt_count`` never exceeds ``max_attempts``, and a campaign never rests
  in ``ready`` with its attempts spent: every charging path exhausts it;
* the attempts agents really made are bounded by the budget plus the times
  the target moved under an accepted candidate (a promotion that fails for a
  reason outside the candidate waits; it never sends it back to be attempted
  again, which made the budget bound nothing).
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql
from psycopg.types.json import Jsonb

from conftest import Admin
from drive import fingerprint, sha
from ledger import Database

LEASE_S = 30
_run = itertools.count(1)
_shas = itertools.count(1000)
#: Every path the run must have taken (asserted at the end).
PATHS = ("fail", "refuse", "reject", "expire", "regress", "promote_failed", "rebase", "release", "drained",
         "release_verification", "promotion_waits_on_fault", "promotion_waits_on_target", "promotion_failed",
         "promoted", "exhausted", "reopen")


def _role_conn(db: Database, actor: str) -> psycopg.Connection[Any]:
    conn = db.connect_sync(None, autocommit=True)
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(db.role(actor))))
    return conn


class Accounting(RuleBasedStateMachine):
    seen: Counter[str] = Counter()
    db: Database
    admin: psycopg.Connection[Any]
    conns: dict[str, psycopg.Connection[Any]]

    @initialize(max_attempts=st.sampled_from([1, 2, 3]))
    def start(self, max_attempts: int) -> None:
        self.run = next(_run)
        self.clock = datetime(2031, 1, 1, tzinfo=timezone.utc) + timedelta(days=self.run)
        self.cls = f"accounting-{self.run}"
        self.call("operator", "register_class", p_name=self.cls, p_lease_seconds=LEASE_S,
                  p_max_attempts=max_attempts, p_backoff_base_s=0, p_backoff_jitter=0,
                  p_promotion=Jsonb({"ref": "refs/heads/main", "repository": "/r"}))
        self.keys = itertools.count(1)
        self.campaigns: list[int] = []
        self.charged: dict[int, int] = {}  # the model's attempt_count
        self.given_back: dict[int, int] = {}  # attempts given back (the target moved)
        self.open()

    def open(self) -> None:
        key = f"accounting-{self.run}-{next(self.keys)}"
        row = self.call("sensor", "open_campaign", p_class=self.cls, p_objective_key=key, p_target="t")
        assert row is not None
        self.cid, self.key = row["campaign_id"], key
        self.campaigns.append(self.cid)
        self.charged[self.cid] = 0
        self.given_back[self.cid] = 0

    # --- calling the kernel at the model's clock --------------------------------------

    def call(self, actor: str, function: str, **args: Any) -> dict[str, Any] | None:
        """A kernel function at the pinned clock; None if the kernel refused
        (with a Ledger SQLSTATE: anything else is a failure of the test)."""
        statement = sql.SQL("SELECT * FROM ledger_api.{}({})").format(
            sql.Identifier(function),
            sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in args))
        conn = self.conns[actor]
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('ledger.now', %s, true)", (self.clock.isoformat(),))
                row = conn.execute(statement, args).fetchone()
        except psycopg.Error as exc:
            assert exc.sqlstate and exc.sqlstate.startswith("LG"), f"{function}: unexpected {exc!r}"
            return None
        return dict(row) if row is not None else {}

    def campaign(self) -> dict[str, Any]:
        row = self.admin.execute("SELECT * FROM ledger.campaign WHERE id = %s", (self.cid,)).fetchone()
        assert row is not None
        return dict(row)

    def state(self) -> str:
        return str(self.campaign()["state"])

    def charge(self, by: int, path: str) -> None:
        """A step the kernel accepted, and what it must have charged."""
        self.charged[self.cid] += by
        Accounting.seen[path] += 1
        if self.state() == "exhausted":
            Accounting.seen["exhausted"] += 1

    # --- the worker ------------------------------------------------------------------------

    def lease(self) -> tuple[int, int] | None:
        """The live lease of the campaign, claiming it if it is ready."""
        c = self.campaign()
        if c["state"] == "ready":
            row = self.call("worker", "claim_campaign", p_worker="w", p_classes=[self.cls])
            if not row:
                return None
            c = self.campaign()
        if c["state"] != "leased":
            return None
        return c["id"], c["generation"]

    @rule(seconds=st.sampled_from([1, 5, 40, 400]))
    def time_passes(self, seconds: int) -> None:
        self.clock += timedelta(seconds=seconds)

    def attempt_ends_without_a_candidate(self, how: str) -> None:
        held = self.lease()
        if held is None:
            return
        cid, gen = held
        if how == "fail":
            ok = self.call("worker", "fail_attempt", p_campaign_id=cid, p_generation=gen, p_reason="boom",
                           p_fingerprint=fingerprint(next(_shas)))
            charge = 1
        elif how == "refuse":
            ok = self.call("worker", "refuse_candidate", p_campaign_id=cid, p_generation=gen,
                           p_reason="changes protected paths", p_fingerprint=fingerprint(next(_shas)),
                           p_paths=["tests/test_x.py"])
            charge = 1
        elif how == "release":  # a system fault: the remote down, no sandbox, a config error
            ok = self.call("worker", "release_attempt", p_campaign_id=cid, p_generation=gen,
                           p_reason="cannot fetch refs/heads/main: connection refused")
            charge = 0
        else:  # the worker shut down past its drain budget
            ok = self.call("worker", "fail_attempt", p_campaign_id=cid, p_generation=gen,
                           p_reason="drained: the worker shut down", p_drained=True)
            charge = 0
        assert ok is not None, f"{how} of the live lease was refused"
        self.charge(charge, how)

    def lease_expires(self) -> None:
        held = self.lease()
        if held is None:
            return
        self.clock += timedelta(seconds=LEASE_S + 1)
        rows = self.call("reaper", "expire_leases", p_grace_s=0)
        assert rows is not None
        if self.campaign()["generation"] != held[1]:
            self.charge(1, "expire")

    def candidate_recorded(self) -> None:
        held = self.lease()
        if held is None:
            return
        cid, gen = held
        n = next(_shas)
        ok = self.call("worker", "record_attempt", p_campaign_id=cid, p_generation=gen, p_base_sha=sha(1),
                       p_candidate_sha=sha(n), p_fingerprint=fingerprint(n))
        assert ok is not None
        self.charge(1, "record")

    # --- the verifier -----------------------------------------------------------------------

    def verification(self, verdict: str) -> None:
        if self.state() != "attempted":
            return
        claim = self.call("verifier", "claim_verification", p_verifier="v", p_lease_s=60,
                          p_classes=[self.cls])
        if not claim:
            return  # a released verification waits out its pause
        vid = claim["verification_id"]
        if verdict == "accept":
            assert self.call("verifier", "accept", p_verification_id=vid, p_evidence=Jsonb({})) is not None
            self.charge(0, "accept")
        elif verdict == "reject":
            assert self.call("verifier", "reject", p_verification_id=vid, p_reason="tests fail") is not None
            self.charge(0, "reject")
        else:  # the remote down, the candidate's ref gone, no sandbox on the verifier's host
            assert self.call("verifier", "release_verification", p_verification_id=vid,
                             p_reason="cannot fetch the candidate: connection refused") is not None
            self.charge(0, "release_verification")

    # --- the dispatcher ---------------------------------------------------------------------

    def promotion(self, outcome: str) -> None:
        if self.state() != "verified" or self.campaign()["promoted_at"] is not None:
            return
        claim = self.call("dispatcher", "claim_side_effect", p_dispatcher="d")
        if not claim:
            return  # a waiting promotion waits out its pause
        assert claim["campaign_id"] == self.cid and claim["purpose"] == "promotion"
        ids = {"p_side_effect_id": claim["side_effect_id"], "p_claim_token": claim["claim_token"]}
        if outcome == "done":
            ok = self.call("dispatcher", "complete_side_effect", **ids, p_outcome="done",
                           p_result=Jsonb({"read_back": claim["payload"]["new"]}))
            path, charge = "promoted", 0
        elif outcome in ("wait_fault", "wait_target"):
            on = "system_fault" if outcome == "wait_fault" else "target"
            ok = self.call("dispatcher", "complete_side_effect", **ids, p_outcome="retry",
                           p_result=Jsonb({"waiting_on": on}), p_error="cannot push: connection refused"
                           if on == "system_fault" else "main is checked out with changes", p_retry_after_s=30)
            path, charge = f"promotion_waits_on_{'fault' if on == 'system_fault' else 'target'}", 0
        elif outcome == "conflict":  # the target moved and the candidate does not apply onto it
            ok = self.call("dispatcher", "complete_side_effect", **ids, p_outcome="conflict",
                           p_result=Jsonb({"read_back": sha(9), "expected": sha(1)}),
                           p_error="refs/heads/main moved and the candidate does not apply")
            path, charge = "promote_failed", -1
            self.given_back[self.cid] += 1
        elif outcome == "failed":  # gave up for a reason outside the candidate
            ok = self.call("dispatcher", "complete_side_effect", **ids, p_outcome="failed",
                           p_error="gave up after 8 tries: another writer holds the ref's lock")
            path, charge = "promotion_failed", 0
        else:  # the target moved and the candidate applies onto it: verified again
            attempt_no = self.admin.execute("SELECT max(attempt_no) + 1 AS n FROM ledger.attempt "
                                            "WHERE campaign_id = %s", (self.cid,)).fetchone()["n"]
            new = sha(next(_shas))
            ok = self.call("dispatcher", "rebase_promotion", **ids, p_base_sha=sha(9), p_candidate_sha=new,
                           p_bundle=Jsonb({"attempt_no": attempt_no, "generation": claim["generation"] + 1,
                                           "candidate_sha": new}), p_bundle_digest="sha256:rebased")
            path, charge = "rebase", 0
        assert ok is not None, f"{outcome} of a live promotion was refused"
        self.charge(charge, path)

    # --- the sensor and the operator --------------------------------------------------------

    def red_after_promotion(self) -> None:
        c = self.campaign()
        if c["state"] != "verified" or c["promoted_at"] is None:
            return
        self.clock += timedelta(seconds=1)
        row = self.call("sensor", "record_observation", p_sensor="s", p_objective_key=self.key, p_target="t",
                        p_status="red", p_started_at=self.clock, p_class=self.cls)
        assert row is not None and row["effect"] == "regressed", row
        self.charge(0, "regress")  # the promoted attempt stays charged: its own failure

    def green_after_promotion(self) -> None:
        c = self.campaign()
        if c["state"] != "verified" or c["promoted_at"] is None:
            return
        self.clock += timedelta(seconds=1)
        row = self.call("sensor", "record_observation", p_sensor="s", p_objective_key=self.key, p_target="t",
                        p_status="green", p_started_at=self.clock, p_class=self.cls)
        assert row is not None and row["effect"] == "confirmed", row
        Accounting.seen["confirmed"] += 1
        self.open()

    def reopen(self, extra: int) -> None:
        if self.state() != "exhausted":
            return
        assert self.call("operator", "reopen", p_campaign_id=self.cid, p_operator="op",
                         p_extra_attempts=extra) is not None
        self.charge(0, "reopen")

    def abandon_and_start_over(self) -> None:
        if self.state() not in ("exhausted", "ready"):
            return
        assert self.call("operator", "abandon", p_campaign_id=self.cid, p_reason="enough") is not None
        self.open()

    def teardown(self) -> None:
        """Abandon what this example left open: its pending intents go with it,
        so the next example's dispatcher claims only its own."""
        for cid in getattr(self, "campaigns", []):
            self.cid = cid
            if self.state() not in ("confirmed", "abandoned", "dismissed"):
                assert self.call("operator", "abandon", p_campaign_id=cid, p_reason="example over") is not None

    # --- choosing what happens next --------------------------------------------------

    @rule(choice=st.integers(0, 2**16))
    def something_happens(self, choice: int) -> None:
        """One of the steps the campaign's state allows (when the one it
        needs is not due yet -- a backoff, a released verification's pause, a
        waiting promotion's -- time passes first)."""
        c = self.campaign()
        state, promoted = c["state"], c["promoted_at"] is not None
        if state in ("confirmed", "abandoned", "dismissed"):
            self.open()
            return
        if state in ("ready", "leased"):
            if state == "ready" and c["next_attempt_at"] > self.clock:
                self.clock = c["next_attempt_at"]
            steps: list[Any] = [lambda how=how: self.attempt_ends_without_a_candidate(how)
                                for how in ("fail", "refuse", "release", "drained")]
            steps += [self.lease_expires, self.candidate_recorded, self.candidate_recorded,
                      self.candidate_recorded]
        elif state == "attempted":
            if c["next_attempt_at"] > self.clock:
                self.clock = c["next_attempt_at"]
            steps = [lambda v=v: self.verification(v) for v in ("accept", "accept", "reject", "release")]
        elif state == "verified" and not promoted:
            due = self.admin.execute("SELECT min(next_try_at) AS t FROM ledger.side_effect WHERE campaign_id = %s "
                                     "AND state = 'pending'", (self.cid,)).fetchone()["t"]
            if due is not None and due > self.clock:
                self.clock = due
            steps = [lambda o=o: self.promotion(o) for o in ("done", "done", "wait_fault", "wait_target",
                                                          "conflict", "failed", "rebase")]
        elif state == "verified":
            steps = [self.red_after_promotion, self.red_after_promotion, self.green_after_promotion]
        else:  # exhausted
            steps = [lambda: self.reopen(1), lambda: self.reopen(2), self.abandon_and_start_over]
        steps[choice % len(steps)]()

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def attempts_are_charged_as_the_model_says(self) -> None:
        if not hasattr(self, "campaigns"):
            return
        for row in self.admin.execute("SELECT id, state, attempt_count, max_attempts FROM ledger.campaign "
                                      "WHERE id = ANY(%s)", (self.campaigns,)).fetchall():
            assert row["attempt_count"] == self.charged[row["id"]], (
                f"campaign {row['id']} ({row['state']}) is charged {row['attempt_count']}, the model says "
                f"{self.charged[row['id']]}: a fault that is not the attempt's own was charged, or a "
                "failure was not")
            assert row["attempt_count"] <= row["max_attempts"], row
            assert not (row["state"] == "ready" and row["attempt_count"] >= row["max_attempts"]), (
                f"campaign {row['id']} rests in ready with its attempts spent", row)

    @invariant()
    def agents_attempt_no_more_than_the_budget_allows(self) -> None:
        if not hasattr(self, "campaigns"):
            return
        for row in self.admin.execute("""
                SELECT c.id, c.max_attempts,
                       count(a.*) FILTER (WHERE a.worker = 'w' AND a.outcome IN ('attempted', 'failed', 'lost'))
                           AS made
                  FROM ledger.campaign c LEFT JOIN ledger.attempt a ON a.campaign_id = c.id
                 WHERE c.id = ANY(%s) GROUP BY c.id""", (self.campaigns,)).fetchall():
            bound = row["max_attempts"] + self.given_back[row["id"]]
            assert row["made"] <= bound, (
                f"campaign {row['id']}: agents made {row['made']} attempts, more than its budget "
                f"({row['max_attempts']}) and the {self.given_back[row['id']]} given back when the target "
                "moved: a failure outside the candidate sent it back to be attempted again")

    @invariant()
    def only_a_moved_target_gives_an_attempt_back(self) -> None:
        if not hasattr(self, "campaigns"):
            return
        rows = self.admin.execute("""
            SELECT campaign_id, payload->>'outcome' AS outcome FROM ledger.campaign_event
             WHERE campaign_id = ANY(%s) AND type = 'transition' AND payload->>'transition' = 'promote_failed'
               AND payload->>'outcome' IS DISTINCT FROM 'conflict'""", (self.campaigns,)).fetchall()
        assert rows == [], rows


def test_every_path_back_to_ready_is_accounted_once(db: Database, admin: Admin) -> None:
    conns = {actor: _role_conn(db, actor) for actor in ("sensor", "worker", "reaper", "verifier",
                                                         "dispatcher", "operator")}
    Accounting.db, Accounting.admin, Accounting.conns = db, admin, conns
    Accounting.seen = Counter()
    try:
        run_state_machine_as_test(Accounting, settings=settings(
            max_examples=int(os.environ.get("LEDGER_MODEL_EXAMPLES", "60")), stateful_step_count=40,
            deadline=None, derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    finally:
        for conn in conns.values():
            conn.close()
    seen = Accounting.seen
    print(f"the accounting model took: {sorted(seen.items())}")
    missing = [p for p in PATHS if not seen.get(p)]
    assert not missing, f"never driven down: {missing} (seen {dict(seen)})"


pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")]


@pytest.mark.rollback
async def test_a_promotion_that_failed_outside_the_candidate_waits_and_is_tried_again(actors: Any) -> None:
    """Old main sent the verified candidate back to ready, its attempt given
    back: a promotion failing for a reason of the dispatcher's (a lock it gave
    up on, a crash) made attempts without end. Now it waits, charged nothing,
    and the same candidate lands on the next try."""
    from drive import Driver

    op = await actors("operator")
    await op.register_class("once", max_attempts=1, lease_seconds=30, backoff_base_s=0, backoff_jitter=0,
                            promotion={"ref": "refs/heads/main", "repository": "/r"})
    cid = await Driver(actors, "once").verified()
    dispatcher, reads = await actors("dispatcher"), await actors.reads()
    claim = await dispatcher.claim_side_effect("d")
    assert claim is not None
    said = await dispatcher.complete_side_effect(claim.side_effect_id, claim.claim_token, "failed",
                                                 error="gave up after 8 tries: another writer holds the lock")
    assert said == "pending"
    campaign = await reads.campaign(cid)
    assert (campaign.state, campaign.attempt_count, campaign.waiting_on) == ("verified", 1, "system_fault")
    assert "promotion failed: gave up" in (campaign.waiting_reason or "")
    [effect] = [e for e in await reads.side_effects_of(cid) if e.id == claim.side_effect_id]
    assert (effect.state, effect.tries) == ("pending", 0)
    assert await dispatcher.claim_side_effect("d") is None, "after a pause"
