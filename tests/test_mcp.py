"""``ledger mcp`` as agents use it: real server processes (streamable HTTP on a
free port, and stdio launched by the client), driven by the official MCP
SDK's own client, against the test's database.

A reader's token reads (list, search, one campaign with its attempts, verdict
and evidence, the journal's tail, the report, class status); an operator's
previews a bulk action, then acts on exactly the previewed set, and decides
approvals (a reader's is refused, by the database). A reader's
token that confirms a bulk action is refused by PostgreSQL (the reader role
may not execute ``ledger_api.start_bulk_job``), and nothing changes; an HTTP request
without a valid token is answered 401 before MCP sees it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import TEST_PREFIX, Actors, Admin, stop_process
from drive import Driver, sha
from ledger.api import hash_token, new_token
from test_api_live import _free_port

mcp = pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'ledger[mcp]')")

pytestmark = pytest.mark.anyio

READ_TOOLS = {"list_campaigns", "search_campaigns", "show_campaign", "tail_journal", "report", "class_status"}
BULK_TOOLS = {"abandon_campaigns", "reopen_campaigns"}


@dataclass
class Tokens:
    reader: str
    operator: str
    sensor: str

    def entries(self) -> str:
        return ",".join(f"{role}-tok:{role}:{hash_token(getattr(self, role))}"
                        for role in ("reader", "operator", "sensor"))


@pytest.fixture
def tokens() -> Tokens:
    return Tokens(new_token(), new_token(), new_token())


def server_env(db_url: str, tokens: Tokens, **extra: str) -> dict[str, str]:
    return {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
            "LEDGER_API_TOKENS": tokens.entries(), "LEDGER_LOG_LEVEL": "warning", "NO_COLOR": "1", **extra}


@pytest.fixture
def http_server(db_url: str, tokens: Tokens, tmp_path: Path) -> Iterator[str]:
    """``ledger mcp --transport http`` on a free port; its /mcp URL."""
    port = _free_port()
    log = tmp_path / "mcp.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "mcp", "--transport", "http", "--host",
                                 "127.0.0.1", "--port", str(port)], env=server_env(db_url, tokens),
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:  # until it answers (a request without a token: 401)
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.post(url, timeout=1.0).status_code == 401:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)  # polling the condition above
        yield url
    finally:
        stop_process(proc)
        assert proc.returncode == 0, log.read_text()[-2000:]


@asynccontextmanager
async def over_http(url: str, token: str) -> AsyncIterator[Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


@asynccontextmanager
async def over_stdio(db_url: str, tokens: Tokens, token: str) -> AsyncIterator[Any]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "ledger", "mcp"],
                                   env=server_env(db_url, tokens, LEDGER_MCP_TOKEN=token))
    async with Client(params) as client:
        yield client


async def call(client: Any, tool: str, **arguments: Any) -> Any:
    """The tool's structured result; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def refused(client: Any, tool: str, **arguments: Any) -> str:
    """The text of a tool error (fails the test if the call succeeded)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return " ".join(getattr(c, "text", "") for c in result.content)


async def verified_campaign(actors: Actors, test_class: str) -> int:
    """A campaign taken through one attempt and an accepting verdict with evidence."""
    d = Driver(actors, test_class)
    cid, vid = await d.verifying()
    await (await d.k("verifier")).accept(vid, {"junit": "12 passed"})
    return cid


async def test_a_readers_token_reads_everything_over_http(http_server: str, tokens: Tokens, actors: Actors,
                                                          test_class: str) -> None:
    cid = await verified_campaign(actors, test_class)
    sensor = await actors("sensor")
    others = [(await sensor.open_campaign(test_class, f"needle-{i}", "repo")).campaign_id for i in range(3)]
    async with over_http(http_server, tokens.reader) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert READ_TOOLS | BULK_TOOLS <= listed

        page = await call(client, "list_campaigns", limit=2)
        assert [c["id"] for c in page["items"]] == [others[2], others[1]] and page["next_cursor"]
        rest = await call(client, "list_campaigns", limit=10, cursor=page["next_cursor"])
        assert [c["id"] for c in rest["items"]] == [others[0], cid] and rest["next_cursor"] is None
        found = await call(client, "search_campaigns", text="needle-1")
        assert [c["id"] for c in found["items"]] == [others[1]]
        ready = await call(client, "list_campaigns", state=["verified"])
        assert [c["id"] for c in ready["items"]] == [cid]

        detail = await call(client, "show_campaign", campaign_id=cid)
        assert detail["campaign"]["state"] == "verified"
        assert [a["candidate_sha"] for a in detail["attempts"]] == [sha(101)]
        [verdict] = detail["verifications"]
        assert (verdict["status"], verdict["evidence"]) == ("accepted", {"junit": "12 passed"})

        tail = await call(client, "tail_journal", campaign_id=cid, limit=2)
        seqs = [e["seq"] for e in tail["events"]]
        assert len(seqs) == 2 and seqs == sorted(seqs) and tail["next_after"] == seqs[-1]
        whole = await call(client, "tail_journal", campaign_id=cid, after=0, limit=1000)
        assert [e["seq"] for e in whole["events"]] == list(range(1, seqs[-1] + 1))
        assert "accept" in [e["payload"].get("transition") for e in whole["events"]]
        assert "not-found" in await refused(client, "tail_journal", campaign_id=10**9)

        report = await call(client, "report", days=2)
        assert len(report["days"]) == 2 and report["days"][-1]["opened"] == 4
        status = await call(client, "class_status", name=test_class)
        [summary] = status["classes"]
        assert summary["name"] == test_class and summary["states"]["ready"] == 3
        assert summary["states"]["verified"] == 1

        # range checks arrive as tool errors, nothing reaches the database
        assert await refused(client, "list_campaigns", limit=0)


async def test_the_bulk_boundary_is_the_databases(http_server: str, tokens: Tokens, actors: Actors,
                                                  test_class: str, admin: Admin) -> None:
    sensor = await actors("sensor")
    await (await actors("operator")).register_class("tidy", lease_seconds=30)
    ids = [(await sensor.open_campaign("tidy", f"bulk-{i}", "repo")).campaign_id for i in range(3)]
    keep = (await sensor.open_campaign(test_class, "other-1", "repo")).campaign_id
    chosen = {"class": ["tidy"], "state": ["ready"]}
    async with over_http(http_server, tokens.reader) as reader:
        # a reader may preview (a read) but not act: PostgreSQL refuses the reader role
        preview = await call(reader, "abandon_campaigns", filter=chosen)
        assert preview["dry_run"] and sorted(preview["campaign_ids"]) == sorted(ids)
        said = await refused(reader, "abandon_campaigns", filter=chosen, campaign_ids=preview["campaign_ids"],
                             selection=preview["selection"])
        # refused by PostgreSQL itself: the reader role may not start a bulk job (or abandon)
    # the function docs/mcp.md names: the bulk job is recorded before anything is acted on
    assert "forbidden: permission denied for function start_bulk_job" in said, said
    states = {r["id"]: r["state"] for r in admin.execute("SELECT id, state FROM ledger.campaign")}
    assert {states[i] for i in ids} == {"ready"}

    async with over_http(http_server, tokens.operator) as operator:
        preview = await call(operator, "abandon_campaigns", filter=chosen, reason="agent tidy-up")
        assert preview["dry_run"] and preview["outcomes"] == {}
        assert {r["state"] for r in admin.execute(  # a preview acts on nothing
            "SELECT state FROM ledger.campaign WHERE id = ANY(%s)", (ids,))} == {"ready"}
        # one more matches after the preview: it is reported, never acted on
        late = (await sensor.open_campaign("tidy", "bulk-late", "repo")).campaign_id
        # a tampered set is refused: the selection is the preview's own
        assert "invalid-input" in await refused(operator, "abandon_campaigns", filter=chosen,
                                                campaign_ids=[*preview["campaign_ids"], keep],
                                                selection=preview["selection"])
        done = await call(operator, "abandon_campaigns", filter=chosen, reason="agent tidy-up",
                          campaign_ids=preview["campaign_ids"], selection=preview["selection"])
        assert not done["dry_run"] and sorted(done["campaign_ids"]) == sorted(ids)
        assert done["outcomes"] == {"abandoned": 3} and done["not_previewed"] == [late]
        # acting needs a preview
        assert "invalid-input" in await refused(operator, "abandon_campaigns", filter=chosen,
                                                selection=preview["selection"])
    states = {r["id"]: r["state"] for r in admin.execute("SELECT id, state FROM ledger.campaign")}
    assert {states[i] for i in ids} == {"abandoned"} and states[late] == "ready" and states[keep] == "ready"
    actors_seen = {r["actor"] for r in admin.execute(
        "SELECT DISTINCT actor FROM ledger.campaign_event WHERE campaign_id = ANY(%s) "
        "AND payload->>'transition' = 'abandon'", (ids,)).fetchall()}
    assert actors_seen == {"mcp:operator-tok"}


async def test_http_refuses_requests_without_a_valid_token(http_server: str, tokens: Tokens) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for headers in ({}, {"Authorization": "Bearer ldg_not-a-token"}, {"Authorization": f"Basic {tokens.reader}"},
                    {"Authorization": f"Bearer {tokens.sensor}"}):
        r = httpx.post(http_server, json=body, headers=headers)
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json", r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert "sensor" in httpx.post(http_server, json=body,
                                  headers={"Authorization": f"Bearer {tokens.sensor}"}).json()["detail"]


async def test_stdio_serves_with_the_processs_token(db_url: str, tokens: Tokens, actors: Actors,
                                                    test_class: str, admin: Admin) -> None:
    sensor = await actors("sensor")
    cid = (await sensor.open_campaign(test_class, "over-stdio", "repo")).campaign_id
    async with over_stdio(db_url, tokens, tokens.reader) as client:
        found = await call(client, "search_campaigns", text="over-stdio")
        assert [c["id"] for c in found["items"]] == [cid]
        preview = await call(client, "abandon_campaigns", filter={"objective_key": "over-stdio"})
        said = await refused(client, "abandon_campaigns", filter={"objective_key": "over-stdio"},
                             campaign_ids=preview["campaign_ids"], selection=preview["selection"])
        assert "permission denied" in said
    async with over_stdio(db_url, tokens, tokens.operator) as client:
        preview = await call(client, "abandon_campaigns", filter={"objective_key": "over-stdio"})
        done = await call(client, "abandon_campaigns", filter={"objective_key": "over-stdio"},
                          campaign_ids=preview["campaign_ids"], selection=preview["selection"])
        assert done["outcomes"] == {"abandoned": 1}
    assert admin.execute("SELECT state FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()["state"] == "abandoned"


def test_stdio_without_a_valid_token_is_one_line_and_a_config_exit(db_url: str, tokens: Tokens) -> None:
    for token in ("", "ldg_not-a-token"):
        env = server_env(db_url, tokens, LEDGER_MCP_TOKEN=token)
        done = subprocess.run([sys.executable, "-m", "ledger", "mcp"], env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode != 0 and done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "LEDGER_MCP_TOKEN" in done.stderr or "not valid" in done.stderr


async def test_approvals_are_decided_by_an_operator_s_token_only(http_server: str, tokens: Tokens,
                                                                 actors: Actors, admin: Admin) -> None:
    op = await actors("operator")
    await op.register_class("guarded", lease_seconds=30, backoff_base_s=0,
                            promotion={"ref": "refs/heads/main", "repository": "/nowhere"},
                            approval={"mode": "always"})
    first, second = [await verified_campaign(actors, "guarded") for _ in range(2)]

    def state(cid: int) -> str:
        return str(admin.execute("SELECT state FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()["state"])

    async with over_http(http_server, tokens.reader) as client:
        assert {"list_approvals", "approve_campaign", "deny_campaign"} <= {t.name for t in (await client.list_tools()).tools}
        waiting = await call(client, "list_approvals")
        assert [a["campaign_id"] for a in waiting["items"]] == [first, second]
        assert waiting["items"][0]["reasons"][0]["condition"] == "always"
        # a reader's token asks; PostgreSQL refuses (the reader role may not execute approve)
        assert "forbidden" in await refused(client, "approve_campaign", campaign_id=first)
        assert "forbidden" in await refused(client, "deny_campaign", campaign_id=second, reason="no")
    assert (state(first), state(second)) == ("awaiting_approval", "awaiting_approval")

    async with over_http(http_server, tokens.operator) as client:
        approved = await call(client, "approve_campaign", campaign_id=first, reason="read it")
        assert (approved["decision"], approved["state"]) == ("approved", "verified")
        assert approved["side_effect_id"]
        denied = await call(client, "deny_campaign", campaign_id=second, reason="wrong fix")
        assert (denied["decision"], denied["state"]) == ("denied", "ready")
        assert "illegal-transition" in await refused(client, "approve_campaign", campaign_id=second)
        assert (await call(client, "list_approvals"))["items"] == []
    row = admin.execute("SELECT decided_by, decision_reason FROM ledger.approval WHERE campaign_id = %s",
                        (first,)).fetchone()
    assert (row["decided_by"], row["decision_reason"]) == ("mcp:operator-tok", "read it")


def rpc(url: str, token: str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One raw JSON-RPC request to the stateless HTTP transport; its response."""
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}},
                   headers={"Authorization": f"Bearer {token}",
                            "Accept": "application/json, text/event-stream",
                            "MCP-Protocol-Version": "2025-06-18"}, timeout=30)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def tool_error(answer: dict[str, Any]) -> str:
    """The text of a tool error answer (fails if the call succeeded)."""
    assert "result" in answer and answer["result"]["isError"] is True, answer
    return " ".join(c.get("text", "") for c in answer["result"]["content"])


