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

from conftest import TEST_PREFIX, create_database, drop_database
from drive import Driver, fingerprint, new_key, now
from ledger import Database, Kernel
from ledger.api import ApiOptions, TokenTable, create_app, hash_token, new_token
from ledger.migrations import head

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


def table_counts(admin) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Everything a refused request must leave unchanged."""
    return admin.execute(
        "SELECT (SELECT count(*) FROM ledger.campaign) AS campaigns, "
        "(SELECT count(*) FROM ledger.observation) AS observations, "
        "(SELECT count(*) FROM ledger.campaign_event) AS events, "
        "(SELECT array_agg(state || generation ORDER BY id) FROM ledger.campaign) AS states"
    ).fetchone()


# --- authentication and authorisation -----------------------------------------


async def test_missing_forged_and_malformed_tokens_get_401_problems(api: Api, actors, test_class) -> None:  # type: ignore[no-untyped-def]
    cid = await Driver(actors, test_class).open()
    for headers in ({}, {"Authorization": "Bearer " + new_token()},
                    {"Authorization": "Bearer " + api.tokens["operator"] + "x"},
                    {"Authorization": "Basic " + api.tokens["operator"]}):
        for method, url in (("GET", "/campaigns"), ("POST", f"/campaigns/{cid}/abandon"),
                            ("GET", "/metrics"), ("POST", "/observations")):
            r = await api.client.request(method, url, headers=headers)
            body = assert_problem(r, 401, "unauthenticated")
            assert r.headers["www-authenticate"].startswith("Bearer"), body
    campaign = await (await actors("reader")).campaign(cid)
    assert campaign.state == "ready"


async def test_reader_cannot_abandon_operator_can_and_is_journaled(api: Api, actors, test_class, admin) -> None:  # type: ignore[no-untyped-def]
    d = Driver(actors, test_class)
    cid = await d.open()
    before = table_counts(admin)
    for role in ("reader", "sensor"):
        r = await api.post(f"/campaigns/{cid}/abandon", role, json={"reason": "try"})
        assert_problem(r, 403, "forbidden")
        assert_problem(await api.post(f"/campaigns/{cid}/reopen", role), 403, "forbidden")
        r = await api.post("/campaigns/abandon", role, json={"filter": {"state": ["ready"]}})
        assert_problem(r, 403, "forbidden")
    assert table_counts(admin) == before

    r = await api.post(f"/campaigns/{cid}/abandon", "operator", json={"reason": "not needed"})
    assert r.status_code == 200, r.text
    assert r.json() == {"campaign_id": cid, "outcome": "abandoned", "generation": 1}
    events = await (await actors("reader")).events(cid)
    last = events[-1]
    assert last.payload["to"] == "abandoned" and last.actor == "http:operator-tok"
    assert last.payload["reason"] == "not needed"
    # Abandoning again is the state machine's refusal, not the API's.
    assert_problem(await api.post(f"/campaigns/{cid}/abandon"), 409, "illegal-transition")


async def test_sensor_records_observations_and_nothing_else(api: Api, actors, test_class, admin) -> None:  # type: ignore[no-untyped-def]
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
    obs = await (await actors("reader")).observation(r.json()["observation_id"])
    assert obs.sensor == "http:sensor-tok"


# --- idempotent intake ------------------------------------------------------------


async def test_same_idempotency_key_records_once_and_a_different_body_is_refused(api: Api, test_class, admin) -> None:  # type: ignore[no-untyped-def]
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


async def test_malformed_input_gets_4xx_problems_and_changes_nothing(api: Api, actors, test_class, admin) -> None:  # type: ignore[no-untyped-def]
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


async def test_list_filters_and_cursor_pages_cover_everything_once(api: Api, actors, test_class) -> None:  # type: ignore[no-untyped-def]
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


async def test_detail_and_status(api: Api, actors, test_class) -> None:  # type: ignore[no-untyped-def]
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


async def test_bulk_abandon_and_reopen_dry_run_then_act(api: Api, actors, test_class) -> None:  # type: ignore[no-untyped-def]
    op = await actors("operator")
    await op.register_class("once", max_attempts=1, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0)
    d = Driver(actors, test_class)
    ready = [await d.open(labels=["sweep"]) for _ in range(3)]
    closed = await d.open(labels=["sweep"])
    await op.abandon(closed, "already gone")
    await d.open()  # no label: untouched

    r = await api.post("/campaigns/abandon", json={"filter": {"label": "sweep"}, "dry_run": True})
    assert r.status_code == 200, r.text
    assert r.json()["matched"] == 3 and r.json()["outcomes"] == {}
    assert sorted(r.json()["campaign_ids"]) == sorted(ready)
    reader = await actors("reader")
    assert [(await reader.campaign(c)).state for c in ready] == ["ready"] * 3

    r = await api.post("/campaigns/abandon", json={"filter": {"label": "sweep"},
                                                    "reason": "sweep", "max_campaigns": 2})
    assert r.json()["matched"] == 2 and r.json()["truncated"] is True
    assert r.json()["outcomes"] == {"abandoned": 2}
    first = r.json()["campaign_ids"]
    r = await api.post("/campaigns/abandon", json={"filter": {"label": "sweep"}})
    assert r.json()["outcomes"] == {"abandoned": 1} and r.json()["truncated"] is False
    assert [(await reader.campaign(c)).state for c in ready] == ["abandoned"] * 3
    events = await reader.events(first[0])
    assert events[-1].actor == "http:operator-tok" and events[-1].payload["reason"] == "sweep"

    once = Driver(actors, "once")
    exhausted = [await once.exhausted() for _ in range(2)]
    r = await api.post("/campaigns/reopen", json={"filter": {"class": ["once"]}, "dry_run": True})
    assert r.json()["matched"] == 2
    r = await api.post("/campaigns/reopen", json={"filter": {"class": ["once"]},
                                                   "extra_attempts": 2})
    assert r.json()["outcomes"] == {"reopened": 2}
    for c in exhausted:
        campaign = await reader.campaign(c)
        assert campaign.state == "ready" and campaign.max_attempts == 3


# --- metrics --------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_match_the_database_after_a_scripted_sequence(api: Api, actors, test_class, db, admin) -> None:  # type: ignore[no-untyped-def]
    d = Driver(actors, test_class)
    worker, op = await d.k("worker"), await d.k("operator")
    await d.verified()
    abandoned, _ = await d.leased()
    await op.abandon(abandoned, "stop")
    lost, _ = await d.leased()
    # The reaper, with the clock a minute on: the lease has expired.
    async with (await actors("reaper")).executor.transaction(now=now() + timedelta(minutes=1)) \
            as tx:  # type: ignore[attr-defined]
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
        assert got[("ledger_campaigns", (("state", row["name"]),))] == in_db.get(row["name"], 0)
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
