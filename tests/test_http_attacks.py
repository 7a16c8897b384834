"""The HTTP surface under attack (README "Security: what each token can do to the
others"), over real HTTP: uvicorn serving the
app on a free port of this machine (``ledger.api.server``, as ``ledger serve``
configures it), and ``ledger serve`` itself where its settings are the point.

One test per finding, each shown failing on the code before the fix:
hostile documents and instants are refused naming the field and can no longer
be stored by any path; whatever the database holds, every route and page
renders for every reader; ``ledger serve`` honours the cookie settings; the
cookie names a session the database keeps (sign-out and token rotation end
it); metrics labels stay bounded; bulk tokens are keyed, bound, expiring and
single use, and large bulk actions run as jobs; Unicode digits are refused,
not a 500; wrong credentials are throttled per address and per credential
prefix while a valid one from the same address is always served (directly, on
`ledger serve`, and as the client a trusted proxy names; an untrusted peer's
proxy headers are ignored), and each token has its own request limit;
half-sent requests are dropped;
every HTML page has frame protection and a CSP."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import TEST_PREFIX, Actors, Admin
from drive import Driver, new_key, now
from ledger import Database
from ledger.api import ApiOptions, TokenTable, create_app, hash_token, new_token

pytestmark = pytest.mark.anyio

ROLES = ("reader", "operator", "sensor")
SECRET = "s3cret-" + "k" * 40
PROBLEM = "application/problem+json"


def table(tokens: dict[str, str], names: dict[str, str] | None = None) -> TokenTable:
    return TokenTable.parse(",".join(f"{(names or {}).get(r, r + '-tok')}:{r}:{hash_token(t)}"
                                     for r, t in tokens.items()))


def options(**kw: Any) -> ApiOptions:
    # Only the options this code has: the file also ran against the code before
    # the fix, to see each test fail there.
    known = {f.name for f in fields(ApiOptions)}
    return ApiOptions(**{k: v for k, v in kw.items() if k in known})


@dataclass
class Live:
    """An app served over real HTTP, and one token per role."""

    base: str
    tokens: dict[str, str]
    app: Any

    def bearer(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def client(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, timeout=httpx.Timeout(30.0), **kw)


async def serve(db: Database, tokens: dict[str, str], opts: ApiOptions,
                **limits: Any) -> AsyncIterator[Live]:
    from ledger.api import server as server_module

    app = create_app(db, table(tokens), opts)
    kwargs: dict[str, Any] = {}
    if hasattr(server_module, "ServerLimits"):
        kwargs["lifespan"] = False  # run here: its pools close before the test ends
        if limits:
            kwargs["limits"] = server_module.ServerLimits(**limits)
    async with app.router.lifespan_context(app):
        srv = await server_module.BackgroundServer(app, **kwargs).start()
        try:
            yield Live(f"http://127.0.0.1:{srv.port}", tokens, app)
        finally:
            await srv.stop()


@pytest.fixture
async def live(db: Database) -> AsyncIterator[Live]:
    tokens = {role: new_token() for role in ROLES}
    async for served in serve(db, tokens, options(session_secret=SECRET, bulk_inline_max=5,
                                                  auth_failures_per_minute=5)):
        yield served


def assert_problem(r: httpx.Response, status: int, mentions: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body: dict[str, Any] = r.json()
    if mentions is not None:
        assert mentions in (body.get("detail") or ""), body
    return body


def nested(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def observation(**extra: Any) -> dict[str, Any]:
    return {"sensor": "ext", "objective_key": new_key(), "target": "repo@main", "status": "red",
            "started_at": (now() - timedelta(seconds=5)).isoformat(), "class": "test", **extra}


# --- findings 1 and 2: hostile input is refused, by the API and by the schema -----------


HOSTILE_FIELDS = {
    "details": nested(260),
    "desired_state": nested(260),
    "started_at": "0001-01-01T00:00:00+14:00",  # a BC instant in UTC
    "finished_at": "9999-12-31T23:59:59-14:00",  # past year 9999 in UTC
    "tick": "0001-01-01T00:00:00Z",
}


async def test_hostile_documents_and_instants_are_refused_naming_the_field(live: Live, test_class: str, admin: Admin) -> None:
    async with live.client(headers=live.bearer("sensor")) as client:
        for field, value in {**HOSTILE_FIELDS, "details": nested(33),
                             "desired_state": {"big": "x" * (300 * 1024)}}.items():
            r = await client.post("/observations", json=observation(**{field: value}))
            assert_problem(r, 422, field)
        for field, value in HOSTILE_FIELDS.items():
            r = await client.post("/observations", json=observation(**{field: value}))
            assert_problem(r, 422, field)
        # Within the bounds is fine: 32 levels, an instant of 2001.
        r = await client.post("/observations", json=observation(
            details=nested(32), started_at="2001-01-01T00:00:00+14:00"))
        assert r.status_code == 202, r.text
    assert admin.execute("SELECT count(*) AS n FROM ledger.observation").fetchone()["n"] == 1
    # No other path stores them either: the schema refuses what the API refuses.
    for column, value in (("details", json.dumps(nested(33))), ("details", "[1]"),
                          ("started_at", "0001-01-01T00:00:00+14:00"),
                          ("tick", "infinity")):
        params = {"details": "{}", "started_at": "2020-01-01Z", "tick": None, column: value}
        with pytest.raises(psycopg.errors.CheckViolation):
            with admin.transaction():
                admin.execute(
                    "INSERT INTO ledger.observation (sensor, target, objective_key, status, "
                    "started_at, finished_at, tick, details, effect, recorded_at) VALUES "
                    "('s', 't', 'k', 'red', %(started_at)s, 'infinity', %(tick)s, "
                    "%(details)s::jsonb, 'recorded', now())"
                    if column == "tick" else
                    "INSERT INTO ledger.observation (sensor, target, objective_key, status, "
                    "started_at, finished_at, tick, details, effect, recorded_at) VALUES "
                    "('s', 't', 'k', 'red', %(started_at)s, '2021-01-01Z', %(tick)s, "
                    "%(details)s::jsonb, 'recorded', now())", params)
    with pytest.raises(psycopg.errors.CheckViolation):
        with admin.transaction():
            admin.execute("UPDATE ledger.campaign SET desired_state = %s::jsonb",
                          (json.dumps(nested(40)),))


# --- reads never fail on what the database holds ---------------------------------------


def _hostile_rows(admin: Admin, cid: int, test_class: str) -> int:
    """Rows no path may store now, as if from before the bounds: the bounds
    dropped in this test's own database, the rows written as the administrator."""
    for table_, constraint in (("observation", "observation_details_bounded"),
                               ("observation", "observation_instants_sane"),
                               ("observation", "observation_ordered")):
        admin.execute(f"ALTER TABLE ledger.{table_} DROP CONSTRAINT IF EXISTS {constraint}")
    deep = json.dumps(nested(260))
    deeper = "[" * 3000 + "]" * 3000  # past Python's recursion limit
    # the campaign's bounds are the guard trigger's: past it as the journal's are
    admin.execute("SET session_replication_role = replica")
    try:
        admin.execute("UPDATE ledger.campaign SET desired_state = %s::jsonb, "
                      "opening_observation = '[1, 2]', objective_key = %s WHERE id = %s",
                      (deep, "<script>alert(1)</script>" + "k" * 300, cid))
    finally:
        admin.execute("SET session_replication_role = DEFAULT")
    row = admin.execute(
        "INSERT INTO ledger.observation (sensor, target, objective_key, class, status, "
        "started_at, finished_at, tick, details, campaign_id, effect, recorded_at) "
        "SELECT 'hostile<b>', c.target, c.objective_key, c.class, 'red', "
        "'0001-01-01T00:00:00+14:00', 'infinity', '-infinity', %s::jsonb, c.id, 'recorded', now() "
        "FROM ledger.campaign c WHERE c.id = %s RETURNING id", (deep, cid)).fetchone()
    for details in (deeper, '{"n": 1e5000}', '"just a string"'):
        admin.execute(
            "INSERT INTO ledger.observation (sensor, target, objective_key, class, status, "
            "started_at, finished_at, details, campaign_id, effect, recorded_at) "
            "SELECT 'hostile-2', c.target, c.objective_key, c.class, 'red', "
            "'0001-01-01T00:00:00Z', '0001-01-01T00:00:00Z', %s::jsonb, c.id, 'recorded', now() "
            "FROM ledger.campaign c WHERE c.id = %s", (details, cid))
    # The journal: a worker-written event as deep as that, and a BC campaign time.
    seq = admin.execute("SELECT event_seq + 1 AS s FROM ledger.campaign WHERE id = %s",
                        (cid,)).fetchone()["s"]
    admin.execute("SET session_replication_role = replica")  # past the journal's triggers
    try:
        admin.execute(
            "INSERT INTO ledger.campaign_event (campaign_id, seq, generation, type, actor, "
            "payload, created_at) VALUES (%s, %s, 0, 'progress', 'worker-x', %s::jsonb, '-infinity')",
            (cid, seq, deeper))
        admin.execute("UPDATE ledger.campaign SET event_seq = %s, "
                      "next_attempt_at = '0001-01-01T00:00:00+14:00' WHERE id = %s", (seq, cid))
    finally:
        admin.execute("SET session_replication_role = DEFAULT")
    return int(row["id"])


