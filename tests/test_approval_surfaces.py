"""Deciding approvals from wherever the operator is (docs/approval.md): the
command line (a subprocess, real exit codes, one line per failure) and the
HTTP API (problem+json for every refusal, the token's role the database's
to judge), each decision journaled with the caller's identity and reason."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from test_api import Api, assert_problem, token_table

from conftest import Actors, Admin
from drive import Driver, fingerprint, sha
from ledger import Database
from ledger.api import ApiOptions, create_app, new_token
from test_cli import ledger

pytestmark = pytest.mark.anyio


async def awaiting(actors: Actors, n: int, *, worker: str = "worker-1") -> list[int]:
    """``n`` campaigns of class ``guarded`` (every candidate approved first), awaiting approval."""
    op = await actors("operator")
    await op.register_class("guarded", lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": "/nowhere"},
                            approval={"mode": "always"})
    d = Driver(actors, "guarded")
    ids = []
    for i in range(n):
        cid = await d.open()
        w = await actors("worker")
        claim = await w.claim_campaign(worker, ["guarded"])
        assert claim is not None
        await w.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(200 + i),
                               fingerprint=fingerprint(200 + i))
        check = await (await actors("verifier")).claim_verification("verifier-1")
        assert check is not None
        await (await actors("verifier")).accept(check.verification_id, {"summary": "ok"})
        ids.append(cid)
    return ids


def state_of(admin: Admin, cid: int) -> str:
    row = admin.execute("SELECT state FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()
    assert row is not None
    return str(row["state"])


def last_transition(admin: Admin, cid: int) -> dict[str, Any]:
    row = admin.execute("SELECT actor, actor_role, payload FROM ledger.campaign_event WHERE campaign_id = %s "
                        "AND type = 'transition' ORDER BY seq DESC LIMIT 1", (cid,)).fetchone()
    assert row is not None
    return dict(row)


async def test_the_command_line_lists_approves_and_denies(db_url: str, actors: Actors, admin: Admin) -> None:
    first, second, third = await awaiting(actors, 3)
    listed = json.loads(ledger(db_url, "approvals", "--json").stdout)
    assert [a["campaign_id"] for a in listed] == [first, second, third]
    assert listed[0]["reasons"][0]["condition"] == "always" and listed[0]["class"] == "guarded"
    table = ledger(db_url, "approvals").stdout
    assert str(first) in table and "every promotion" in table

    shown = ledger(db_url, "show", str(first)).stdout
    assert "approvals" in shown and "waiting" in shown and "before every promotion" in shown
    approved = ledger(db_url, "approve", str(first), "--reason", "looked at it")
    assert f"campaign {first} approved" in approved.stdout
    assert state_of(admin, first) == "verified"
    event = last_transition(admin, first)
    assert event["actor"].startswith("cli:") and event["actor_role"] == "operator"
    assert event["payload"]["transition"] == "approve" and event["payload"]["reason"] == "looked at it"

    no_reason = ledger(db_url, "deny", str(second), check=False)
    assert no_reason.returncode == 2 and no_reason.stderr.strip() == \
        "ledger: deny needs --reason: the next attempt is told why"
    denied = json.loads(ledger(db_url, "deny", str(second), "--reason", "wrong fix", "--json").stdout)
    assert denied == [{"campaign_id": second, "approval_id": denied[0]["approval_id"], "decision": "denied",
                       "state": "ready", "generation": 1, "side_effect_id": None}]
    ledger(db_url, "deny", str(third), "--reason", "not wanted", "--abandon")
    assert state_of(admin, third) == "abandoned"

    # a decided approval: one line, the illegal-transition exit code, nothing changed
    again = ledger(db_url, "approve", str(second), check=False)
    assert again.returncode == 4 and len(again.stderr.strip().splitlines()) == 1
    assert "not awaiting approval" in again.stderr
    assert state_of(admin, second) == "ready"
    assert json.loads(ledger(db_url, "approvals", "--json").stdout) == []


async def test_the_identity_that_made_the_attempt_is_refused_on_the_command_line(
        db_url: str, actors: Actors, admin: Admin) -> None:
    from ledger.cli.campaigns import operator_identity

    [cid] = await awaiting(actors, 1, worker=operator_identity())
    refused = ledger(db_url, "approve", str(cid), check=False)
    assert refused.returncode == 5 and "another identity than the one that made the attempt" in refused.stderr
    assert state_of(admin, cid) == "awaiting_approval"


@pytest.fixture
async def api(db: Database) -> AsyncIterator[Api]:
    tokens = {role: new_token() for role in ("reader", "operator", "sensor")}
    app = create_app(db, token_table(tokens), ApiOptions(max_body_bytes=64 * 1024))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ledger") as client:
            yield Api(client, tokens)


async def test_the_http_api_decides_as_the_operator_only(api: Api, actors: Actors, admin: Admin) -> None:
    first, second = await awaiting(actors, 2)
    listed = (await api.get("/approvals")).json()["items"]
    assert [a["campaign_id"] for a in listed] == [first, second]
    assert (await api.get("/approvals", params={"class": "other"})).json()["items"] == []

    # a reader's token is refused by the database: 403, nothing changed
    assert_problem(await api.post(f"/campaigns/{first}/approve", role="reader"), 403, "forbidden")
    assert state_of(admin, first) == "awaiting_approval"

    done = await api.post(f"/campaigns/{first}/approve", json={"reason": "fine"})
    assert done.status_code == 200, done.text
    body = done.json()
    assert (body["decision"], body["state"]) == ("approved", "verified") and body["side_effect_id"]
    event = last_transition(admin, first)
    assert (event["actor"], event["actor_role"]) == ("http:operator-tok", "operator")
    [approval] = (await api.get(f"/campaigns/{first}/approvals")).json()
    assert (approval["decided_by"], approval["decision_reason"]) == ("http:operator-tok", "fine")
    assert approval["side_effect_id"] == body["side_effect_id"]

    assert_problem(await api.post(f"/campaigns/{first}/deny", json={"reason": "late"}), 409, "illegal-transition")
    assert_problem(await api.post(f"/campaigns/{second}/deny", json={}), 422)
    assert_problem(await api.post(f"/campaigns/{second}/deny", json={"reason": "x", "colour": 1}), 422)
    assert_problem(await api.post("/campaigns/999999/approve"), 404, "not-found")
    assert_problem(await api.get("/campaigns/999999/approvals"), 404, "not-found")
    denied = await api.post(f"/campaigns/{second}/deny", json={"reason": "no", "abandon": True})
    assert denied.json()["state"] == "abandoned"
    assert (await api.get("/approvals")).json()["items"] == []


async def test_the_attempt_s_identity_is_refused_over_http(api: Api, actors: Actors, admin: Admin) -> None:
    [cid] = await awaiting(actors, 1, worker="http:operator-tok")
    assert_problem(await api.post(f"/campaigns/{cid}/approve"), 403, "same-identity")
    assert state_of(admin, cid) == "awaiting_approval"


async def test_concurrent_decisions_apply_once(db: Database, actors: Actors, admin: Admin) -> None:
    """Two operators and the timeout decide the same approval at once, on
    connections of their own: the first holds the campaign; the second
    operator waits for it and is then refused; the reaper skips what is
    held and later finds it decided. One decision, one promotion."""
    import asyncio
    from datetime import timedelta

    from drive import wait_for_lock_waiters
    from ledger import IllegalTransition, Kernel

    op = await actors("operator")
    await op.register_class("timed", lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": "/nowhere"},
                            approval={"mode": "always", "timeout_s": 60, "on_timeout": "deny"})
    d = Driver(actors, "timed")
    cid = await d.open()
    w = await actors("worker")
    claim = await w.claim_campaign("worker-1", ["timed"])
    assert claim is not None
    await w.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(2), fingerprint=fingerprint(2))
    check = await (await actors("verifier")).claim_verification("verifier-1")
    assert check is not None
    await (await actors("verifier")).accept(check.verification_id, {})
    later = admin.execute("SELECT deadline FROM ledger.approval WHERE campaign_id = %s",
                          (cid,)).fetchone()["deadline"] + timedelta(seconds=1)
    await actors("reaper")
    second = db.session("operator", max_size=1)
    await second.open()
    try:
        async with actors.session("operator").transaction() as tx:
            first = await Kernel(tx).approve(cid, "cli:alice@desk", "mine")

            async def other() -> str:
                try:
                    await Kernel(second).deny(cid, "cli:bob@desk", "no, mine")
                except IllegalTransition as exc:
                    return exc.message
                return "decided twice"

            denying = asyncio.create_task(other())
            await wait_for_lock_waiters(db, "ledger:operator")
            async with actors.session("reaper").transaction(now=later) as rtx:
                assert await Kernel(rtx).expire_approvals() == [], "the held campaign is skipped"
        assert "approval" in await denying and "approved by cli:alice@desk" in await denying
    finally:
        await second.close()
    async with actors.session("reaper").transaction(now=later) as rtx:
        assert await Kernel(rtx).expire_approvals() == []
    assert first.decision == "approved"
    row = admin.execute("SELECT decision, decided_by, (SELECT count(*) FROM ledger.side_effect s "
                        "WHERE s.campaign_id = ap.campaign_id AND s.purpose = 'promotion') AS promotions "
                        "FROM ledger.approval ap WHERE campaign_id = %s", (cid,)).fetchone()
    assert row is not None and dict(row) == {"decision": "approved", "decided_by": "cli:alice@desk", "promotions": 1}
    assert state_of(admin, cid) == "verified"
