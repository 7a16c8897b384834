"""The HTTP API as it runs: real ``ledger serve`` processes (uvicorn) on free
ports against the test's database. Event streams resumed on another process,
keepalives, the end of a stream, and a bounded schemathesis fuzz of the OpenAPI
schema (every answer under 500, every refusal problem+json, nothing changed by
what was refused)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import TEST_PREFIX, Actors, Admin
from drive import Driver, fingerprint
from ledger.api import hash_token, new_token

pytestmark = pytest.mark.anyio

KEEPALIVE_S = 0.3
ROLES = ("reader", "operator", "sensor")


@dataclass
class Server:
    """One ``ledger serve`` process."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_live(server: Server, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if server.proc.poll() is not None:
            raise AssertionError(f"ledger serve exited: {server.log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{server.url}/livez", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise AssertionError(f"ledger serve never answered: {server.log.read_text()[-2000:]}")
        time.sleep(0.05)  # polling interval of the condition above


def ledger(*args: str, env: dict[str, str] | None = None,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ledger", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "NO_COLOR": "1", **(env or {})})
    assert not check or proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def tokens() -> dict[str, str]:
    """Role -> token; the operator's made by `ledger token create`, as a person would."""
    made = json.loads(ledger("token", "create", "operator", "--name", "operator-tok",
                             "--json").stdout)
    assert made["entry"] == f"operator-tok:operator:{hash_token(made['token'])}"
    return {"reader": new_token(), "operator": made["token"], "sensor": new_token()}


@pytest.fixture
def servers(db_url: str, tokens: dict[str, str], tmp_path: Path) -> Iterator[list[Server]]:
    """Two ``ledger serve`` processes on the same database."""
    env = {
        **os.environ,
        "LEDGER_DATABASE_URL": db_url,
        "LEDGER_ROLE_PREFIX": TEST_PREFIX,
        "LEDGER_API_TOKENS": ",".join(f"{r}-tok:{r}:{hash_token(t)}" for r, t in tokens.items()),
        "LEDGER_API_KEEPALIVE_S": str(KEEPALIVE_S),
        "LEDGER_API_MAX_BODY": str(64 * 1024),
        "LEDGER_LOG_LEVEL": "warning",
    }
    started: list[Server] = []
    try:
        for n in range(2):
            port = _free_port()
            log = tmp_path / f"serve-{n}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ledger", "serve", "--host", "127.0.0.1",
                     "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
            started.append(Server(f"http://127.0.0.1:{port}", proc, log))
        for server in started:
            _wait_live(server)
        yield started
    finally:
        for server in started:
            server.proc.terminate()
        for server in started:
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def sse(response: httpx.Response) -> AsyncIterator[dict[str, str]]:
    """Parse a text/event-stream: events as their fields, comments as ``{"comment": ...}``."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if fields:
                yield fields
                fields = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = f"{fields[name]}\n{value}" if name in fields else value


# --- event streams ----------------------------------------------------------------


async def test_reconnect_with_last_event_id_on_another_process_gets_every_event_once(servers: list[Server], tokens: dict[str, str], actors: Actors, test_class: str) -> None:
    a, b = servers
    d = Driver(actors, test_class)
    worker, op, reader = await d.k("worker"), await d.k("operator"), await d.reads()
    cid = await d.open()
    claim = await worker.claim_campaign("worker-1", [test_class])
    assert claim is not None and claim.campaign_id == cid
    gen = claim.generation
    await worker.append_events(cid, gen, [{"type": "attempt.started", "payload": {"n": 1}}])

    seen: list[dict[str, str]] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
        async with asyncio.timeout(30):
            # First connection, to A: read the open, claim and start, then more
            # output arrives; disconnect mid-attempt after one line of it.
            async with client.stream("GET", f"{a.url}/campaigns/{cid}/events",
                                     headers=bearer(tokens["reader"])) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                async for item in sse(r):
                    if "id" not in item:
                        continue
                    seen.append(item)
                    if len(seen) == 3:
                        await worker.append_events(cid, gen, [
                            {"type": "output", "delta": True, "payload": {"text": "1\n"}},
                            {"type": "output", "delta": True, "payload": {"text": "2\n"}}])
                    if len(seen) == 4:
                        break  # the client goes away mid-attempt
            assert [i["event"] for i in seen] == ["transition", "transition", "attempt.started",
                                                  "output"]
            # While nobody listens, the attempt goes on.
            await worker.append_events(cid, gen, [{"type": "output", "delta": True,
                                                   "payload": {"text": "3\n"}}])

            async def finish(resumed: asyncio.Event) -> None:
                await resumed.wait()
                await worker.fail_attempt(cid, gen, "still red", fingerprint=fingerprint(1))
                again = await worker.claim_campaign("worker-2", [test_class])
                assert again is not None and again.campaign_id == cid
                await worker.append_events(cid, again.generation,
                                           [{"type": "attempt.started", "payload": {"n": 2}}])
                await op.abandon(cid, "not needed", "operator-1")

            # Reconnect to B, as an EventSource would: the last id it saw.
            resumed: list[dict[str, str]] = []
            woke = asyncio.Event()
            driver = asyncio.create_task(finish(woke))
            headers = {**bearer(tokens["reader"]), "Last-Event-ID": seen[-1]["id"]}
            async with client.stream("GET", f"{b.url}/campaigns/{cid}/events?from=0",
                                     headers=headers) as r:
                assert r.status_code == 200
                async for item in sse(r):
                    if "id" in item:
                        resumed.append(item)
                        woke.set()
            await driver

    journal = await reader.events(cid)
    ids = [int(i["id"]) for i in seen + resumed]
    assert ids == [e.seq for e in journal], "every event exactly once, in order"
    assert int(resumed[0]["id"]) == int(seen[-1]["id"]) + 1
    last = json.loads(resumed[-1]["data"])
    assert resumed[-1]["event"] == "transition" and last["payload"]["to"] == "abandoned"
    assert last["seq"] == journal[-1].seq  # the stream ended on the terminal event
    for item, event in zip(seen + resumed, journal, strict=True):
        assert json.loads(item["data"]) == event.model_dump(mode="json", by_alias=True)


async def test_keepalives_resume_from_query_and_a_closed_stream(servers: list[Server], tokens: dict[str, str], actors: Actors, test_class: str) -> None:
    server = servers[0]
    d = Driver(actors, test_class)
    cid = await d.open()
    async with httpx.AsyncClient(base_url=server.url, headers=bearer(tokens["reader"]),
                                 timeout=httpx.Timeout(30.0)) as client:
        async with asyncio.timeout(30):
            items: list[dict[str, str]] = []
            async with client.stream("GET", f"/campaigns/{cid}/events") as r:
                async for item in sse(r):
                    items.append(item)
                    if sum("comment" in i for i in items) == 2:
                        break
            # The open transition, then (idle) keepalive comments naming the cursor.
            assert items[0]["id"] == "1"
            assert [i["comment"] for i in items[1:]] == ["keepalive seq=1"] * 2

            await (await d.k("operator")).abandon(cid, "done", "operator-1")
            # ?from= resumes after that seq; the stream ends at the terminal event.
            async with client.stream("GET", f"/campaigns/{cid}/events?from=1") as r:
                got = [i async for i in sse(r) if "id" in i]
            assert [i["id"] for i in got] == ["2"]
            assert json.loads(got[0]["data"])["payload"]["to"] == "abandoned"
            # Resuming at the end: 204 tells an EventSource to stop reconnecting.
            r = await client.get(f"/campaigns/{cid}/events", headers={"Last-Event-ID": "2"})
            assert r.status_code == 204 and r.content == b""
            r = await client.get("/campaigns/987654/events")
            assert r.status_code == 404
            assert r.headers["content-type"].startswith("application/problem+json")
            r = await client.get(f"/campaigns/{cid}/events", headers={"Authorization": "Bearer x"})
            assert r.status_code == 401


# --- fuzzing ----------------------------------------------------------------------------


def test_fuzzed_requests_never_get_a_500_and_refusals_are_problems(servers: list[Server], tokens: dict[str, str], admin: Admin) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.generation import GenerationMode

    server = servers[0]
    # A stream of an open campaign follows it until it closes: not for a fuzzer.
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json").exclude(
        path_regex=r"/events$")
    strategy = (schema.as_strategy(generation_mode=GenerationMode.POSITIVE)
                | schema.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    statuses: dict[int, int] = {}
    before = admin.execute("SELECT (SELECT count(*) FROM ledger.campaign) AS c, "
                           "(SELECT count(*) FROM ledger.campaign_event) AS e").fetchone()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case: Any) -> None:
        # A reader: every write is the database's to refuse, so nothing changes.
        response = case.call(base_url=server.url, headers=bearer(tokens["reader"]), timeout=10)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (case.method, case.formatted_path, response.text)
        if response.status_code >= 400:
            content_type = response.headers.get("content-type", [""])  # schemathesis: lists
            assert content_type[0].startswith("application/problem+json"), \
                (case.method, case.formatted_path, response.headers)
            body = response.json()
            assert body["status"] == response.status_code and body["type"].startswith("/problems/")

    started = time.monotonic()
    check()
    elapsed = time.monotonic() - started
    after = admin.execute("SELECT (SELECT count(*) FROM ledger.campaign) AS c, "
                          "(SELECT count(*) FROM ledger.campaign_event) AS e").fetchone()
    assert after == before
    # It did reach the routes (not only refusals at the door), and quickly.
    assert statuses.get(200, 0) > 0 and statuses.get(422, 0) > 0, statuses
    assert elapsed < 60, elapsed


# --- the CLI matches the API ------------------------------------------------------------


async def test_cli_acts_on_each_id_reports_json_and_fails_nonzero(db_url: str, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    first, second = await d.open(), await d.open()
    await (await d.k("operator")).abandon(first, "earlier")
    env = {"LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX}
    # The first is already closed: the second is still abandoned, the exit says it failed.
    out = ledger("abandon", str(first), str(second), "--json", env=env, check=False)
    assert out.returncode == 4, out.stderr
    results = json.loads(out.stdout)
    assert [(r["campaign_id"], r["outcome"]) for r in results] == \
        [(first, "illegal-transition"), (second, "abandoned")]
    assert out.stderr.startswith(f"ledger: campaign {first}:")
    assert (await (await d.reads("reader")).campaign(second)).state == "abandoned"
    # Options come from the environment too, and say so in --help.
    listed = ledger("list", "--json", env={**env, "LEDGER_LIST_STATE": "abandoned"})
    assert sorted(c["id"] for c in json.loads(listed.stdout)) == sorted([first, second])
    assert "LEDGER_LIST_STATE" in ledger("list", "--help", env={"COLUMNS": "200"}).stdout
    cid, _ = await d.leased()
    status = json.loads(ledger("status", "--json", env=env).stdout)
    assert [lease["campaign_id"] for lease in status["leases_expiring"]] == [cid]