def _get_routes(app: Any, cid: int, oid: int, test_class: str) -> list[str]:
    """Every GET route of the API (its OpenAPI document) and of the dashboard."""
    values = {"campaign_id": str(cid), "observation_id": str(oid), "attempt_no": "1",
              "name": test_class, "action": "abandon", "slug": "invalid-input",
              "job_id": "job-" + "0" * 32}
    urls = []
    for path, operations in app.openapi()["paths"].items():
        if "get" in operations and "bulk-jobs" not in path:
            urls.append(re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path))
    ui = next(r for r in app.routes if getattr(r, "path", "") == "/ui").app

    def walk(routes: list[Any]) -> list[Any]:
        found = []
        for route in routes:
            inner = getattr(route, "original_router", None)  # an included router
            found += walk(inner.routes) if inner is not None else [route]
        return found

    for route in walk(ui.routes):
        path = getattr(route, "path", "")
        # (a campaign's approval page is a 404 until it was asked for one: the hostile
        # campaign never was; tests/test_dashboard_approval_browser.py renders it)
        if "GET" in (getattr(route, "methods", None) or ()) and path not in ("/login",
                                                                            "/campaigns/{campaign_id}/approval"):
            url = "/ui" + re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
            urls.append(url + ("?class=" + test_class if "/bulk/" in url else ""))
    return urls + ["/ui/?q=k", f"/ui/?class={test_class}", "/ui/autonomy?days=366"]


