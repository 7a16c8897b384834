"""The transition table (README "How it works"), row by row, on the real database: each transition is legal
for its owner and refused (Forbidden) for every other role; illegal moves and
moves out of terminal states are refused (IllegalTransition)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

import psycopg
import pytest

from conftest import Actors, Admin
from drive import APPROVING_CLASS, PROMOTING_CLASS, Driver, fingerprint, new_key, now, sha
from ledger import Forbidden, IllegalTransition, Kernel, StaleLease

# Only SQL on one connection: each test runs in a transaction rolled back after it.
pytestmark = [pytest.mark.anyio, pytest.mark.rollback]

ROLES = ("sensor", "worker", "reaper", "verifier", "dispatcher", "operator", "reader")
#: Who may perform a transition owned by an actor: its role and its members.
ALLOWED = {
    "sensor": {"sensor"},
    "worker": {"worker"},
    "reaper": {"reaper", "worker"},  # every worker process runs a reaper loop
    "verifier": {"verifier"},
    "dispatcher": {"dispatcher"},
    "operator": {"operator"},
}

#: The README's transition table, written out independently of the migration.
TRANSITIONS = {
    ("open", None, "ready", "sensor"),
    ("claim", "ready", "leased", "worker"),
    ("record_attempt", "leased", "attempted", "worker"),
    ("fail_attempt", "leased", "ready", "worker"),
    ("release", "leased", "ready", "worker"),
    ("expire_lease", "leased", "ready", "reaper"),
    ("accept", "attempted", "verified", "verifier"),
    ("reject", "attempted", "ready", "verifier"),
    ("promote_failed", "verified", "ready", "dispatcher"),
    ("rebase", "verified", "attempted", "dispatcher"),
    ("requeue", "attempted", "verified", "verifier"),  # the merge queue's failed stack (docs/merge-queue.md)
    ("confirm", "verified", "confirmed", "sensor"),
    ("regress", "verified", "ready", "sensor"),
    ("dismiss", "ready", "dismissed", "sensor"),
    ("dismiss", "exhausted", "dismissed", "sensor"),
    ("dismiss", "leased", "dismissed", "worker"),  # its lease holder re-observed the target green
    ("exhaust", "ready", "exhausted", "system"),
    ("reopen", "exhausted", "ready", "operator"),
    *{("abandon", s, "abandoned", "operator")
      for s in ("ready", "leased", "attempted", "verified", "awaiting_approval", "exhausted",
                "budget_exhausted")},
    # budgets (docs/limits.md)
    ("exhaust_budget", "ready", "budget_exhausted", "system"),
    ("raise_budget", "budget_exhausted", "ready", "operator"),
    # approval before promotion (docs/approval.md)
    ("request_approval", "verified", "awaiting_approval", "system"),
    ("approve", "awaiting_approval", "verified", "operator"),
    ("deny", "awaiting_approval", "ready", "operator"),
    ("approve_on_timeout", "awaiting_approval", "verified", "system"),
    ("deny_on_timeout", "awaiting_approval", "ready", "system"),
    ("abandon_on_timeout", "awaiting_approval", "abandoned", "system"),
}


@pytest.fixture
async def classes(actors: Actors) -> None:
    op = await actors("operator")
    await op.register_class("test", max_attempts=3, lease_seconds=30, backoff_base_s=0)
    await op.register_class("single", max_attempts=1, lease_seconds=30, backoff_base_s=0)
    await op.register_class(PROMOTING_CLASS, max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": "/nowhere"})
    await op.register_class(APPROVING_CLASS, max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": "/nowhere"},
                            approval={"mode": "always"})


async def test_transition_table_is_design_section_2(actors: Actors) -> None:
    rows = await (await actors.reads()).transitions()
    assert {(r.name, r.from_state, r.to_state, r.owner_role) for r in rows} == TRANSITIONS


@dataclass
class Case:
    name: str
    from_state: str | None
    owner: str
    class_: str
    setup: Callable[[Driver], Awaitable[dict]]
    act: Callable[[Driver, dict, str], Awaitable[int]]


async def _none(d: Driver) -> dict:
    return {}


async def _ready(d: Driver) -> dict:
    return {"cid": await d.open()}


async def _leased(d: Driver) -> dict:
    cid, gen = await d.leased()
    return {"cid": cid, "gen": gen}


async def _attempted(d: Driver) -> dict:
    cid, gen = await d.attempted()
    return {"cid": cid, "gen": gen}


async def _verifying(d: Driver) -> dict:
    cid, vid = await d.verifying()
    return {"cid": cid, "vid": vid}


async def _verified(d: Driver) -> dict:
    return {"cid": await d.verified()}


async def _promoted(d: Driver) -> dict:
    cid = await d.promoted()
    return {"cid": cid, "key": (await (await d.reads("reader")).campaign(cid)).objective_key}


async def _promotion_claimed(d: Driver) -> dict:
    cid = await d.verified()
    claim = await (await d.k("dispatcher")).claim_side_effect("dispatcher-1")
    assert claim is not None
    return {"cid": cid, "effect": claim.side_effect_id, "token": claim.claim_token}


async def _stack_probed(d: Driver) -> dict:
    """Two verified promotions queued for one target, stacked as a merge batch
    whose probe (the second) is being verified."""
    first, second = await d.verified(), await d.verified()
    dispatcher = await d.k("dispatcher")
    claim = await dispatcher.claim_side_effect("dispatcher-1")
    assert claim is not None and claim.campaign_id == first
    probe = await (await d.reads("reader")).campaign(second)
    bundle = {"attempt_no": 2, "generation": probe.generation + 1, "candidate_sha": sha(6)}
    await dispatcher.merge_queue_stack(
        claim.side_effect_id, claim.claim_token, base_sha=sha(9), members=[first, second],
        generations=[claim.generation, probe.generation], stack=[sha(5), sha(6)],
        changes=[{"old": sha(1), "new": sha(2)}, {"old": sha(1), "new": sha(3)}], suspect=None,
        bundle=bundle, bundle_digest="sha256:x", diff=b"", candidate_ref="refs/heads/ledger/x/2")
    check = await (await d.k("verifier")).claim_verification("verifier-2")
    assert check is not None and check.campaign_id == second
    return {"cid": second, "vid": check.verification_id}


async def act_requeue(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).reject(s["vid"], "the stack's tests fail")
    return s["cid"]


async def _exhausted(d: Driver) -> dict:
    return {"cid": await d.exhausted()}


async def _budget_exhausted(d: Driver) -> dict:
    await (await d.k("operator")).set_class_limits(d.class_, max_cost=1.0)
    cid, gen = await d.leased()
    worker = await d.k("worker")
    await worker.report_usage(cid, gen, tokens_in=10, cost=1.5, key="u1")
    await worker.fail_attempt(cid, gen, "it broke")
    return {"cid": cid}


async def _as(d: Driver, role: str) -> Kernel:
    return await d.k(role)


async def act_open(d: Driver, s: dict, role: str) -> int:
    opened = await (await _as(d, role)).open_campaign(d.class_, new_key(), "target-1")
    return opened.campaign_id


async def act_claim(d: Driver, s: dict, role: str) -> int:
    claim = await (await _as(d, role)).claim_campaign("worker-x", [d.class_])
    assert claim is not None
    return claim.campaign_id


async def act_record(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).record_attempt(s["cid"], s["gen"], base_sha=sha(1),
                                              candidate_sha=sha(2), fingerprint=fingerprint(7))
    return s["cid"]


async def act_fail(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).fail_attempt(s["cid"], s["gen"], "it broke")
    return s["cid"]


async def act_release(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).release_attempt(s["cid"], s["gen"], "the remote is down")
    return s["cid"]


async def act_expire(d: Driver, s: dict, role: str) -> int:
    await d.k(role)
    session = d.actors.session(role)
    # Judge the lease at a pinned instant well past its expiry.
    async with session.transaction(now=now() + timedelta(minutes=10)) as tx:
        reaped = await Kernel(tx).expire_leases(grace_s=1)
    assert [r.campaign_id for r in reaped] == [s["cid"]]
    return s["cid"]


async def act_accept(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).accept(s["vid"], {"checked": True})
    return s["cid"]


async def act_reject(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).reject(s["vid"], "tests fail", {"exit": 1})
    return s["cid"]


async def act_promote_failed(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).complete_side_effect(s["effect"], s["token"], "conflict",
                                                    result={"actual": sha(9)}, error="ref moved")
    return s["cid"]


async def act_rebase(d: Driver, s: dict, role: str) -> int:
    campaign = await (await d.reads("reader")).campaign(s["cid"])
    bundle = {"attempt_no": 2, "generation": campaign.generation + 1, "candidate_sha": sha(3)}
    await (await _as(d, role)).rebase_promotion(s["effect"], s["token"], base_sha=sha(9),
                                                candidate_sha=sha(3), bundle=bundle,
                                                bundle_digest="sha256:x", evidence_location="/e")
    return s["cid"]


def _observe(status: str):
    async def act(d: Driver, s: dict, role: str) -> int:
        key = s.get("key") or (await (await d.reads("reader")).campaign(s["cid"])).objective_key
        result = await (await _as(d, role)).record_observation(
            "sensor-1", key, "target-1", status, started_at=now(), class_=d.class_)
        assert result.campaign_id == s["cid"]
        return s["cid"]
    return act


async def act_reobserve_green(d: Driver, s: dict, role: str) -> int:
    result = await (await _as(d, role)).reobserve(s["cid"], s["gen"], "sensor-1", "green", now(),
                                                  moment="changed_nothing")
    assert result.effect == "dismissed"
    return s["cid"]


async def act_reopen(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).reopen(s["cid"])
    return s["cid"]


async def act_approve(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).approve(s["cid"], "operator-1", "looks right")
    return s["cid"]


async def act_deny(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).deny(s["cid"], "operator-1", "not this way")
    return s["cid"]


async def act_raise_budget(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).raise_budget(s["cid"], 5.0, operator="operator-1", reason="worth it")
    return s["cid"]


async def act_abandon(d: Driver, s: dict, role: str) -> int:
    await (await _as(d, role)).abandon(s["cid"], "no longer needed")
    return s["cid"]


CASES = [
    Case("open", None, "sensor", "test", _none, act_open),
    Case("claim", "ready", "worker", "test", _ready, act_claim),
    Case("record_attempt", "leased", "worker", "test", _leased, act_record),
    Case("fail_attempt", "leased", "worker", "test", _leased, act_fail),
    Case("release", "leased", "worker", "test", _leased, act_release),
    Case("expire_lease", "leased", "reaper", "test", _leased, act_expire),
    Case("accept", "attempted", "verifier", "test", _verifying, act_accept),
    Case("reject", "attempted", "verifier", "test", _verifying, act_reject),
    Case("promote_failed", "verified", "dispatcher", PROMOTING_CLASS, _promotion_claimed,
         act_promote_failed),
    Case("rebase", "verified", "dispatcher", PROMOTING_CLASS, _promotion_claimed, act_rebase),
    Case("requeue", "attempted", "verifier", PROMOTING_CLASS, _stack_probed, act_requeue),
    Case("confirm", "verified", "sensor", PROMOTING_CLASS, _promoted, _observe("green")),
    Case("regress", "verified", "sensor", PROMOTING_CLASS, _promoted, _observe("red")),
    Case("dismiss", "ready", "sensor", "test", _ready, _observe("green")),
    Case("dismiss", "exhausted", "sensor", "single", _exhausted, _observe("green")),
    Case("dismiss", "leased", "worker", "test", _leased, act_reobserve_green),
    Case("reopen", "exhausted", "operator", "single", _exhausted, act_reopen),
    Case("abandon", "ready", "operator", "test", _ready, act_abandon),
    Case("abandon", "leased", "operator", "test", _leased, act_abandon),
    Case("abandon", "attempted", "operator", "test", _attempted, act_abandon),
    Case("abandon", "verified", "operator", "test", _verified, act_abandon),
    Case("abandon", "exhausted", "operator", "single", _exhausted, act_abandon),
    Case("approve", "awaiting_approval", "operator", APPROVING_CLASS, _verified, act_approve),
    Case("deny", "awaiting_approval", "operator", APPROVING_CLASS, _verified, act_deny),
    Case("abandon", "awaiting_approval", "operator", APPROVING_CLASS, _verified, act_abandon),
    Case("raise_budget", "budget_exhausted", "operator", "test", _budget_exhausted, act_raise_budget),
    Case("abandon", "budget_exhausted", "operator", "test", _budget_exhausted, act_abandon),
]
#: Transitions no role asks for: they follow from another one inside the
#: kernel (tests/test_approval.py covers the approval ones).
SYSTEM_ONLY = {("exhaust", "ready"), ("request_approval", "verified"), ("exhaust_budget", "ready"),
               ("approve_on_timeout", "awaiting_approval"), ("deny_on_timeout", "awaiting_approval"),
               ("abandon_on_timeout", "awaiting_approval")}


def test_every_design_row_has_a_case() -> None:
    covered = {(c.name, c.from_state) for c in CASES} | SYSTEM_ONLY
    assert covered == {(name, src) for name, src, _, _ in TRANSITIONS}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.name}-from-{c.from_state}")
async def test_transition_is_legal_for_its_owner_only(actors: Actors, classes: None, admin: Admin, case: Case) -> None:
    d = Driver(actors, case.class_)
    state = await case.setup(d)
    to_state = next(t for n, f, t, _ in TRANSITIONS if n == case.name and f == case.from_state)
    before = _snapshot(admin)

    for role in ROLES:
        if role in ALLOWED[case.owner]:
            continue
        with pytest.raises(Forbidden):
            await case.act(d, state, role)
    assert _snapshot(admin) == before, "a refused call changed something"

    owner_role = sorted(ALLOWED[case.owner])[0] if case.owner != "reaper" else "reaper"
    cid = await case.act(d, state, owner_role)
    campaign = await (await d.reads("reader")).campaign(cid)
    assert campaign.state == to_state
    events = await (await d.reads("reader")).events(cid)
    transitions = [e.payload["transition"] for e in events if e.type == "transition"]
    assert transitions[-1] == case.name


def _snapshot(admin: Admin) -> tuple:
    """Everything a refused call could have touched."""
    return (
        admin.execute("SELECT id, state, generation, event_seq, updated_at FROM ledger.campaign ORDER BY id").fetchall(),
        admin.execute("SELECT count(*) FROM ledger.campaign_event").fetchone(),
        admin.execute("SELECT id, outcome, verdict FROM ledger.attempt ORDER BY id").fetchall(),
        admin.execute("SELECT id, status FROM ledger.verification ORDER BY id").fetchall(),
        admin.execute("SELECT id, state FROM ledger.side_effect ORDER BY id").fetchall(),
        admin.execute("SELECT count(*) FROM ledger.observation").fetchone(),
    )


async def test_worker_role_can_reap_as_member_of_reaper(actors: Actors, classes: None) -> None:
    d = Driver(actors, "test")
    state = await _leased(d)
    assert await act_expire(d, state, "worker") == state["cid"]


async def test_exhaust_is_performed_by_the_system_only(actors: Actors, classes: None, admin: Admin) -> None:
    d = Driver(actors, "single")
    cid = await d.exhausted()
    events = await (await d.reads("reader")).events(cid)
    last = events[-1]
    assert (last.payload["transition"], last.actor) == ("exhaust", "system")
    assert [e.payload["transition"] for e in events] == ["open", "claim", "fail_attempt", "exhaust"]
    # Nobody can ask for it: there is no function, and a direct write is refused.
    cid2 = await d.open()
    with pytest.raises(psycopg.Error) as err:
        admin.execute("UPDATE ledger.campaign SET state = 'exhausted' WHERE id = %s", (cid2,))
    assert err.value.sqlstate == "LG002"


async def test_illegal_moves_are_refused(actors: Actors, classes: None, admin: Admin) -> None:
    d = Driver(actors, "test")
    op = await d.k("operator")
    cid = await Driver(actors, "single").open()  # kept out of the way of d's claims
    with pytest.raises(IllegalTransition):
        await op.reopen(cid)  # ready -> ready is not reopen
    # A direct write, even by a superuser, must name a transition that exists.
    for stmt, params in [
        ("UPDATE ledger.campaign SET state = 'verified' WHERE id = %s", (cid,)),
        ("UPDATE ledger.campaign SET state = 'confirmed' WHERE id = %s", (cid,)),
    ]:
        with pytest.raises(psycopg.Error) as err:
            admin.execute(stmt, params)
        assert err.value.sqlstate == "LG002"
    # Declaring one transition and performing another is refused too.
    with admin.transaction():
        admin.execute("SELECT ledger.begin_transition('claim', 'worker', 'w')")
        with pytest.raises(psycopg.Error) as err:
            with admin.transaction():
                admin.execute("UPDATE ledger.campaign SET state = 'attempted' WHERE id = %s", (cid,))
        assert err.value.sqlstate == "LG002"
    # A transition declared by the wrong actor is refused.
    att, _ = await d.attempted(n=3)
    with admin.transaction():
        admin.execute("SELECT ledger.begin_transition('accept', 'worker', 'w')")
        with pytest.raises(psycopg.Error) as err:
            with admin.transaction():
                admin.execute("UPDATE ledger.campaign SET state = 'verified' WHERE id = %s", (att,))
        assert err.value.sqlstate == "LG003"
    # Generation never decreases.
    with pytest.raises(psycopg.Error) as err:
        admin.execute("UPDATE ledger.campaign SET generation = generation - 1 WHERE id = %s", (att,))
    assert err.value.sqlstate == "LG002"
    row = admin.execute("SELECT state, generation FROM ledger.campaign WHERE id = %s", (att,)).fetchone()
    assert row == {"state": "attempted", "generation": 1}


@pytest.mark.parametrize("terminal", ["abandoned", "dismissed", "confirmed"])
async def test_terminal_states_are_sticky(actors: Actors, classes: None, admin: Admin, terminal: str) -> None:
    d = Driver(actors, PROMOTING_CLASS)
    sensor, op, worker = await d.k("sensor"), await d.k("operator"), await d.k("worker")
    if terminal == "abandoned":
        cid, _ = await d.leased()
        await op.abandon(cid)
    elif terminal == "dismissed":
        cid = await d.open()
        key = (await (await d.reads("reader")).campaign(cid)).objective_key
        await sensor.record_observation("s", key, "target-1", "green", started_at=now())
    else:
        cid = await d.promoted()
        key = (await (await d.reads("reader")).campaign(cid)).objective_key
        await sensor.record_observation("s", key, "target-1", "green", started_at=now())
    campaign = await (await d.reads("reader")).campaign(cid)
    assert campaign.state == terminal and campaign.closed_at is not None

    with pytest.raises(IllegalTransition):
        await op.abandon(cid)
    with pytest.raises(StaleLease):
        await worker.heartbeat(cid, campaign.generation)
    for column, value in [("state", "ready"), ("generation", 99), ("priority", 5), ("labels", ["x"])]:
        with pytest.raises(psycopg.Error) as err:
            admin.execute(f"UPDATE ledger.campaign SET {column} = %s WHERE id = %s", (value, cid))
        assert err.value.sqlstate == "LG002"
    after = await (await d.reads("reader")).campaign(cid)
    assert after == campaign
