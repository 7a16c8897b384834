"""The HTTP API in process (httpx over ASGI, real PostgreSQL): authentication
and the database's authorisation, idempotent intake, problem+json for every
refusal, metrics that match the rows, health probes, listing and actions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import TEST_PREFIX, Actors, Admin
from drive import Driver, fingerprint, new_key, now, sha
from ledger import Database, Kernel
from ledger.api import ApiOptions, TokenTable, create_app, hash_token, new_token
from ledger.db.embedded import create_database, drop_database
from ledger.db.migrations import head

pytestmark = pytest.mark.anyio

PROBLEM = "application/problem+json"


@dataclass
class Api:
    """An in-process client and one token per role."""

    client: httpx.AsyncClient
    tokens: dict[str, str]  # role -> token

    def auth(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    async def get(self, url: str, role: str = "reader", **kw: Any) -> httpx.Response:
        return await self.client.get(url, headers={**self.auth(role), **kw.pop("headers", {})},
                                     **kw)

    async def post(self, url: str, role: str = "operator", **kw: Any) -> httpx.Response:
        return await self.client.post(url, headers={**self.auth(role), **kw.pop("headers", {})},
                                      **kw)


def token_table(tokens: dict[str, str]) -> TokenTable:
    return TokenTable.parse(",".join(f"{role}-tok:{role}:{hash_token(tok)}"
                                     for role, tok in tokens.items()))


@pytest.fixture
async def api(db: Database) -> AsyncIterator[Api]:
    tokens = {role: new_token() for role in ("reader", "operator", "sensor")}
    app = create_app(db, token_table(tokens), ApiOptions(max_body_bytes=64 * 1024))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ledger") as client:
            yield Api(client, tokens)


def assert_problem(response: httpx.Response, status: int, slug: str | None = None) -> dict:
    """A problem+json answer with this status (and type)."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    assert body["status"] == status and body["title"] and body["type"].startswith("/problems/")
    if slug is not None:
        assert body["type"] == f"/problems/{slug}", body
    return body


def observation(key: str, status: str = "red", **extra: Any) -> dict[str, Any]:
    return {"sensor": "ext-sensor", "objective_key": key, "target": "repo@main",
            "status": status, "started_at": (now() - timedelta(seconds=5)).isoformat(),
            "class": "test", **extra}


def table_counts(admin: Admin) -> dict[str, Any] | None:
    """Everything a refused request must leave unchanged."""
    return admin.execute(
        "SELECT (SELECT count(*) FROM ledger.campaign) AS campaigns, "
        "(SELECT count(*) FROM ledger.observation) AS observations, "
        "(SELECT count(*) FROM ledger.campaign_event) AS events, "
        "(SELECT array_agg(state || generation ORDER BY id) FROM ledger.campaign) AS states"
    ).fetchone()


# --- authentication and authorisation -----------------------------------------


async def test_missing_forged_and_malformed_tokens_get_401_problems(api: Api, actors: Actors, test_class: str) -> None:
    cid = await Driver(actors, test_class).open()
    for headers in ({}, {"Authorization": "Bearer " + new_token()},
                    {"Authorization": "Bearer " + api.tokens["operator"] + "x"},
                    {"Authorization": "Basic " + api.tokens["operator"]}):
        for method, url in (("GET", "/campaigns"), ("POST", f"/campaigns/{cid}/abandon"),
                            ("GET", "/metrics"), ("POST", "/observations")):
            r = await api.client.request(method, url, headers=headers)
            body = assert_problem(r, 401, "unauthenticated")
            assert r.headers["www-authenticate"].startswith("Bearer"), body
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.state == "ready"


