"""Approval before promotion (docs/approval.md), on the real
database: a class's policy sends a verified candidate to awaiting_approval
with the conditions that asked; nothing is leased or promoted while it
waits; the operator role -- never the identity that made the attempt --
approves (its promotion is requested with the frozen landing) or denies
(back to ready as a rejection, or abandoned); the class's timeout decides as
the system; a decision is final and applied once; the notice is an outbox
intent that a dispatcher of a release before approvals is never handed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from conftest import Actors, Admin, AsRole
from drive import Driver, fingerprint, now, sha
from ledger import Forbidden, IllegalTransition, Kernel
from ledger.errors import InvalidInput, RepeatedApproach, SameIdentity

pytestmark = [pytest.mark.anyio, pytest.mark.rollback]

PROMOTION = {"ref": "refs/heads/main", "repository": "/nowhere"}
#: What the verifier measures of a small change (evidence.change)
SMALL = {"files": 1, "lines": 4, "added": 3, "removed": 1, "paths": ["src/app.py"],
         "paths_truncated": False, "protected": []}


async def register(actors: Actors, name: str, approval: dict[str, Any], *, promote: bool = True,
                   **settings: Any) -> Driver:
    op = await actors("operator")
    await op.register_class(name, max_attempts=settings.pop("max_attempts", 3), lease_seconds=30,
                            backoff_base_s=0, promotion=PROMOTION if promote else {},
                            approval=approval, **settings)
    return Driver(actors, name)


async def verify(d: Driver, evidence: dict[str, Any] | None = None, *, worker: str = "worker-1",
                 n: int = 1) -> tuple[int, int | None]:
    """Open, attempt and accept a candidate; returns the campaign and what accept returned."""
    cid = await d.open()
    worker_k = await d.k("worker")
    claim = await worker_k.claim_campaign(worker, [d.class_])
    assert claim is not None and claim.campaign_id == cid
    await worker_k.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(100 + n),
                                  fingerprint=fingerprint(n))
    verifier = await d.k("verifier")
    check = await verifier.claim_verification("verifier-1", classes=[d.class_])
    assert check is not None and check.campaign_id == cid
    effect = await verifier.accept(check.verification_id, {"summary": "tests pass",
                                                           "change": SMALL, **(evidence or {})})
    return cid, effect


def rows(admin: Admin, query: str, *params: Any) -> list[dict[str, Any]]:
    return admin.execute(query, params).fetchall()


async def test_a_verified_candidate_waits_for_a_person_holding_nothing(actors: Actors, admin: Admin) -> None:
    d = await register(actors, "guarded", {"mode": "always", "timeout_s": 3600, "on_timeout": "deny"})
    cid, effect = await verify(d)
    assert effect is None, "accept requested no promotion"
    reads = await d.reads()
    c = await reads.campaign(cid)
    assert c.state == "awaiting_approval"
    assert (c.lease_owner, c.lease_expires_at, c.promoted_at) == (None, None, None)
    assert rows(admin, "SELECT count(*) AS n FROM ledger.side_effect WHERE campaign_id = %s", cid)[0]["n"] == 0
    assert rows(admin, "SELECT count(*) AS n FROM ledger.verification WHERE campaign_id = %s "
                       "AND status = 'running'", cid)[0]["n"] == 0
    [attempt] = await reads.attempts_of(cid)
    assert attempt.outcome == "attempted" and attempt.verdict is None, "the verdict waits for the person"
    [approval] = await reads.approvals_of(cid)
    assert [r.condition for r in approval.reasons] == ["always"]
    assert approval.decision is None and approval.on_timeout == "deny"
    assert approval.deadline is not None
    assert 3590 < (approval.deadline - approval.requested_at).total_seconds() <= 3600
    assert approval.promotion is not None and approval.promotion["target"] == "refs/heads/main"
    events = await reads.events(cid)
    assert [e.payload.get("transition") for e in events if e.type == "transition"][-2:] == \
        ["accept", "request_approval"]
    asked = [e for e in events if e.payload.get("transition") == "request_approval"][0]
    assert asked.actor == "system" and asked.payload["reasons"][0]["condition"] == "always"
    # the dispatcher has nothing to promote
    assert await (await d.k("dispatcher")).claim_side_effect("dispatcher-1") is None
    waiting = await reads.approvals_waiting()
    assert [(w.campaign_id, w.class_) for w in waiting] == [(cid, "guarded")]


async def test_approval_requests_the_frozen_promotion_and_journals_the_operator(
        actors: Actors, admin: Admin) -> None:
    d = await register(actors, "guarded", {"mode": "always"})
    cid, _ = await verify(d)
    reads = await d.reads()
    frozen = (await reads.approvals_of(cid))[0].promotion
    decided = await (await d.k("operator")).approve(cid, "cli:alice@desk", "read the diff, fine")
    assert (decided.decision, decided.state) == ("approved", "verified")
    assert decided.side_effect_id is not None
    [intent] = await reads.side_effects_of(cid)
    assert intent.id == decided.side_effect_id
    assert (intent.purpose, intent.kind, intent.target) == ("promotion", "git.update_ref", "refs/heads/main")
    assert frozen is not None and intent.payload == frozen["payload"]
    assert intent.idempotency_key == frozen["idempotency_key"]
    assert (intent.requested_by, intent.requested_role) == ("cli:alice@desk", "operator")
    [approval] = await reads.approvals_of(cid)
    assert (approval.decision, approval.decided_by, approval.decided_role, approval.decision_reason,
            approval.decided_by_transition, approval.side_effect_id) == (
        "approved", "cli:alice@desk", "operator", "read the diff, fine", "approve", intent.id)
    [attempt] = await reads.attempts_of(cid)
    assert attempt.verdict == "accepted"
    last = [e for e in await reads.events(cid) if e.type == "transition"][-1]
    assert (last.payload["transition"], last.actor, last.actor_role) == ("approve", "cli:alice@desk", "operator")
    assert last.payload["reason"] == "read the diff, fine"
    # now the dispatcher is handed the promotion
    claim = await (await d.k("dispatcher")).claim_side_effect("dispatcher-1")
    assert claim is not None and claim.side_effect_id == intent.id


async def test_the_identity_that_made_the_attempt_cannot_decide(actors: Actors, admin: Admin) -> None:
    d = await register(actors, "guarded", {"mode": "always"})
    cid, _ = await verify(d, worker="agent-7")
    op = await d.k("operator")
    with pytest.raises(SameIdentity):
        await op.approve(cid, "agent-7")
    with pytest.raises(SameIdentity):
        await op.deny(cid, "agent-7", "I changed my mind")
    assert (await (await d.reads()).campaign(cid)).state == "awaiting_approval"
    with pytest.raises(InvalidInput):
        await op.approve(cid, "")  # a decision names who made it


async def test_denial_sends_it_back_as_a_rejection_with_its_approach_refused(actors: Actors) -> None:
    d = await register(actors, "guarded", {"mode": "always"})
    cid, _ = await verify(d)
    op = await d.k("operator")
    with pytest.raises(InvalidInput):
        await op.deny(cid, "cli:bob@desk", "  ")  # a denial says why
    decided = await op.deny(cid, "cli:bob@desk", "it disables the check instead of fixing it")
    assert (decided.decision, decided.state, decided.side_effect_id) == ("denied", "ready", None)
    reads = await d.reads()
    c = await reads.campaign(cid)
    assert c.state == "ready" and c.last_failure_reason == "denied: it disables the check instead of fixing it"
    [attempt] = await reads.attempts_of(cid)
    # the next attempt is told of it as of a rejection (ledger.protocol PreviousAttempt)
    assert attempt.verdict == "rejected"
    assert attempt.failure_reason == "denied by cli:bob@desk: it disables the check instead of fixing it"
    worker = await d.k("worker")
    claim = await worker.claim_campaign("worker-2", [d.class_])
    assert claim is not None and claim.campaign_id == cid
    with pytest.raises(RepeatedApproach):
        await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(500),
                                    fingerprint=fingerprint(1))


async def test_denial_may_abandon_and_a_plain_abandon_decides_too(actors: Actors) -> None:
    d = await register(actors, "guarded", {"mode": "always"})
    op = await d.k("operator")
    first, _ = await verify(d, n=1)
    decided = await op.deny(first, "cli:bob@desk", "not wanted", abandon=True)
    assert (decided.decision, decided.state) == ("abandoned", "abandoned")
    second, _ = await verify(d, n=2)
    await op.abandon(second, "no longer needed", "cli:carol@desk")
    reads = await d.reads()
    for cid, by, transition in ((first, "cli:bob@desk", "abandon"), (second, "cli:carol@desk", "abandon")):
        c = await reads.campaign(cid)
        assert c.state == "abandoned" and c.generation == 2
        [approval] = await reads.approvals_of(cid)
        assert (approval.decision, approval.decided_by, approval.decided_by_transition) == (
            "abandoned", by, transition)


async def test_a_decision_is_final_and_applied_once(actors: Actors, admin: Admin) -> None:
    d = await register(actors, "guarded", {"mode": "always"})
    cid, _ = await verify(d)
    op = await d.k("operator")
    first = await op.approve(cid, "cli:alice@desk")
    # the same decision, retried (its reply lost): the same answer, nothing twice
    assert await op.approve(cid, "cli:alice@desk") == first
    with pytest.raises(IllegalTransition):
        await op.approve(cid, "cli:bob@desk")
    with pytest.raises(IllegalTransition):
        await op.deny(cid, "cli:alice@desk", "too late")
    assert rows(admin, "SELECT count(*) AS n FROM ledger.side_effect WHERE campaign_id = %s", cid)[0]["n"] == 1
    assert len([e for e in await (await d.reads()).events(cid)
                if e.payload.get("transition") == "approve"]) == 1
    with pytest.raises(psycopg.Error) as refused:
        admin.execute("UPDATE ledger.approval SET decision = 'denied' WHERE campaign_id = %s", (cid,))
    assert refused.value.sqlstate == "LG009"
    with pytest.raises(psycopg.Error) as refused:
        admin.execute("DELETE FROM ledger.approval WHERE campaign_id = %s", (cid,))
    assert refused.value.sqlstate == "LG009"


async def test_nothing_is_promoted_without_an_approval(actors: Actors, admin: Admin) -> None:
    d = await register(actors, "guarded", {"mode": "always"})
    cid, _ = await verify(d)
    insert = ("INSERT INTO ledger.side_effect (campaign_id, generation, kind, purpose, target, "
              "idempotency_key, requested_by, requested_role, next_try_at, created_at, updated_at) "
              "SELECT id, generation, 'git.update_ref', 'promotion', 'refs/heads/main', %s, 'x', 'verifier', "
              "now(), now(), now() FROM ledger.campaign WHERE id = %s")
    with pytest.raises(psycopg.Error) as refused:
        admin.execute(insert, ("sneaky-1", cid))
    assert refused.value.sqlstate == "LG002"
    await (await d.k("operator")).deny(cid, "cli:bob@desk", "no")
    with pytest.raises(psycopg.Error) as refused:
        admin.execute(insert, ("sneaky-2", cid))
    assert refused.value.sqlstate == "LG002"
    # nor does a campaign await approval without one (a legal transition else)
    other, _ = await verify(await register(actors, "free", {}), n=2)
    with pytest.raises(psycopg.Error) as refused:
        admin.execute("SELECT ledger.begin_transition('request_approval', 'system', 'x')")
        admin.execute("UPDATE ledger.campaign SET state = 'awaiting_approval' WHERE id = %s", (other,))
    assert refused.value.sqlstate == "LG002" and "open approval" in str(refused.value)


@pytest.mark.parametrize("on_timeout, state, decision", [
    ("deny", "ready", "denied"), ("abandon", "abandoned", "abandoned"), ("approve", "verified", "approved")])
async def test_the_timeout_decides_as_the_class_says(actors: Actors, on_timeout: str, state: str,
                                                     decision: str) -> None:
    d = await register(actors, "timed", {"mode": "always", "timeout_s": 60, "on_timeout": on_timeout})
    cid, _ = await verify(d)
    await d.k("reaper")
    reaper = actors.session("reaper")
    async with reaper.transaction(now=now() + timedelta(seconds=30)) as tx:
        assert await Kernel(tx).expire_approvals() == [], "not before its deadline"
    async with reaper.transaction(now=now() + timedelta(seconds=61)) as tx:
        expired = await Kernel(tx).expire_approvals()
    assert [(e.campaign_id, e.decision, e.state) for e in expired] == [(cid, decision, state)]
    reads = await d.reads()
    [approval] = await reads.approvals_of(cid)
    assert (approval.decision, approval.decided_by, approval.decided_role) == (decision, "system", "system")
    assert approval.decided_by_transition == f"{on_timeout}_on_timeout"
    assert "no decision within 60" in (approval.decision_reason or "")
    last = [e for e in await reads.events(cid) if e.type == "transition"][-1]
    assert (last.payload["transition"], last.actor) == (f"{on_timeout}_on_timeout", "system")
    effects = await reads.side_effects_of(cid)
    assert [e.purpose for e in effects] == (["promotion"] if on_timeout == "approve" else [])
    # decided once: a second pass finds nothing
    async with reaper.transaction(now=now() + timedelta(seconds=120)) as tx:
        assert await Kernel(tx).expire_approvals() == []


async def test_only_the_reaper_role_times_approvals_out(actors: Actors) -> None:
    d = await register(actors, "timed", {"mode": "always", "timeout_s": 1})
    await verify(d)
    for role in ("sensor", "verifier", "dispatcher", "operator", "reader"):
        with pytest.raises(Forbidden):
            await (await d.k(role)).expire_approvals()
    # the worker role is a member of the reaper role (every worker process reaps)
    await (await d.k("worker")).expire_approvals()


async def test_a_class_that_promotes_nothing_is_promoted_by_the_approval(actors: Actors) -> None:
    d = await register(actors, "local", {"mode": "always"}, promote=False)
    cid, _ = await verify(d)
    reads = await d.reads()
    assert (await reads.campaign(cid)).promoted_at is None, "not before a person approved"
    decided = await (await d.k("operator")).approve(cid, "cli:alice@desk")
    assert decided.side_effect_id is None
    c = await reads.campaign(cid)
    assert c.state == "verified" and c.promoted_at is not None and c.promoted_sha == sha(101)


CONDITIONS: list[tuple[dict[str, Any], dict[str, Any], str | None]] = [
    # (condition, the verdict's extra evidence, the detail it gives, or None: no approval)
    ({"diff_lines_over": 100}, {"change": {**SMALL, "lines": 101}}, "its diff changes 101 lines (more than 100)"),
    ({"diff_lines_over": 100}, {"change": {**SMALL, "lines": 100}}, None),
    ({"paths": ["migrations/*", "*.sql"]}, {"change": {**SMALL, "paths": ["src/a.py", "db/x.sql"]}},
     "it touches db/x.sql (*.sql)"),
    ({"paths": ["migrations/*"]}, {}, None),
    ({"paths": ["migrations/*"]}, {"change": {**SMALL, "paths_truncated": True}},
     "it changes more paths than were listed: a person looks"),
    ({"protected_paths": True}, {"change": {**SMALL, "protected": ["checks/test_a.py"]}},
     "it changes protected paths: checks/test_a.py"),
    ({"protected_paths": True}, {}, None),
    ({"quorum_split": True}, {"needs_human": "it changes the public API"},
     "command verdict by verifier-1 asks for a person: it changes the public API"),
    ({"quorum_split": True}, {}, None),
    ({"targets": ["refs/heads/main"]}, {}, "it promotes onto refs/heads/main (refs/heads/main)"),
    ({"targets": ["refs/heads/release/*"]}, {}, None),
    ({"first_promotions": 1}, {}, "promotion 1 of the class's first 1"),
    ({"attempts_over": 1}, {}, None),
    # a verdict of an older release measured nothing: a person looks
    ({"diff_lines_over": 100}, {"change": None}, "no verdict measured the change (a verifier of an older release?): a person looks"),
]


@pytest.mark.parametrize("condition, evidence, detail", CONDITIONS)
async def test_each_condition_says_what_asked(actors: Actors, condition: dict[str, Any],
                                              evidence: dict[str, Any], detail: str | None) -> None:
    d = await register(actors, "conditional", {"mode": "when", "when": [condition]})
    cid, effect = await verify(d, evidence)
    reads = await d.reads()
    approvals = await reads.approvals_of(cid)
    if detail is None:
        assert approvals == [] and effect is not None
        assert (await reads.campaign(cid)).state == "verified"
    else:
        assert effect is None and (await reads.campaign(cid)).state == "awaiting_approval"
        [approval] = approvals
        assert [(r.condition, r.detail) for r in approval.reasons] == [(next(iter(condition)), detail)]


async def test_the_budget_and_first_promotions_conditions(actors: Actors) -> None:
    d = await register(actors, "budgeted", {"mode": "when", "when": [{"attempts_over": 1}]})
    cid = await d.open()
    worker = await d.k("worker")
    claim = await worker.claim_campaign("worker-1", [d.class_])
    assert claim is not None
    await worker.fail_attempt(cid, claim.generation, "first try broke")
    claim = await worker.claim_campaign("worker-1", [d.class_])
    assert claim is not None and claim.campaign_id == cid
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(7),
                                fingerprint=fingerprint(7))
    check = await (await d.k("verifier")).claim_verification("verifier-1", classes=[d.class_])
    assert check is not None
    await (await d.k("verifier")).accept(check.verification_id, {"change": SMALL})
    [approval] = await (await d.reads()).approvals_of(cid)
    assert approval.reasons[0].detail == "it spent 2 attempts of its budget (more than 1)"

    first = await register(actors, "new-agent", {"mode": "when", "when": [{"first_promotions": 2}]})
    op = await d.k("operator")
    landed = []
    for n in range(3):
        cid, _ = await verify(first, n=10 + n)
        approvals = await (await d.reads()).approvals_of(cid)
        if n < 2:
            assert approvals[0].reasons[0].detail == f"promotion {n + 1} of the class's first 2"
            await op.approve(cid, "cli:alice@desk")
            dispatcher = await d.k("dispatcher")
            claim_ = await dispatcher.claim_side_effect("dispatcher-1")
            assert claim_ is not None and claim_.campaign_id == cid
            await dispatcher.complete_side_effect(claim_.side_effect_id, claim_.claim_token, "done",
                                                  result={"read_back": claim_.payload["new"]})
            landed.append(cid)
        else:
            assert approvals == [], "the third promotion of the class goes on by itself"


async def test_a_rebased_candidate_needs_no_second_approval(actors: Actors) -> None:
    d = await register(actors, "guarded", {"mode": "always"})
    cid, _ = await verify(d)
    await (await d.k("operator")).approve(cid, "cli:alice@desk")
    dispatcher = await d.k("dispatcher")
    claim = await dispatcher.claim_side_effect("dispatcher-1")
    assert claim is not None and claim.campaign_id == cid
    campaign = await (await d.reads()).campaign(cid)
    bundle = {"attempt_no": 2, "generation": campaign.generation + 1, "candidate_sha": sha(3)}
    await dispatcher.rebase_promotion(claim.side_effect_id, claim.claim_token, base_sha=sha(9),
                                      candidate_sha=sha(3), bundle=bundle, bundle_digest="sha256:x")
    check = await (await d.k("verifier")).claim_verification("verifier-1", classes=[d.class_])
    assert check is not None and check.campaign_id == cid
    effect = await (await d.k("verifier")).accept(check.verification_id, {"change": SMALL})
    assert effect is not None, "the same change, approved, rebased: promoted without asking again"
    assert len(await (await d.reads()).approvals_of(cid)) == 1


async def test_the_notice_goes_to_a_dispatcher_that_knows_approvals_only(
        actors: Actors, admin: Admin, as_role: AsRole) -> None:
    d = await register(actors, "noisy", {"mode": "always", "notify": {"url": "https://chat.example.org/hook/1"}})
    cid, _ = await verify(d)
    reads = await d.reads()
    [approval] = await reads.approvals_of(cid)
    [notice] = await reads.side_effects_of(cid)
    assert (notice.kind, notice.purpose, notice.target) == ("http.request", "other", "https://chat.example.org/hook/1")
    assert notice.idempotency_key == f"approval:{approval.id}"
    assert notice.payload["method"] == "POST" and notice.payload["body"]["campaign_id"] == cid
    assert notice.payload["body"]["reasons"][0]["condition"] == "always"
    assert "awaits approval" in notice.payload["body"]["text"]
    # a dispatcher of 0.2.0 names no p_approvals: it would read a state it does not know
    with as_role("dispatcher") as conn:
        handed = conn.execute("SELECT * FROM ledger_api.claim_side_effect(p_dispatcher => 'old')").fetchall()
    assert handed == []
    claim = await (await d.k("dispatcher")).claim_side_effect("dispatcher-1")
    assert claim is not None and claim.side_effect_id == notice.id


async def test_a_notice_not_yet_sent_is_cancelled_by_the_decision(actors: Actors) -> None:
    d = await register(actors, "noisy", {"mode": "always", "notify": {"url": "https://chat.example.org/hook/1"}})
    cid, _ = await verify(d)
    await (await d.k("operator")).approve(cid, "cli:alice@desk")
    effects = {e.purpose: e for e in await (await d.reads()).side_effects_of(cid)}
    assert effects["other"].state == "cancelled" and effects["promotion"].state == "pending"


@pytest.mark.parametrize("policy, message", [
    ({"mode": "sometimes"}, "approval.mode must be never, always or when"),
    ({"mode": "when"}, "approval.when"),
    ({"mode": "always", "when": [{"quorum_split": True}]}, "approval.when"),
    ({"mode": "when", "when": [{"diff_lines_over": -1}]}, "approval.diff_lines_over must be a finite number"),
    ({"mode": "when", "when": [{"diff_lines_over": 1, "paths": ["a"]}]}, "an object of one key"),
    ({"mode": "when", "when": [{"colour": "red"}]}, "unknown approval condition colour"),
    ({"mode": "when", "when": [{"paths": []}]}, "takes 1 to 100 globs"),
    ({"mode": "always", "timeout_s": 0}, "approval.timeout_s must be a finite number"),
    ({"mode": "always", "on_timeout": "shrug"}, "approval.on_timeout must be"),
    ({"mode": "always", "notify": {"url": "ftp://x"}}, "approval.notify must be"),
    ({"mode": "always", "extra": 1}, "approval must be an object of"),
])
async def test_a_policy_is_checked_where_it_is_stored(actors: Actors, policy: dict[str, Any],
                                                      message: str) -> None:
    op = await actors("operator")
    with pytest.raises(InvalidInput) as refused:
        await op.register_class("checked", approval=policy)
    assert message in refused.value.message


async def test_a_caller_that_says_no_policy_keeps_the_class_s(actors: Actors) -> None:
    op = await actors("operator")
    await op.register_class("kept", approval={"mode": "always"})
    # a 0.2.0 `ledger classes sync` names no approval: the policy stays
    await op.register_class("kept", max_attempts=5)
    reads = await actors.reads()
    [cls] = [c for c in await reads.classes() if c.name == "kept"]
    assert cls.approval == {"mode": "always"} and cls.max_attempts == 5
    await op.register_class("kept", approval={})
    [cls] = [c for c in await reads.classes() if c.name == "kept"]
    assert cls.approval == {}