async def test_every_reader_reads_every_page_and_route_over_hostile_rows(live: Live, actors: Actors, admin: Admin, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, gen = await d.attempted()
    await d.open()
    oid = _hostile_rows(admin, cid, test_class)
    urls = _get_routes(live.app, cid, oid, test_class)
    assert len(urls) >= 15, urls
    failed: list[tuple[str, str, int]] = []
    for role in ROLES:
        async with live.client(headers=live.bearer(role)) as client:
            for url in urls:
                if url.endswith("/events"):
                    async with client.stream("GET", url) as r:
                        status = r.status_code
                        if status == 200:  # the first event renders, then we leave
                            async for line in r.aiter_lines():
                                if line.startswith("data:"):
                                    json.loads(line[5:])
                                    break
                else:
                    r = await client.get(url)
                    status = r.status_code
                    if status == 200 and url.startswith("/ui/campaigns/"):
                        assert "<script>alert" not in r.text  # escaped, never markup
                if status >= 500 or status == 422 or (status >= 400 and status != 403):
                    failed.append((role, url, status))
    assert failed == [], failed
    async with live.client(headers=live.bearer("reader")) as client:
        detail = (await client.get(f"/campaigns/{cid}")).json()["campaign"]
        stored = (await client.get(f"/observations/{oid}")).json()
        page = (await client.get(f"/ui/campaigns/{cid}")).text
    assert "unrenderable" in json.dumps(detail["desired_state"])
    assert detail["opening_observation"] == {"value": [1, 2]}
    assert "unrenderable" in page and "&lt;script&gt;alert(1)" in page
    assert stored["started_at"].startswith("0001-01-01") and stored["finished_at"].startswith("9999")


# --- `ledger serve` honours the cookie settings ----------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_serve(db_url: str, tokens: dict[str, str], log: Path, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    environment = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
                   "LEDGER_API_TOKENS": ",".join(f"{r}-tok:{r}:{hash_token(t)}"
                                                 for r, t in tokens.items()),
                   "LEDGER_LOG_LEVEL": "warning", **env}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "serve", "--port", str(port),
                                 "--keepalive", "0.5"], env=environment, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            if httpx.get(f"{url}/livez", timeout=1.0).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass  # not listening yet
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)  # polling interval of the condition above


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def test_serve_honours_secure_cookies_and_the_session_secret(db_url: str, tmp_path: Path) -> None:
    from itsdangerous import BadSignature, TimestampSigner

    tokens = {role: new_token() for role in ROLES}
    proc, url = _start_serve(db_url, tokens, tmp_path / "serve.log",
                             LEDGER_SECURE_COOKIES="true", LEDGER_SESSION_SECRET=SECRET)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            r = await client.post("/ui/login", data={"token": tokens["reader"], "next": "/ui/"})
        assert r.status_code == 303, r.text
        cookie = r.headers["set-cookie"]
        assert "; secure" in cookie.lower(), cookie
        value = cookie.split(";")[0].split("=", 1)[1]
        # Signed with the configured secret, not a key anyone who read the
        # token digests could derive.
        TimestampSigner(SECRET).unsign(value)
        from ledger.api.cookies import session_secret
        derived = session_secret(None, [hash_token(t) for t in tokens.values()])
        with pytest.raises(BadSignature):
            TimestampSigner(derived).unsign(value)
    finally:
        _stop(proc)