async def test_reader_cannot_abandon_operator_can_and_is_journaled(api: Api, actors: Actors, test_class: str, admin: Admin) -> None:
    d = Driver(actors, test_class)
    cid = await d.open()
    before = table_counts(admin)
    for role in ("reader", "sensor"):
        r = await api.post(f"/campaigns/{cid}/abandon", role, json={"reason": "try"})
        assert_problem(r, 403, "forbidden")
        assert_problem(await api.post(f"/campaigns/{cid}/reopen", role), 403, "forbidden")
        # Previewing a bulk action is a read; acting on the preview is the refusal.
        r = await api.post("/campaigns/abandon", role, json={"filter": {"state": ["ready"]}})
        assert r.status_code == 200 and r.json()["dry_run"] is True
        r = await api.post("/campaigns/abandon", role, json={
            "filter": {"state": ["ready"]}, "campaign_ids": r.json()["campaign_ids"],
            "selection": r.json()["selection"]})
        assert_problem(r, 403, "forbidden")
    assert table_counts(admin) == before

    r = await api.post(f"/campaigns/{cid}/abandon", "operator", json={"reason": "not needed"})
    assert r.status_code == 200, r.text
    assert r.json() == {"campaign_id": cid, "outcome": "abandoned", "generation": 1}
    events = await (await actors.reads("reader")).events(cid)
    last = events[-1]
    assert last.payload["to"] == "abandoned" and last.actor == "http:operator-tok"
    assert last.payload["reason"] == "not needed"
    # Abandoning again is the state machine's refusal, not the API's.
    assert_problem(await api.post(f"/campaigns/{cid}/abandon"), 409, "illegal-transition")


async def test_sensor_records_observations_and_nothing_else(api: Api, actors: Actors, test_class: str, admin: Admin) -> None:
    key = new_key()
    for role in ("reader", "operator"):
        assert_problem(await api.post("/observations", role, json=observation(key)), 403,
                       "forbidden")
    assert admin.execute("SELECT count(*) AS n FROM ledger.observation").fetchone()["n"] == 0
    r = await api.post("/observations", "sensor", json=observation(key))
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["effect"] == "opened" and body["duplicate"] is False
    assert r.headers["location"] == f"/observations/{body['observation_id']}"
    shown = await api.get(r.headers["location"], "sensor")
    assert shown.status_code == 200 and shown.json()["objective_key"] == key
    cid = body["campaign_id"]
    assert_problem(await api.post(f"/campaigns/{cid}/abandon", "sensor"), 403, "forbidden")
    # Without a sensor name the token's identity is the sensor.
    anon = observation(new_key())
    del anon["sensor"]
    r = await api.post("/observations", "sensor", json=anon)
    assert r.status_code == 202
    obs = await (await actors.reads("reader")).observation(r.json()["observation_id"])
    assert obs.sensor == "http:sensor-tok"


# --- idempotent intake ------------------------------------------------------------


async def test_same_idempotency_key_records_once_and_a_different_body_is_refused(api: Api, test_class: str, admin: Admin) -> None:
    body = observation(new_key(), details={"b": 1, "a": [1, 2]})
    headers = {"Idempotency-Key": "obs-42"}
    first = await api.post("/observations", "sensor", json=body, headers=headers)
    assert first.status_code == 202, first.text
    # Same content, other key order and spacing: the same request.
    reordered = '{"details": {"a": [1, 2], "b": 1}, ' + \
        ", ".join(f'"{k}": "{v}"' for k, v in body.items() if k != "details") + "}"
    again = await api.post("/observations", "sensor", content=reordered,
                           headers={**headers, "Content-Type": "application/json"})
    assert again.status_code == 202, again.text
    assert again.json() == {**first.json(), "duplicate": True}
    assert again.headers["location"] == first.headers["location"]
    n = admin.execute("SELECT count(*) AS n FROM ledger.observation").fetchone()["n"]
    assert n == 1

    changed = {**body, "status": "green"}
    r = await api.post("/observations", "sensor", json=changed, headers=headers)
    assert_problem(r, 422, "idempotency-conflict")
    assert admin.execute("SELECT count(*) AS n FROM ledger.observation").fetchone()["n"] == 1


# --- malformed input ------------------------------------------------------------------