async def test_arguments_are_held_to_the_published_schemas(http_server: str, tokens: Tokens,
                                                           actors: Actors, test_class: str) -> None:
    """Over raw JSON-RPC: a campaign id given as ``true`` or ``"1"`` is refused
    (they used to read campaign 1), and so is an argument the tool does not
    take (it used to be ignored); each error names the argument. The schema
    ``tools/list`` publishes says so (no additional properties)."""
    cid = (await (await actors("sensor")).open_campaign(test_class, "schema-1", "repo")).campaign_id
    listed = {t["name"]: t for t in rpc(http_server, tokens.reader, "tools/list")["result"]["tools"]}
    schema = listed["show_campaign"]["inputSchema"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["campaign_id"]["type"] == "integer"
    assert listed["abandon_campaigns"]["inputSchema"]["additionalProperties"] is False

    def show(**arguments: Any) -> dict[str, Any]:
        return rpc(http_server, tokens.reader, "tools/call",
                   {"name": "show_campaign", "arguments": arguments})

    shown = show(campaign_id=cid)["result"]
    assert shown["isError"] is False and shown["structuredContent"]["campaign"]["id"] == cid
    for wrong in (True, str(cid), 1.5, None):
        said = tool_error(show(campaign_id=wrong))
        assert "invalid-input: show_campaign: campaign_id:" in said and "integer" in said, said
    said = tool_error(show(campaign_id=cid, verbose=True))
    assert "invalid-input: show_campaign" in said and "'verbose' was unexpected" in said, said
    said = tool_error(rpc(http_server, tokens.reader, "tools/call",
                          {"name": "list_campaigns", "arguments": {"limit": "5"}}))
    assert "limit" in said and "integer" in said, said
    # nested objects too: a bulk filter with a key it does not have
    said = tool_error(rpc(http_server, tokens.reader, "tools/call", {
        "name": "abandon_campaigns", "arguments": {"filter": {"class": [test_class], "colour": "red"}}}))
    assert "'colour' was unexpected" in said, said


async def test_search_is_a_literal_substring(http_server: str, tokens: Tokens, actors: Actors,
                                             test_class: str) -> None:
    """``%`` and ``_`` match themselves, not anything: a search for ``%``
    finds the one objective with a ``%`` in it, not every campaign."""
    sensor = await actors("sensor")
    ids = {key: (await sensor.open_campaign(test_class, key, "repo")).campaign_id
           for key in ("cpu-at-100%", "disk_full", "diskXfull", "plain", "back\\slash")}

    def found(tool: str, **arguments: Any) -> set[int]:
        answer = rpc(http_server, tokens.reader, "tools/call", {"name": tool, "arguments": arguments})
        assert answer["result"]["isError"] is False, answer
        return {c["id"] for c in answer["result"]["structuredContent"]["items"]}

    assert found("search_campaigns", text="%") == {ids["cpu-at-100%"]}
    assert found("search_campaigns", text="k_f") == {ids["disk_full"]}
    assert found("list_campaigns", search="_") == {ids["disk_full"]}
    assert found("search_campaigns", text="\\") == {ids["back\\slash"]}
    assert found("search_campaigns", text="disk") == {ids["disk_full"], ids["diskXfull"]}