async def test_the_session_is_secure_over_https_even_unconfigured(db: Database) -> None:
    tokens = {role: new_token() for role in ROLES}
    app = create_app(db, table(tokens), options())
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="https://ledger.example") as client:
            r = await client.post("/ui/login", data={"token": tokens["reader"]})
    assert r.status_code == 303 and "; secure" in r.headers["set-cookie"].lower()


# --- the cookie names a session; sign-out and rotation end it ----------------


async def test_the_cookie_holds_no_token_and_sign_out_ends_every_copy(live: Live, db: Database, actors: Actors, test_class: str) -> None:
    cid = await Driver(actors, test_class).open()
    async with live.client() as browser, live.client() as thief:
        r = await browser.post("/ui/login", data={"token": live.tokens["operator"]})
        assert r.status_code == 303
        value = browser.cookies["ledger_session"]
        payload = base64.b64decode(value.split(".")[0] + "==")
        assert live.tokens["operator"].encode() not in payload and b"ldg_" not in payload
        thief.cookies.set("ledger_session", value)
        assert (await thief.get(f"/campaigns/{cid}")).status_code == 200
        page = await browser.get("/ui/")
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text).group(1)
        assert (await browser.post("/ui/logout", data={"csrf": csrf})).status_code == 303
        # Every copy of the cookie stops working at once.
        assert_problem(await thief.get(f"/campaigns/{cid}"), 401)
        assert (await thief.get("/ui/")).status_code == 303

        # "Everywhere": one sign-out ends every session of the token.
        a = await browser.post("/ui/login", data={"token": live.tokens["reader"]})
        other = live.client()
        async with other:
            await other.post("/ui/login", data={"token": live.tokens["reader"]})
            assert (await other.get("/campaigns")).status_code == 200
            page = await browser.get("/ui/")
            csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text).group(1)
            assert a.status_code == 303
            await browser.post("/ui/logout", data={"csrf": csrf, "everywhere": "1"})
            assert_problem(await other.get("/campaigns"), 401)

    # Token rotation: a server with the operator's token replaced honours no
    # session made with the old one (the same server process's sessions work
    # on any other with the same tokens).
    async with live.client() as browser:
        await browser.post("/ui/login", data={"token": live.tokens["operator"]})
        cookie = browser.cookies["ledger_session"]
    same = dict(live.tokens)
    rotated = {**live.tokens, "operator": new_token()}
    for tokens, expected in ((same, 200), (rotated, 401)):
        async for other_server in serve(db, tokens, options(session_secret=SECRET)):
            async with other_server.client() as client:
                client.cookies.set("ledger_session", cookie)
                assert (await client.get("/campaigns")).status_code == expected


# --- metrics labels are bounded ---------------------------------------------------