async def test_malformed_input_gets_4xx_problems_and_changes_nothing(api: Api, actors: Actors, test_class: str, admin: Admin) -> None:
    d = Driver(actors, test_class)
    cid = await d.open()
    before = table_counts(admin)
    bad: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("GET", "/campaigns/abc", {}, 422, "invalid-input"),
        ("GET", "/campaigns/0", {}, 422, "invalid-input"),
        ("GET", "/campaigns/99999999999999999999", {}, 422, "invalid-input"),
        ("GET", "/campaigns/424242", {}, 404, "not-found"),
        ("GET", "/campaigns?colour=red", {}, 422, "invalid-input"),
        ("GET", "/campaigns?stat=ready", {}, 422, "invalid-input"),
        ("GET", "/campaigns?state=bogus", {}, 422, "invalid-input"),
        ("GET", "/campaigns?limit=0", {}, 422, "invalid-input"),
        ("GET", "/campaigns?updated_since=yesterday", {}, 422, "invalid-input"),
        ("GET", "/campaigns?target=a%00b", {}, 422, "invalid-input"),  # NUL: not for text
        ("GET", "/campaigns?cursor=not-a-cursor", {}, 422, "invalid-input"),
        ("GET", "/campaigns?cursor=WzEsMl0", {}, 422, "invalid-input"),  # [1,2]
        ("GET", f"/campaigns/{cid}/events?from=-1", {}, 422, "invalid-input"),
        ("GET", f"/campaigns/{cid}/events", {"headers": {"Last-Event-ID": "x1"}}, 422,
         "invalid-input"),
        ("GET", "/nowhere", {}, 404, "not-found"),
        ("DELETE", f"/campaigns/{cid}", {}, 405, "method-not-allowed"),
        ("POST", f"/campaigns/{cid}/abandon", {"content": b"{not json",
                                               "headers": {"Content-Type": "application/json"}},
         422, "invalid-input"),
        ("POST", f"/campaigns/{cid}/abandon", {"json": {"reason": ""}}, 422, "invalid-input"),
        ("POST", f"/campaigns/{cid}/abandon", {"json": {"why": "x"}}, 422, "invalid-input"),
        ("POST", f"/campaigns/{cid}/reopen", {"json": {"extra_attempts": 0}}, 422,
         "invalid-input"),
        ("POST", "/campaigns/abandon", {"json": {"filter": {}}}, 422, "invalid-input"),
        ("POST", "/campaigns/abandon", {"json": {"filter": {"stat": "ready"}}}, 422,
         "invalid-input"),
        ("POST", "/observations", {"content": b'{"status": ',
                                   "headers": {"Content-Type": "application/json"}}, 422,
         "invalid-input"),
        ("POST", "/observations", {"json": {**observation("k"), "status": "blue"}}, 422,
         "invalid-input"),
        ("POST", "/observations", {"json": {**observation("k"),
                                            "started_at": "2024-01-01T00:00:00"}}, 422,
         "invalid-input"),  # no time zone
        ("POST", "/observations", {"json": {**observation("k"), "started_at":
                                            (now() + timedelta(days=1)).isoformat()}}, 422,
         "invalid-input"),  # the kernel's refusal: in the future
        ("POST", "/observations", {"json": {**observation("k"), "details": {"x": "a\u0000b"}}},
         422, "invalid-input"),  # PostgreSQL's refusal of NUL, mapped
        ("POST", "/observations", {"json": {**observation("k"), "objective_key": "k\u0000"}},
         422, "invalid-input"),
        ("POST", "/observations", {"json": {**observation("k"), "pad": "x" * 70_000}}, 413,
         "payload-too-large"),
        ("POST", "/observations", {"json": observation("k"),
                                   "headers": {"Idempotency-Key": "has space"}}, 422,
         "invalid-input"),
    ]
    for method, url, kw, status, slug in bad:
        role = "sensor" if url == "/observations" else "operator"
        headers = {**api.auth(role), **kw.pop("headers", {})}
        r = await api.client.request(method, url, headers=headers, **kw)
        body = assert_problem(r, status, slug)
        assert body.get("instance") == url.split("?")[0], body
    # A streamed body past the limit is cut off as well (no Content-Length to go by).
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b" " * 1024
    r = await api.client.post("/observations", content=chunks(),
                              headers={**api.auth("sensor"), "Content-Type": "application/json"})
    assert_problem(r, 413, "payload-too-large")
    assert table_counts(admin) == before


# --- listing and pages -------------------------------------------------------------------


