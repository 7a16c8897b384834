"""Property: random sequences of kernel calls on the real database agree, step
by step, with a small model of the state machine (README "How it works", docs/state_machine.md) (state, generation, attempt
count, refused fingerprints), and the journal stays gap-free with one event per
state change. Time is pinned and advances one second per step."""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from conftest import Admin
from drive import fingerprint, sha
from ledger import Database, IllegalTransition, Kernel, RepeatedApproach, StaleLease

OPEN = {"ready", "leased", "attempted", "verified", "exhausted"}
MAX_ATTEMPTS = 3
LEASE_S = 30


def make_machine(db: Database, loop: asyncio.AbstractEventLoop, sessions: dict, admin: Admin):
    classes = itertools.count(1)

    class CampaignModel(RuleBasedStateMachine):
        @initialize()
        def start(self) -> None:
            self.clock = datetime(2030, 1, 1, tzinfo=timezone.utc)
            self.class_ = f"model-{next(classes)}"
            self.run("operator", lambda k: k.register_class(
                self.class_, max_attempts=MAX_ATTEMPTS, lease_seconds=LEASE_S, backoff_base_s=0,
                backoff_jitter=0))
            opened = self.run("sensor", lambda k: k.open_campaign(self.class_, self.class_, "t"))
            self.cid = opened.campaign_id
            self.state, self.gen, self.count, self.max = "ready", 0, 0, MAX_ATTEMPTS
            self.refused: set[str] = set()
            self.last_fp: str | None = None
            # the ending the current generation wrote: an identical one again
            # (a retry whose reply was lost) returns the first result
            self.ended: tuple[object, ...] | None = None
            self.events = 1

        # -- plumbing -----------------------------------------------------
        def run(self, actor: str, fn, advance: float = 1.0):
            self.clock += timedelta(seconds=advance)

            async def go():
                async with sessions[actor].transaction(now=self.clock) as tx:
                    return await fn(Kernel(tx))
            return loop.run_until_complete(go())

        def moved(self, to: str, *, gen: int = 0, count: int = 0, events: int = 1) -> None:
            self.state, self.gen, self.count = to, self.gen + gen, self.count + count
            self.events += events
            if to == "ready" and self.count >= self.max:
                self.state, self.events = "exhausted", self.events + 1

        # -- rules --------------------------------------------------------
        @rule()
        def claim(self) -> None:
            got = self.run("worker", lambda k: k.claim_campaign("w", [self.class_]))
            if self.state == "ready":
                assert got is not None and got.generation == self.gen + 1
                self.moved("leased", gen=1)
            else:
                assert got is None

        @rule(stale=st.booleans())
        def heartbeat(self, stale: bool) -> None:
            gen = self.gen - 1 if stale else self.gen
            if self.state == "leased" and not stale:
                self.run("worker", lambda k: k.heartbeat(self.cid, gen))
            else:
                with pytest.raises(StaleLease):
                    self.run("worker", lambda k: k.heartbeat(self.cid, gen))

        @rule(n=st.integers(0, 3))
        def record(self, n: int) -> None:
            fp = fingerprint(n)
            call = lambda k: k.record_attempt(self.cid, self.gen, base_sha=sha(1),  # noqa: E731
                                              candidate_sha=sha(10 + n), fingerprint=fp)
            if self.state != "leased":
                if self.ended == ("record", self.gen, n):
                    self.run("worker", call)  # a retried ending: its first result, nothing written
                else:
                    with pytest.raises(StaleLease):
                        self.run("worker", call)
            elif fp in self.refused:
                with pytest.raises(RepeatedApproach):
                    self.run("worker", call)
            else:
                self.run("worker", call)
                self.last_fp = fp
                self.ended = ("record", self.gen, n)
                self.moved("attempted", count=1)

        @rule(n=st.integers(0, 3))
        def fail(self, n: int) -> None:
            call = lambda k: k.fail_attempt(self.cid, self.gen, "failed", fingerprint=fingerprint(n))  # noqa: E731
            if self.state != "leased":
                if self.ended == ("fail", self.gen):
                    self.run("worker", call)  # a retried ending (same reason): nothing written
                else:
                    with pytest.raises(StaleLease):
                        self.run("worker", call)
            else:
                self.run("worker", call)
                self.refused.add(fingerprint(n))
                self.ended = ("fail", self.gen)
                self.moved("ready", count=1)

        @rule()
        def expire(self) -> None:
            reaped = self.run("reaper", lambda k: k.expire_leases(grace_s=5, limit=1000),
                              advance=LEASE_S + 10)
            # The reaper is global: leases of earlier examples go too.
            if self.state == "leased":
                assert self.cid in [r.campaign_id for r in reaped]
                self.moved("ready", gen=1, count=1)
            else:
                assert self.cid not in [r.campaign_id for r in reaped]

        @rule(accept=st.booleans())
        def verdict(self, accept: bool) -> None:
            claim = self.run("verifier", lambda k: k.claim_verification("v", classes=[self.class_]))
            if self.state != "attempted":
                assert claim is None
                return
            assert claim is not None and claim.campaign_id == self.cid
            self.events += 1  # verification.started
            if accept:
                self.run("verifier", lambda k: k.accept(claim.verification_id))
                self.moved("verified")
            else:
                self.run("verifier", lambda k: k.reject(claim.verification_id, "no"))
                self.refused.add(self.last_fp)  # type: ignore[arg-type]
                self.moved("ready")

        @rule()
        def abandon(self) -> None:
            if self.state in OPEN:
                self.run("operator", lambda k: k.abandon(self.cid))
                self.moved("abandoned", gen=1)
            else:
                with pytest.raises(IllegalTransition):
                    self.run("operator", lambda k: k.abandon(self.cid))

        @rule()
        def reopen(self) -> None:
            if self.state == "exhausted":
                self.run("operator", lambda k: k.reopen(self.cid, extra_attempts=2))
                self.max = self.count + 2
                self.moved("ready")
            else:
                with pytest.raises(IllegalTransition):
                    self.run("operator", lambda k: k.reopen(self.cid))

        @rule(green=st.booleans())
        def observe(self, green: bool) -> None:
            if self.state not in OPEN:
                return  # a red one would open a new campaign: outside this model
            result = self.run("sensor", lambda k: k.record_observation(
                "s", self.class_, "t", "green" if green else "red",
                started_at=self.clock - timedelta(seconds=0.5), class_=self.class_))
            # A class without promotion: the verdict is the promotion point.
            expected = {("verified", True): ("confirmed", "confirmed"),
                        ("verified", False): ("ready", "regressed"),
                        ("ready", True): ("dismissed", "dismissed"),
                        ("exhausted", True): ("dismissed", "dismissed")}.get(
                            (self.state, green), (self.state, "recorded"))
            assert result.effect == expected[1]
            if expected[0] != self.state:
                self.moved(expected[0])

        # -- what must always hold ----------------------------------------
        @invariant()
        def database_agrees(self) -> None:
            if not hasattr(self, "cid"):
                return
            row = admin.execute("SELECT state, generation, attempt_count FROM ledger.campaign "
                                "WHERE id = %s", (self.cid,)).fetchone()
            assert row == {"state": self.state, "generation": self.gen, "attempt_count": self.count}
            seqs = [r["seq"] for r in admin.execute(
                "SELECT seq FROM ledger.campaign_event WHERE campaign_id = %s ORDER BY seq", (self.cid,))]
            assert seqs == list(range(1, self.events + 1))
            running = admin.execute("SELECT count(*) AS n FROM ledger.attempt WHERE campaign_id = %s "
                                    "AND outcome = 'running'", (self.cid,)).fetchone()["n"]
            assert running == (1 if self.state == "leased" else 0)

    return CampaignModel


def test_kernel_agrees_with_the_model(db: Database, admin: Admin) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    loop = asyncio.new_event_loop()
    actors = ("sensor", "worker", "reaper", "verifier", "operator")
    sessions = {a: loop.run_until_complete(db.session(a, max_size=1).open()) for a in actors}
    try:
        machine = make_machine(db, loop, sessions, admin)
        run_state_machine_as_test(machine, settings=settings(
            max_examples=40, stateful_step_count=30, deadline=None,
            suppress_health_check=[HealthCheck.too_slow]))
    finally:
        for s in sessions.values():
            loop.run_until_complete(s.close())
        loop.close()