async def test_made_up_methods_and_paths_do_not_grow_metrics(live: Live) -> None:
    host, port = live.base.removeprefix("http://").split(":")

    async def junk(n: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for i in range(n):
                writer.write(f"M{n}X{i} /nowhere/{n}/{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"content-length: (\d+)", head, re.I)
                await reader.readexactly(int(length.group(1)) if length else 0)
        finally:
            writer.close()

    await asyncio.gather(*(junk(n) for n in range(1, 11)), *(junk(200 + n) for n in range(5)))
    async with live.client(headers=live.bearer("reader")) as client:
        text = (await client.get("/metrics")).text
    series = [s for family in text_string_to_metric_families(text)
              if family.name in ("ledger_http_requests", "ledger_http_request_duration_seconds")
              for s in family.samples]
    methods = {s.labels.get("method") for s in series}
    routes = {s.labels.get("route") for s in series}
    assert methods <= {"GET", "POST", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}, methods
    assert routes <= {"unmatched", "/metrics"}, routes
    assert len(series) < 60, len(series)  # 1,055 odd requests: a handful of series


# --- bulk tokens are keyed, bound, expiring and single use ---------------------


async def test_bulk_tokens_mean_this_caller_previewed_this_set_recently_here(live: Live, db: Database, actors: Actors, test_class: str) -> None:
    import hashlib

    from ledger import bulk

    d = Driver(actors, test_class)
    batch = sorted([await d.open(labels=["sweep"]) for _ in range(3)])
    body = {"filter": {"label": "sweep"}}
    selector = bulk.Selector(label="sweep")
    async with live.client(headers=live.bearer("operator")) as op, \
            live.client(headers=live.bearer("reader")) as reader:
        # The old unkeyed digest, computed without any preview, is refused.
        text = f"abandon\n{selector.canonical()}\n{','.join(map(str, batch))}"
        computed = "sel1-" + hashlib.sha256(text.encode()).hexdigest()[:32]
        r = await op.post("/campaigns/abandon", json={**body, "campaign_ids": batch,
                                                      "selection": computed})
        assert r.status_code == 422
        # A reader's preview is the reader's: an operator cannot confirm it.
        theirs = (await reader.post("/campaigns/abandon", json=body)).json()
        r = await op.post("/campaigns/abandon", json={**body, "campaign_ids": theirs["campaign_ids"],
                                                      "selection": theirs["selection"]})
        assert_problem(r, 422, "preview again")
        # An expired preview (made with the server's key, an hour ago) is refused.
        expired = bulk.token_of(SECRET.encode(), "abandon", selector, batch, "http:operator-tok",
                                int(time.time()) - 3600)
        r = await op.post("/campaigns/abandon", json={**body, "campaign_ids": batch,
                                                      "selection": expired})
        assert_problem(r, 422, "expired")
        # Another deployment's preview means nothing here.
        async for elsewhere in serve(db, live.tokens, options(session_secret="another-" + SECRET)):
            async with elsewhere.client(headers=elsewhere.bearer("operator")) as other:
                foreign = (await other.post("/campaigns/abandon", json=body)).json()
        r = await op.post("/campaigns/abandon", json={**body, "campaign_ids": foreign["campaign_ids"],
                                                      "selection": foreign["selection"]})
        assert_problem(r, 422, "preview again")
        assert [await _state(actors, c) for c in batch] == ["ready"] * 3
        # A real preview acts once.
        mine = (await op.post("/campaigns/abandon", json=body)).json()
        confirm = {**body, "campaign_ids": mine["campaign_ids"], "selection": mine["selection"]}
        r = await op.post("/campaigns/abandon", json=confirm)
        assert r.status_code == 200 and sorted(r.json()["campaign_ids"]) == batch, r.text
        assert_problem(await op.post("/campaigns/abandon", json=confirm), 422, "already")


async def _state(actors: Actors, cid: int) -> str:
    return (await (await actors.reads()).campaign(cid)).state


async def test_a_large_bulk_action_runs_as_a_job_with_progress_over_sse(live: Live, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    batch = sorted([await d.open(labels=["big"]) for _ in range(12)])  # inline: at most 5
    body = {"filter": {"label": "big"}, "reason": "cleanup"}
    async with live.client(headers=live.bearer("operator")) as op:
        preview = (await op.post("/campaigns/abandon", json=body)).json()
        r = await op.post("/campaigns/abandon", json={**body, "campaign_ids": preview["campaign_ids"],
                                                      "selection": preview["selection"]})
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        assert r.headers["location"] == f"/bulk-jobs/{job}"
        events: list[tuple[str, dict[str, Any]]] = []
        async with asyncio.timeout(60):
            async with op.stream("GET", f"/bulk-jobs/{job}/events") as stream:
                assert stream.status_code == 200
                name = ""
                async for line in stream.aiter_lines():
                    if line.startswith("event:"):
                        name = line[6:].strip()
                    elif line.startswith("data:"):
                        events.append((name, json.loads(line[5:])))
        assert events[-1][0] == "done" and all(n == "progress" for n, _ in events[:-1])
        done = events[-1][1]
        assert done["state"] == "done" and done["total"] == 12 and done["done"] == 12
        assert sorted(i["campaign_id"] for i in done["items"]) == batch  # every item reported
        assert {i["outcome"] for i in done["items"]} == {"abandoned"}
        assert (await op.get(f"/bulk-jobs/{job}")).json()["items"] == done["items"]
    assert {await _state(actors, c) for c in batch} == {"abandoned"}
    async with live.client(headers=live.bearer("reader")) as reader:
        assert_problem(await reader.get(f"/bulk-jobs/{job}"), 403)


# --- numbers are ASCII decimal ---------------------------------------------------


async def test_unicode_digits_are_refused_not_a_500(live: Live, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid = await d.open(labels=["u"])
    async with live.client(headers=live.bearer("operator")) as op:
        for digits in ("²", "٣", "1²"):
            r = await op.get(f"/campaigns/{cid}/events",
                             headers={b"Last-Event-ID": digits.encode()})
            assert_problem(r, 422, "Last-Event-ID")
            r = await op.get(f"/ui/autonomy?days={digits}")
            assert r.status_code == 422 and "days" in r.text
        async with live.client() as browser:
            await browser.post("/ui/login", data={"token": live.tokens["operator"]})
            page = await browser.get("/ui/bulk/abandon?label=u")
            csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text).group(1)
            form = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)"',
                                   page.text))
            r = await browser.post("/ui/bulk/abandon", data={**form, "ids": "²", "csrf": csrf})
            assert r.status_code == 422, r.status_code
            r = await browser.post(f"/ui/campaigns/{cid}/reopen",
                                   data={"extra_attempts": "²", "csrf": csrf})
            assert r.status_code == 422, r.status_code
    assert await _state(actors, cid) == "ready"