async def test_list_filters_and_cursor_pages_cover_everything_once(api: Api, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, _ = await d.leased()
    labelled = [await d.open(labels=["nightly"]) for _ in range(5)]
    others = [await d.open() for _ in range(2)]
    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, "state": "ready"}
        if cursor:
            params["cursor"] = cursor
        r = await api.get("/campaigns", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [c["id"] for c in page["items"]]
        assert all(c["state"] == "ready" for c in page["items"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(labelled + others) and len(seen) == len(set(seen))
    assert pages == 4  # 7 campaigns, 2 a page; the last page says so (no empty page)

    r = await api.get("/campaigns", params={"label": "nightly", "limit": 100})
    assert sorted(c["id"] for c in r.json()["items"]) == sorted(labelled)
    r = await api.get("/campaigns", params=[("state", "leased"), ("state", "verified")])
    assert [c["id"] for c in r.json()["items"]] == [cid]
    r = await api.get("/campaigns", params={"updated_since": (now() + timedelta(hours=1))
                                            .isoformat()})
    assert r.json()["items"] == []
    assert r.json()["next_cursor"] is None


async def test_detail_and_status(api: Api, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    worker = await d.k("worker")
    await worker.fail_attempt(cid, gen, "red", fingerprint=fingerprint(7))
    r = await api.get(f"/campaigns/{cid}")
    assert r.status_code == 200
    detail = r.json()
    assert detail["campaign"]["id"] == cid and detail["campaign"]["class"] == test_class
    assert [(a["attempt_no"], a["outcome"], a["fingerprint"]) for a in detail["attempts"]] == \
        [(1, "failed", fingerprint(7))]
    assert detail["verifications"] == [] and detail["side_effects"] == []
    assert detail["observations"] == []

    claim = await worker.claim_campaign("worker-2", [test_class])  # a 30 s lease
    assert claim is not None and claim.campaign_id == cid
    await d.open()
    r = await api.get("/status")
    status = r.json()
    assert status["states"]["ready"] == 1 and status["states"]["leased"] == 1
    assert status["oldest_ready"] is not None
    assert len(status["leases_expiring"]) == 1
    r = await api.get("/status", params={"expiring_within_s": 1})
    assert r.json()["leases_expiring"] == []


async def test_bulk_abandon_and_reopen_preview_then_act(api: Api, actors: Actors, test_class: str) -> None:
    op = await actors("operator")
    await op.register_class("once", max_attempts=1, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0)
    d = Driver(actors, test_class)
    ready = [await d.open(labels=["sweep"]) for _ in range(3)]
    closed = await d.open(labels=["sweep"])
    await op.abandon(closed, "already gone")
    await d.open()  # no label: untouched

    # A POST without a selection is a preview, whatever else it says.
    r = await api.post("/campaigns/abandon", json={"filter": {"label": "sweep"}})
    assert r.status_code == 200, r.text
    preview = r.json()
    assert preview["dry_run"] is True and preview["matched"] == 3 and preview["outcomes"] == {}
    assert sorted(preview["campaign_ids"]) == sorted(ready)
    assert preview["selection"].startswith("sel2-")
    reader = await actors.reads()
    assert [(await reader.campaign(c)).state for c in ready] == ["ready"] * 3
    r = await api.post("/campaigns/abandon", json={"filter": {"label": "sweep"},
                                                    "dry_run": False})
    assert_problem(r, 422, "invalid-input")  # acting needs what a preview answered
    assert [(await reader.campaign(c)).state for c in ready] == ["ready"] * 3

    r = await api.post("/campaigns/abandon", json={
        "filter": {"label": "sweep"}, "reason": "sweep",
        "campaign_ids": preview["campaign_ids"], "selection": preview["selection"]})
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["dry_run"] is False and done["outcomes"] == {"abandoned": 3}
    assert sorted(done["campaign_ids"]) == sorted(ready)
    assert done["not_previewed"] == [] and done["no_longer_matching"] == []
    assert [(await reader.campaign(c)).state for c in ready] == ["abandoned"] * 3
    events = await reader.events(ready[0])
    assert events[-1].actor == "http:operator-tok" and events[-1].payload["reason"] == "sweep"

    once = Driver(actors, "once")
    exhausted = [await once.exhausted() for _ in range(2)]
    preview = (await api.post("/campaigns/reopen", json={"filter": {"class": ["once"]},
                                                         "max_campaigns": 1})).json()
    assert preview["matched"] == 1 and preview["truncated"] is True
    preview = (await api.post("/campaigns/reopen", json={"filter": {"class": ["once"]}})).json()
    assert preview["matched"] == 2
    r = await api.post("/campaigns/reopen", json={
        "filter": {"class": ["once"]}, "extra_attempts": 2,
        "campaign_ids": preview["campaign_ids"], "selection": preview["selection"]})
    assert r.json()["outcomes"] == {"reopened": 2}
    for c in exhausted:
        campaign = await reader.campaign(c)
        assert campaign.state == "ready" and campaign.max_attempts == 3


async def test_bulk_api_acts_only_on_the_previewed_campaigns(api: Api, actors: Actors, test_class: str) -> None:
    """As tests/test_dashboard.py, through the API: preview 8 for a label; one of them is
    abandoned elsewhere and a new one opens with the label; acting abandons the
    seven and reports both differences, and the new campaign is left alone."""
    d = Driver(actors, test_class)
    batch = [await d.open(labels=["batch"]) for _ in range(8)]
    preview = (await api.post("/campaigns/abandon", json={"filter": {"label": "batch"}})).json()
    assert preview["matched"] == 8
    await (await actors("operator")).abandon(batch[0], "elsewhere", "cli:bob@host")
    late = await d.open(labels=["batch"])
    body = {"filter": {"label": "batch"}, "campaign_ids": preview["campaign_ids"],
            "selection": preview["selection"]}
    for forged in ({**body, "campaign_ids": [*body["campaign_ids"], late]},
                   {**body, "filter": {"label": "batch", "class": [test_class]}}):
        assert_problem(await api.post("/campaigns/abandon", json=forged), 422, "invalid-input")
    r = await api.post("/campaigns/abandon", json=body)
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["outcomes"] == {"abandoned": 7}
    assert done["not_previewed"] == [late] and done["no_longer_matching"] == [batch[0]]
    reader = await actors.reads()
    assert (await reader.campaign(late)).state == "ready"
    assert [(await reader.campaign(c)).state for c in batch] == ["abandoned"] * 8
    assert (await reader.events(batch[0]))[-1].actor == "cli:bob@host"


async def test_retry_now_skips_a_backoff_and_is_refused_otherwise(api: Api, actors: Actors, test_class: str) -> None:
    op = await actors("operator")
    await op.register_class("slow", max_attempts=3, lease_seconds=30, backoff_base_s=3600,
                            backoff_jitter=0)
    d = Driver(actors, "slow")
    cid, gen = await d.leased()
    worker = await actors("worker")
    assert_problem(await api.post(f"/campaigns/{cid}/retry"), 409, "illegal-transition")
    await worker.fail_attempt(cid, gen, "red", fingerprint=fingerprint(1))
    assert await worker.claim_campaign("w", ["slow"]) is None  # an hour of backoff to go
    for role in ("reader", "sensor"):
        assert_problem(await api.post(f"/campaigns/{cid}/retry", role), 403, "forbidden")
    r = await api.post(f"/campaigns/{cid}/retry")
    assert r.status_code == 200, r.text
    event = (await (await actors.reads("reader")).events(cid))[-1]
    assert (event.type, event.actor, event.actor_role) == \
        ("operator.retry_now", "http:operator-tok", "operator")
    assert r.json() == {"campaign_id": cid, "outcome": "retry_now", "seq": event.seq}
    assert event.payload["attempt_count"] == 1
    claim = await worker.claim_campaign("w", ["slow"])
    assert claim is not None and claim.campaign_id == cid
    assert_problem(await api.post(f"/campaigns/{cid}/retry"), 409, "illegal-transition")
    assert_problem(await api.post("/campaigns/424242/retry"), 404, "not-found")


# --- metrics --------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_match_the_database_after_a_scripted_sequence(api: Api, actors: Actors, test_class: str, db: Database, admin: Admin) -> None:
    d = Driver(actors, test_class)
    worker, op = await d.k("worker"), await d.k("operator")
    await d.verified()
    abandoned, _ = await d.leased()
    await op.abandon(abandoned, "stop")
    lost, _ = await d.leased()
    # The reaper, with the clock a minute on: the lease has expired.
    await actors("reaper")
    async with actors.session("reaper").transaction(now=now() + timedelta(minutes=1)) as tx:
        reaped = await Kernel(tx).expire_leases()
    assert [r.campaign_id for r in reaped] == [lost]
    # (The reaped one is due a minute from now: the next claim takes a new one.)
    failed, gen = await d.leased()
    await worker.fail_attempt(failed, gen, "red", fingerprint=fingerprint(1))
    for _ in range(3):
        await d.open()

    r = await api.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    got = samples(r.text)
    rows = admin.execute("SELECT state, count(*) AS n FROM ledger.campaign GROUP BY state").fetchall()
    in_db = {row["state"]: row["n"] for row in rows}
    states = admin.execute("SELECT name FROM ledger.state").fetchall()
    for row in states:
        assert got[("ledger_campaigns", (("class", test_class), ("state", row["name"])))] \
            == in_db.get(row["name"], 0)
    assert in_db == {"verified": 1, "abandoned": 1, "ready": 5}

    claims = admin.execute("SELECT count(*) AS n FROM ledger.attempt").fetchone()["n"]
    assert got[("ledger_claims_total", ())] == claims == 4
    assert got[("ledger_lease_expiries_total", ())] == 1
    assert got[("ledger_transitions_total", (("transition", "accept"),))] == 1
    assert got[("ledger_attempts_total", (("outcome", "lost"),))] == 1
    assert got[("ledger_attempts_total", (("outcome", "failed"),))] == 1
    assert got[("ledger_verdicts_total", (("verdict", "accepted"),))] == 1
    assert got[("ledger_verdicts_total", (("verdict", "rejected"),))] == 0
    ended = admin.execute("SELECT count(*) AS n FROM ledger.attempt WHERE ended_at IS NOT NULL"
                          ).fetchone()["n"]
    assert got[("ledger_attempt_duration_seconds_count", ())] == ended == 4
    assert got[("ledger_attempt_duration_seconds_bucket", (("le", "+Inf"),))] == ended
    assert got[("ledger_verification_duration_seconds_count", ())] == 1
    assert got[("ledger_oldest_ready_age_seconds", ())] >= 0
    assert ("ledger_hub_reconnects_total", ()) in got
    # No campaign id ever becomes a label.
    assert not any(dict(labels).keys() & {"campaign", "campaign_id", "id"} for _, labels in got)


# --- health -----------------------------------------------------------------------------------


async def test_livez_and_readyz_on_a_migrated_database(api: Api) -> None:
    r = await api.client.get("/livez")
    assert r.status_code == 200 and r.json()["status"] == "alive"
    r = await api.client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready", "revision": head(),
                                                 "head": head()}


async def test_readyz_is_503_on_a_database_not_at_head(pg_admin_url: str) -> None:
    name = f"ledgertest_empty_{new_token()[4:12].lower().replace('-', '_')}"
    url = create_database(pg_admin_url, name)
    try:
        app = create_app(Database(url, role_prefix=TEST_PREFIX), TokenTable(),
                         ApiOptions(hub=False))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://ledger") as client:
                assert (await client.get("/livez")).status_code == 200
                body = assert_problem(await client.get("/readyz"), 503, "unavailable")
                assert "ledger migrate" in body["detail"]
    finally:
        drop_database(pg_admin_url, name)


async def test_openapi_documents_problems_and_bearer_auth(api: Api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    abandon = spec["paths"]["/campaigns/{campaign_id}/abandon"]["post"]
    assert PROBLEM in abandon["responses"]["403"]["content"]
    assert "text/event-stream" in \
        spec["paths"]["/campaigns/{campaign_id}/events"]["get"]["responses"]["200"]["content"]


# --- the autonomy report: humans by role ------------------------------------------------


async def test_autonomy_report_counts_an_operators_actions_and_no_one_elses(api: Api, actors: Actors, test_class: str) -> None:
    """A human is the operator role (API, dashboard or CLI),
    whatever the actor is called; every other role, under any name -- a sensor
    posting through the API as http:<token> included -- is automation."""
    from ledger.report import autonomy_report

    op, worker, verifier = await actors("operator"), await actors("worker"), await actors("verifier")
    dispatcher = await actors("dispatcher")
    await actors("reaper")  # its session, used below by actors.session("reaper")
    await op.register_class("promoting", max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0, promotion={"ref": "refs/heads/main",
                                                         "repository": "/nonexistent"})
    await op.register_class("once", max_attempts=1, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0)
    # The sensor, through the API with its token (recorded as http:sensor-tok):
    # a red observation opens a campaign, a green one dismisses another.
    red = observation(new_key(), **{"class": "promoting"})
    del red["sensor"]
    r = await api.post("/observations", "sensor", json=red)
    assert r.status_code == 202 and r.json()["effect"] == "opened", r.text
    cid = r.json()["campaign_id"]
    other = await Driver(actors, test_class).open()
    green = observation((await (await actors.reads("reader")).campaign(other)).objective_key,
                        "green")
    del green["sensor"]
    r = await api.post("/observations", "sensor", json=green)
    assert r.json()["effect"] == "dismissed", r.text
    # Worker, verifier, dispatcher, reaper and the system, under names that look human.
    claim = await worker.claim_campaign("http:alice", ["promoting"])
    assert claim is not None and claim.campaign_id == cid
    await worker.append_events(cid, claim.generation, [{"type": "attempt.started"}])
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(2),
                                fingerprint=fingerprint(1))
    check = await verifier.claim_verification("cli:bob@host", classes=["promoting"])
    await verifier.accept(check.verification_id, {"ok": True})
    intent = await dispatcher.claim_side_effect("http:carol")
    assert intent is not None and intent.campaign_id == cid
    await dispatcher.complete_side_effect(intent.side_effect_id, intent.claim_token, "conflict",
                                          result={"read_back": sha(3)})
    again = await worker.claim_campaign("cli:dave@host", ["promoting"])
    assert again is not None and again.campaign_id == cid
    async with actors.session("reaper").transaction(now=now() + timedelta(seconds=40)) as tx:
        assert [x.campaign_id for x in await Kernel(tx).expire_leases()] == [cid]
    spent = await Driver(actors, "once").exhausted()

    reader = await actors.reads()
    today = (await autonomy_report(reader, 1)).days[-1]
    assert today.human_actions == 0 and today.verdict == "no-closure", today
    roles = {e.actor_role for c in (cid, other, spent) for e in await reader.events(c)}
    assert {"sensor", "worker", "verifier", "dispatcher", "reaper", "system"} <= roles, roles
    assert "operator" not in roles

    # An operator acts, under a name that looks like a robot's: that is a human's action.
    await op.reopen(spent, "robot-7", 1)
    today = (await autonomy_report(reader, 1)).days[-1]
    assert today.human_actions == 1 and today.verdict == "human-assisted"
    # Through the API, too (http:operator-tok), a retry of a waiting campaign included.
    await op.register_class("slow", max_attempts=3, lease_seconds=30, backoff_base_s=3600,
                            backoff_jitter=0)
    slow, gen = await Driver(actors, "slow").leased()
    await worker.fail_attempt(slow, gen, "red", fingerprint=fingerprint(2))
    assert (await api.post(f"/campaigns/{slow}/retry")).status_code == 200
    assert (await api.post(f"/campaigns/{other}/abandon")).status_code == 409  # dismissed
    today = (await autonomy_report(reader, 1)).days[-1]
    assert today.human_actions == 2


# --- docs, problem types, cursors and classes ----------------------------------------------


async def test_docs_load_their_assets_from_this_server(api: Api) -> None:
    """/docs and /redoc work offline: every script and stylesheet is served here."""
    import re

    for page in ("/docs", "/redoc"):
        r = await api.client.get(page)
        assert r.status_code == 200, page
        assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png|svg))"', r.text)
        assert assets, r.text
        for url in assets:
            assert url.startswith("/") and not url.startswith("//"), (page, url)
            got = await api.client.get(url)
            assert got.status_code == 200 and len(got.content) > 100, (page, url)
    # The bundle is a Swagger UI that reads OpenAPI 3.1 (what FastAPI writes).
    assert (await api.client.get("/openapi.json")).json()["openapi"].startswith("3.1")
    assert b"isOAS31" in (await api.client.get("/docs/assets/swagger-ui-bundle.js")).content


async def test_every_problem_type_has_a_page(api: Api, actors, test_class) -> None:
    from ledger.api.problems import problem_types

    types = problem_types()
    for slug in ("invalid-input", "not-found", "forbidden", "unauthenticated", "illegal-transition",
                 "stale-lease", "payload-too-large", "cursor-beyond-end", "internal-error",
                 "method-not-allowed", "idempotency-conflict", "unavailable"):
        assert slug in types, slug
    for slug, t in types.items():
        r = await api.client.get(f"/problems/{slug}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), slug
        assert f"<code>/problems/{slug}</code>" in r.text and str(t.status) in r.text
    # A type an answer carries resolves.
    body = assert_problem(await api.get("/campaigns/424242"), 404, "not-found")
    assert (await api.client.get(body["type"])).status_code == 200
    assert_problem(await api.client.get("/problems/no-such-thing"), 404, "not-found")
    index = await api.client.get("/problems")
    assert index.status_code == 200 and index.text.count('<a href="/problems/') == len(types)


async def test_an_unknown_class_is_invalid_input_naming_it(api: Api, test_class: str, admin: Admin) -> None:
    before = table_counts(admin)
    for status in ("red", "green"):
        r = await api.post("/observations", "sensor",
                           json=observation(new_key(), status, **{"class": "no-such-class"}))
        body = assert_problem(r, 422, "invalid-input")
        assert "'no-such-class' is not registered" in body["detail"], body
        assert "foreign key" not in body["detail"] and "violates" not in body["detail"]
    assert table_counts(admin) == before


async def test_a_stream_cursor_beyond_the_journal_is_refused(api: Api, actors: Actors, test_class: str) -> None:
    cid = await Driver(actors, test_class).open()
    head = (await (await actors.reads("reader")).campaign(cid)).event_seq
    for kw in ({"headers": {"Last-Event-ID": str(head + 5)}}, {"params": {"from": head + 1}}):
        body = assert_problem(await api.get(f"/campaigns/{cid}/events", **kw), 422,
                              "cursor-beyond-end")
        assert f"its last seq is {head}" in body["detail"], body
    # Closed, a cursor at or past the end still says "nothing more" (204).
    await (await actors("operator")).abandon(cid, "done")
    r = await api.get(f"/campaigns/{cid}/events", headers={"Last-Event-ID": str(head + 5)})
    assert r.status_code == 204


async def test_operations_have_names_and_metrics_have_classes_and_request_durations(api: Api, actors: Actors, test_class: str) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    ids = {op["operationId"]: (path, method) for path, ops in spec["paths"].items()
           for method, op in ops.items()}
    assert len(ids) == sum(len(ops) for ops in spec["paths"].values())  # unique
    for name in ("list_campaigns", "show_campaign", "abandon_campaign", "reopen_campaign",
                 "retry_campaign", "abandon_campaigns", "reopen_campaigns", "campaign_events",
                 "record_observation", "show_observation", "metrics", "show_status", "livez",
                 "readyz"):
        assert name in ids, sorted(ids)
    assert all(i.replace("_", "").isalnum() and i.islower() for i in ids), sorted(ids)

    await Driver(actors, test_class).open()
    await api.get("/campaigns")
    got = samples((await api.get("/metrics")).text)
    assert got[("ledger_campaigns", (("class", test_class), ("state", "ready")))] == 1
    assert got[("ledger_campaigns", (("class", test_class), ("state", "leased")))] == 0
    count = got[("ledger_http_request_duration_seconds_count",
                 (("method", "GET"), ("route", "/campaigns")))]
    assert count >= 1
    assert got[("ledger_http_request_duration_seconds_bucket",
                (("le", "+Inf"), ("method", "GET"), ("route", "/campaigns")))] == count