# --- throttling, slow clients, frame protection --------------------------------


def wrong(prefix: str = "") -> dict[str, str]:
    """A bearer header with a token nobody configured (starting with ``prefix``)."""
    return {"Authorization": f"Bearer {prefix}{new_token()[len(prefix):]}"}


def via(address: str) -> dict[str, str]:
    """What a reverse proxy adds for a client at ``address``."""
    return {"X-Forwarded-For": address}


def assert_limit(r: httpx.Response, limit: str) -> dict[str, Any]:
    """A 429 problem naming ``limit``, with a Retry-After."""
    body = assert_problem(r, 429)
    assert body.get("limit") == limit, body
    assert 1 <= int(r.headers["retry-after"]) <= 60 and body["retry_after_s"] >= 1, r.headers
    return body


async def test_wrong_tokens_are_throttled_and_a_valid_one_from_the_same_address_is_served(live: Live) -> None:
    """Finding: after enough wrong tokens from one address, a valid token (and
    a valid sign-in, and a valid session) from that address was refused too --
    behind a NAT or a proxy, by anyone's doing."""
    async with live.client() as client, live.client() as browser:
        r = await browser.post("/ui/login", data={"token": live.tokens["operator"]})
        assert r.status_code == 303  # signed in before the storm
        for _ in range(5):
            assert_problem(await client.get("/campaigns", headers=wrong()), 401)
        throttled = await client.get("/campaigns", headers=wrong())
        assert throttled.status_code == 429
        # Every valid credential from the same address is served all the same.
        assert (await client.get("/campaigns", headers=live.bearer("reader"))).status_code == 200
        assert (await client.get("/ui/", headers=live.bearer("operator"))).status_code == 200
        assert (await browser.get("/campaigns")).status_code == 200
        assert (await browser.get("/ui/")).status_code == 200
        r = await client.post("/ui/login", data={"token": live.tokens["sensor"]})
        assert r.status_code == 303, r.status_code
        # ... while wrong ones stay throttled, by the API, the dashboard and the form.
        body = assert_limit(throttled, "auth-failures-per-address")
        assert "LEDGER_API_AUTH_FAILURES_PER_MINUTE" in body["detail"]
        assert_limit(await client.get("/campaigns", headers=wrong()), "auth-failures-per-address")
        r = await client.get("/ui/", headers=wrong())
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        r = await client.post("/ui/login", data={"token": "guess"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert 'id="sign-in"' in r.text  # the form again: a valid token still signs in
        # No proxy is trusted here: a made-up X-Forwarded-For changes nothing.
        assert_limit(await client.get("/campaigns", headers={**wrong(), **via("198.51.100.9")}),
                     "auth-failures-per-address")
        # The probes need no token and are never throttled.
        assert (await client.get("/livez")).status_code == 200


async def test_the_sign_in_form_is_throttled(db: Database) -> None:
    tokens = {role: new_token() for role in ROLES}
    async for served in serve(db, tokens, options(auth_failures_per_minute=3)):
        async with served.client() as client:
            codes = [(await client.post("/ui/login", data={"token": "guess-" + str(i)})).status_code
                     for i in range(5)]
            valid = await client.post("/ui/login", data={"token": tokens["reader"]})
    assert codes == [401, 401, 401, 429, 429], codes
    assert valid.status_code == 303, valid.status_code


async def test_guesses_at_one_credential_are_throttled_without_locking_out_others(db: Database) -> None:
    """Guesses sharing a token's first characters are throttled together,
    whatever address each comes from; a token starting otherwise, from a
    fresh address, is not, and valid tokens never are."""
    tokens = {role: new_token() for role in ROLES}
    guess = "ldg_Guess000"
    async for served in serve(db, tokens, options(auth_failures_per_minute=5,
                                                  forwarded_allow_ips=("127.0.0.1",))):
        async with served.client() as client:
            for i in range(5):
                r = await client.get("/campaigns", headers={**wrong(guess), **via(f"203.0.113.{i}")})
                assert_problem(r, 401)
            r = await client.get("/campaigns", headers={**wrong(guess), **via("203.0.113.10")})
            body = assert_limit(r, "auth-failures-per-credential")
            assert guess not in body["detail"]  # what was guessed is not echoed
            r = await client.post("/ui/login", data={"token": wrong(guess)["Authorization"][7:]},
                                  headers=via("203.0.113.11"))
            assert r.status_code == 429
            # Another credential's holder, from a fresh address: not throttled.
            assert_problem(await client.get("/campaigns", headers={**wrong("ldg_Other000"),
                                                                    **via("203.0.113.12")}), 401)
            for i in range(5):
                r = await client.get("/campaigns", headers={**served.bearer("operator"),
                                                            **via(f"203.0.113.{i}")})
                assert r.status_code == 200, r.text


async def test_a_trusted_proxy_names_the_client_and_an_untrusted_peers_header_is_ignored(db: Database) -> None:
    tokens = {role: new_token() for role in ROLES}
    # Trusted: each client the proxy names has its own count (and its https counts).
    async for served in serve(db, tokens, options(auth_failures_per_minute=3,
                                                  forwarded_allow_ips=("127.0.0.0/8", "::1"))):
        async with served.client() as client:
            codes = [(await client.get("/campaigns", headers={**wrong(), **via("198.51.100.7")}))
                     .status_code for _ in range(4)]
            assert codes == [401, 401, 401, 429], codes
            r = await client.get("/campaigns", headers={**served.bearer("sensor"),
                                                        **via("198.51.100.7")})
            assert r.status_code == 200, r.text
            # Neither another client behind the proxy nor the proxy itself is throttled.
            assert_problem(await client.get("/campaigns", headers={**wrong(), **via("198.51.100.8")}),
                           401)
            assert_problem(await client.get("/campaigns", headers=wrong()), 401)
            r = await client.post("/ui/login", data={"token": tokens["reader"]},
                                  headers={**via("198.51.100.7"), "X-Forwarded-Proto": "https"})
            assert r.status_code == 303 and "; secure" in r.headers["set-cookie"].lower()
    # Untrusted (only 192.0.2.1 is: an address that is no peer here): the
    # headers of 127.0.0.1 mean nothing, so a made-up client escapes nothing.
    async for served in serve(db, tokens, options(auth_failures_per_minute=3,
                                                  forwarded_allow_ips=("192.0.2.1",))):
        async with served.client() as client:
            codes = [(await client.get("/campaigns", headers={**wrong(), **via(f"198.51.100.{i}")}))
                     .status_code for i in range(4)]
            assert codes == [401, 401, 401, 429], codes
            assert (await client.get("/campaigns", headers={**served.bearer("reader"),
                                                            **via("198.51.100.1")})).status_code == 200
            r = await client.post("/ui/login", data={"token": tokens["reader"]},
                                  headers={"X-Forwarded-Proto": "https"})
            assert r.status_code == 303 and "; secure" not in r.headers["set-cookie"].lower()


async def test_ledger_serve_serves_a_valid_token_after_wrong_ones_directly_and_through_a_trusted_proxy(db_url: str, tmp_path: Path) -> None:
    """The finding as reported, on `ledger serve` itself: wrong tokens, then a
    valid operator token from the same address -- directly, and as a client
    named by a trusted proxy (LEDGER_FORWARDED_ALLOW_IPS)."""
    tokens = {role: new_token() for role in ROLES}
    proc, url = _start_serve(db_url, tokens, tmp_path / "serve.log",
                             LEDGER_API_AUTH_FAILURES_PER_MINUTE="3",
                             LEDGER_FORWARDED_ALLOW_IPS="127.0.0.1")
    operator = {"Authorization": f"Bearer {tokens['operator']}"}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            for client_headers in ({}, via("203.0.113.50")):
                codes = [(await client.get("/campaigns", headers={**wrong(), **client_headers}))
                         .status_code for _ in range(4)]
                assert codes == [401, 401, 401, 429], (client_headers, codes)
                r = await client.get("/campaigns", headers={**operator, **client_headers})
                assert r.status_code == 200, (client_headers, r.text)
                r = await client.post("/campaigns/abandon", json={"filter": {"label": "none"}},
                                      headers={**operator, **client_headers})
                assert r.status_code == 200, (client_headers, r.text)  # a preview: nothing matched
            # The anonymous ones stay throttled; another client behind the proxy is not.
            assert_limit(await client.get("/campaigns", headers={**wrong(), **via("203.0.113.50")}),
                         "auth-failures-per-address")
            assert_problem(await client.get("/campaigns", headers={**wrong(), **via("203.0.113.51")}),
                           401)
    finally:
        _stop(proc)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


async def test_each_token_has_its_own_request_limit(db: Database) -> None:
    tokens = {role: new_token() for role in ROLES}
    async for served in serve(db, tokens, options(requests_per_minute=3)):
        async with served.client() as client, served.client() as browser:
            codes = [(await client.get("/campaigns", headers=served.bearer("reader"))).status_code
                     for _ in range(3)]
            assert codes == [200, 200, 200], codes
            body = assert_limit(await client.get("/campaigns", headers=served.bearer("reader")),
                                "requests-per-credential")
            assert "reader-tok" in body["detail"] and "LEDGER_API_REQUESTS_PER_MINUTE" in body["detail"]
            # Its pages and sign-ins are the same token's requests.
            r = await client.get("/ui/", headers=served.bearer("reader"))
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert (await browser.post("/ui/login", data={"token": tokens["reader"]})).status_code == 429
            # Another token, from the same address, has its own.
            assert (await client.get("/campaigns", headers=served.bearer("operator"))).status_code == 200
            assert (await browser.post("/ui/login", data={"token": tokens["operator"]})).status_code == 303
            assert (await browser.get("/campaigns")).status_code == 200
            # And it is no failure: wrong tokens are still answered 401.
            assert_problem(await client.get("/campaigns", headers=wrong()), 401)


async def test_an_ipv6_client_counts_by_its_64(db: Database) -> None:
    """A host holds a whole /64: its addresses are one client to the throttle."""
    tokens = {role: new_token() for role in ROLES}
    app = create_app(db, table(tokens), options(auth_failures_per_minute=3))

    def client(address: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 4000)),
                                 base_url="http://ledger.test")

    async with app.router.lifespan_context(app):
        codes = []
        for i in range(4):
            async with client(f"2001:db8:1:2::{i + 1}") as c:
                codes.append((await c.get("/campaigns", headers=wrong())).status_code)
        async with client("2001:db8:1:3::1") as other, client("2001:db8:1:2::99") as same:
            elsewhere = (await other.get("/campaigns", headers=wrong())).status_code
            valid = (await same.get("/campaigns", headers={"Authorization": f"Bearer {tokens['reader']}"})).status_code
    assert codes == [401, 401, 401, 429], codes
    assert (elsewhere, valid) == (401, 200)


def test_the_throttles_memory_is_bounded_and_made_up_prefixes_do_not_free_an_address() -> None:
    from ledger.api.problems import TooManyRequests
    from ledger.api.throttle import AuthThrottle

    # An hour's window: the loops below take far less than one failure's share of it.
    throttle = AuthThrottle(failures=1000, requests=10, window_s=3600, max_keys=100)
    for i in range(1000):
        throttle.failed("198.51.100.1", f"ldg_{i:08d}")
    assert len(throttle.prefixes) == 100 and len(throttle.addresses) == 1
    with pytest.raises(TooManyRequests) as refused:
        throttle.failed("198.51.100.1", "ldg_fresh000")
    assert refused.value.limit == "auth-failures-per-address"


async def test_half_sent_requests_are_dropped_and_connections_bounded(db: Database) -> None:
    tokens = {role: new_token() for role in ROLES}
    async for served in serve(db, tokens, options(), request_timeout_s=0.5, max_connections=4):
        host, port = served.base.removeprefix("http://").split(":")

        async def closed_by_server(first: bytes, drip: bytes) -> float:
            reader, writer = await asyncio.open_connection(host, int(port))
            started = time.monotonic()
            writer.write(first)
            try:
                async with asyncio.timeout(20):
                    while not reader.at_eof():
                        writer.write(drip)  # a byte now and then: slowloris
                        await writer.drain()
                        try:
                            await asyncio.wait_for(reader.read(100), 0.1)
                        except TimeoutError:
                            continue
                return time.monotonic() - started
            except (ConnectionError, OSError):
                return time.monotonic() - started
            finally:
                writer.close()

        # Headers that never end, and a body that never comes, are both dropped.
        for first, drip in ((b"GET /livez HTTP/1.1\r\nHost: x\r\n", b"X"),
                            (b"POST /observations HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                             b"Content-Type: application/json\r\n\r\n{", b" ")):
            assert await closed_by_server(first, drip) < 15
        # A kept-alive connection's next request gets the same deadline.
        assert await closed_by_server(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\nGET /li", b"v") < 15

        # Above the connection limit, a request is answered 503 instead of queued.
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(4)]
        try:
            async with httpx.AsyncClient(base_url=served.base, timeout=10) as client:
                assert (await client.get("/livez")).status_code == 503
        finally:
            for _, w in idle:
                w.close()


async def test_every_html_page_has_frame_protection_and_a_csp(live: Live) -> None:
    async with live.client() as client:
        for url in ("/docs", "/redoc", "/problems", "/problems/invalid-input", "/ui/login",
                    "/docs/oauth2-redirect"):
            r = await client.get(url)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), url
            assert r.headers.get("x-frame-options") == "DENY", (url, r.headers)
            csp = r.headers.get("content-security-policy", "")
            assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp, (url, csp)
            scripts = csp.split("script-src")[1].split(";")[0] if "script-src" in csp else ""
            assert "unsafe-inline" not in scripts, csp
