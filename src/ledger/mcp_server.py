"""``ledger mcp``: a Model Context Protocol server, so that agents and
assistants can ask Ledger about its campaigns (the official Python SDK, an
optional extra: ``pip install 'ledger[mcp]'``).

Read tools -- list and search campaigns, one campaign with its attempts,
verdicts, evidence and side effects, the tail of its journal, the autonomy
report, class status, the approvals that wait for a person -- the HTTP
API's two bulk actions, previewed first and confirmed on exactly the
previewed set (``ledger.bulk``, shared with the API and the dashboard), and
the approval decisions (approve, deny: an operator's token; never the
identity that made the attempt, docs/approval.md).

Who may do what is the database's call, as everywhere: the caller's token
(the API's ``LEDGER_API_TOKENS``; a reader's or an operator's) is checked on
every request, every read runs through ``Reads`` as the reader role, and a
bulk action's writes run through ``Kernel`` as the token's own role -- so a
reader's token that confirms a bulk action is refused by PostgreSQL, not by
this module. On stdio the token is the server's (``LEDGER_MCP_TOKEN``: one
agent host, one identity); over streamable HTTP each request carries its own
``Authorization: Bearer`` and a request without a valid one is answered 401
before MCP sees it. The HTTP transport is stateless (each POST stands alone),
so any number of ``ledger mcp`` processes on any machines can serve behind a
load balancer, like ``ledger serve``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import jsonschema
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import Tool, ToolAnnotations
from pydantic import BaseModel, Field

from ledger import bulk
from ledger.api.auth import Principal, TokenTable
from ledger.api.campaigns import NO_NUL, BulkResult, CampaignFilter, CampaignPage, encode_cursor
from ledger.api.limits import Limits
from ledger.api.roles import RolePools
from ledger.db.cursors import BIGINT_MAX, decode_cursor
from ledger.db.database import Database
from ledger.db.kernel import Kernel
from ledger.db.models import (
    ApprovalDecision,
    CampaignDetail,
    ClassSummary,
    Event,
    State,
    WaitingApproval,
)
from ledger.db.reads import Reads
from ledger.errors import ConfigError, InvalidInput, LedgerError
from ledger.report import autonomy_report
from ledger.settings import get_settings

#: The roles whose tokens the MCP server accepts.
ROLES = ("reader", "operator")
INSTRUCTIONS = (
    "Ledger keeps unfinished objectives (campaigns) that workers claim and attempt, an "
    "independent verifier judges and a sensor confirms. Use the read tools to look; the bulk "
    "tools (abandon_campaigns, reopen_campaigns) need an operator's token: call them once "
    "without campaign_ids/selection to preview, show the preview to a person, then call again "
    "with exactly the previewed campaign_ids and selection to act. list_approvals shows the "
    "candidates that wait for a person; approve_campaign and deny_campaign decide one (an "
    "operator's token): show the person the diff and the verdicts (show_campaign) first."
)

#: How the tools that only read, and those that change something, are announced.
READING = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
ACTING = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False,
                         openWorldHint=False)

CampaignId = Annotated[int, Field(ge=1, le=BIGINT_MAX, description="A campaign id")]
Text = Annotated[str, Field(min_length=1, max_length=500, pattern=NO_NUL)]


class JournalTail(BaseModel):
    """Journal events of one campaign, oldest first."""

    campaign_id: int
    events: list[Event]
    next_after: int | None = Field(description="Pass as `after` for what follows (null: none yet)")


class ReportDay(BaseModel):
    """One UTC day of the autonomy report."""

    day: str
    opened: int
    attempts: int
    rejections: int
    verified: int
    confirmed: int
    human_actions: int
    verdict: str


class AutonomyReport(BaseModel):
    """Per day what Ledger did on its own and what a person had to do."""

    streak: int = Field(description="Consecutive days closed without human help")
    days: list[ReportDay]


class WaitingApprovals(BaseModel):
    """Candidates that wait for a person, oldest first."""

    items: list[WaitingApproval]


class ClassStatus(BaseModel):
    """Every registered class at a glance (or the one asked for)."""

    classes: list[ClassSummary]


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every object that does not say otherwise closed
    (``additionalProperties: false``): an argument the tool does not take is
    refused, never silently ignored."""
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    for value in schema.values():
        for child in (value.values() if isinstance(value, dict) else
                      value if isinstance(value, list) else ()):
            if isinstance(child, dict):
                closed(child)
    if isinstance(schema.get("items"), dict):
        closed(schema["items"])
    return schema


class CheckedServer(MCPServer[Any]):
    """The SDK's server, with each tool's arguments validated against the
    input schema it publishes (JSON Schema, as a client reads it) before the
    tool runs: ``true`` or ``"1"`` is no campaign id, and an unknown argument
    is an error naming it -- not coerced, not ignored."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._validators: dict[str, jsonschema.protocols.Validator] = {}

    async def list_tools(self) -> list[Tool]:
        tools = await super().list_tools()
        for tool in tools:
            closed(tool.input_schema)
        return tools

    async def _validator(self, name: str) -> jsonschema.protocols.Validator | None:
        if not self._validators:
            for tool in await self.list_tools():
                cls = jsonschema.validators.validator_for(tool.input_schema)
                self._validators[tool.name] = cls(tool.input_schema)
        return self._validators.get(name)

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> Any:
        validator = await self._validator(name)
        if validator is not None:
            error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
            if error is not None:
                where = ".".join(str(p) for p in error.absolute_path) or "arguments"
                raise ToolError(f"invalid-input: {name}: {where}: {error.message}")
        return await super().call_tool(name, arguments, context)


def _failure(exc: LedgerError) -> Exception:
    """A Ledger refusal as the tool error the agent reads (slug: message)."""
    return ToolError(f"{exc.slug}: {exc.message}")


def authenticate(tokens: TokenTable, token: str | None) -> Principal:
    """The principal of ``token``; ``InvalidInput`` naming what is wrong."""
    if not token:
        raise InvalidInput("a token is required (a reader's or an operator's, from `ledger token create`)")
    principal = tokens.authenticate(token)
    if principal is None:
        raise InvalidInput("the token is not valid (not in LEDGER_API_TOKENS)")
    if principal.role not in ROLES:
        raise InvalidInput(f"the MCP server serves reader and operator tokens, not a {principal.role}'s")
    return principal


class LedgerMCP:
    """The MCP server over one database: its tools, and both transports."""

    def __init__(self, database: Database, tokens: TokenTable, *, stdio_token: str | None = None,
                 pool_size: int = 5):
        if not len(tokens):
            raise ConfigError("LEDGER_API_TOKENS names no token: the MCP server would refuse everyone")
        self.tokens = tokens
        # stdio: one identity for the process, checked before anything starts
        self.stdio_principal = authenticate(tokens, stdio_token) if stdio_token is not None else None
        self.pools = RolePools(database, max_size=pool_size)
        self._key: bytes | None = None
        self.server: MCPServer[Any] = CheckedServer("ledger", instructions=INSTRUCTIONS,
                                                    version=_version())
        self._register()

    # -- who is asking ---------------------------------------------------------

    def principal(self, ctx: Context) -> Principal:
        """The caller: stdio's token, or this HTTP request's bearer token."""
        if self.stdio_principal is not None:
            return self.stdio_principal
        headers = ctx.headers or {}
        scheme, _, token = str(headers.get("authorization", "")).partition(" ")
        try:
            return authenticate(self.tokens, token.strip() if scheme.lower() == "bearer" else None)
        except LedgerError as exc:
            raise _failure(exc) from None

    async def _bulk_key(self) -> bytes:
        """The key of selection tokens, as the HTTP API keys them: the
        configured session secret, else the database's own secret."""
        if self._key is None:
            secret = get_settings().session_secret
            if secret:
                self._key = secret.encode()
            else:
                operator = Kernel(await self.pools.session("operator"))
                self._key = (await operator.server_secret("bulk_selection")).encode()
        return self._key

    async def reads(self) -> Reads:
        """Reads as the reader role, whoever asks."""
        return Reads(await self.pools.session("reader"))

    async def _read(self, call: Callable[[Reads], Awaitable[Any]]) -> Any:
        try:
            return await call(await self.reads())
        except LedgerError as exc:
            raise _failure(exc) from None

    # -- the tools -------------------------------------------------------------

    def _register(self) -> None:
        self._register_reads()
        self._register_status()
        self._register_approvals()
        self._register_bulk()

    def _register_reads(self) -> None:
        """The read tools of campaigns: a page of them, a search, one with
        everything about it, its journal."""
        tool = self.server.tool

        @tool(annotations=READING)
        async def list_campaigns(
                ctx: Context, state: list[State] | None = None,
                classes: list[Text] | None = None, target: Text | None = None, label: Text | None = None,
                search: Annotated[str, Field(max_length=200, pattern=NO_NUL)] | None = None,
                limit: Annotated[int, Field(ge=1, le=200)] = 50,
                cursor: Annotated[str, Field(max_length=200)] | None = None) -> CampaignPage:
            """Campaigns, most recently changed first, a page at a time; every filter narrows
            (state, class, target, label, and `search`: a substring of the objective key).
            Pass `next_cursor` back as `cursor` for the next page."""
            self.principal(ctx)

            async def go(reads: Reads) -> CampaignPage:
                position = decode_cursor(cursor) if cursor else None
                rows = await reads.campaigns(states=state, classes=classes, target=target, label=label,
                                             search=search, cursor=position, limit=limit + 1)
                page = rows[:limit]
                return CampaignPage(items=page,
                                    next_cursor=encode_cursor(page[-1]) if len(rows) > limit else None)
            result: CampaignPage = await self._read(go)
            return result

        @tool(annotations=READING)
        async def search_campaigns(ctx: Context, text: Annotated[str, Field(min_length=1, max_length=200,
                                                                          pattern=NO_NUL)],
                                   state: list[State] | None = None,
                                   limit: Annotated[int, Field(ge=1, le=200)] = 20) -> CampaignPage:
            """Campaigns whose objective key contains `text` (optionally in these states),
            most recently changed first."""
            result: CampaignPage = await list_campaigns(ctx, state=state, search=text, limit=limit)
            return result

        @tool(annotations=READING)
        async def show_campaign(ctx: Context, campaign_id: CampaignId) -> CampaignDetail:
            """One campaign with its attempts, verifications (verdicts, reasons, evidence),
            side effects and observations."""
            self.principal(ctx)
            result: CampaignDetail = await self._read(lambda reads: reads.campaign_detail(campaign_id))
            return result

        @tool(annotations=READING)
        async def tail_journal(ctx: Context, campaign_id: CampaignId,
                               after: Annotated[int, Field(ge=0, le=BIGINT_MAX)] | None = None,
                               limit: Annotated[int, Field(ge=1, le=1000)] = 50) -> JournalTail:
            """A campaign's journal: without `after` its last `limit` events; with `after`
            the events after that seq (to follow it, pass `next_after` back)."""
            self.principal(ctx)

            async def go(reads: Reads) -> JournalTail:
                await reads.campaign(campaign_id)  # NotFound for an unknown id, not an empty tail
                events = (await reads.recent_events(campaign_id, limit) if after is None
                          else await reads.events(campaign_id, after, limit))
                last = events[-1].seq if events else after
                return JournalTail(campaign_id=campaign_id, events=events, next_after=last)
            result: JournalTail = await self._read(go)
            return result

    def _register_status(self) -> None:
        """The read tools that look across campaigns: the report, the classes,
        the approvals that wait."""
        tool = self.server.tool

        @tool(annotations=READING)
        async def report(ctx: Context, days: Annotated[int, Field(ge=1, le=366)] = 7) -> AutonomyReport:
            """The autonomy report: per UTC day opened, attempts, rejections, closures and
            human actions, and the streak of days closed with no human help."""
            self.principal(ctx)

            async def go(reads: Reads) -> AutonomyReport:
                made = (await autonomy_report(reads, days)).as_json()
                return AutonomyReport.model_validate(json.loads(json.dumps(made, default=str)))
            result: AutonomyReport = await self._read(go)
            return result

        @tool(annotations=READING)
        async def class_status(ctx: Context, name: Annotated[str, Field(min_length=1, max_length=200,
                                                                        pattern=NO_NUL)] | None = None,
                               days: Annotated[int, Field(ge=1, le=366)] = 7) -> ClassStatus:
            """Each class (or the one named): campaigns per state, open-to-confirm
            percentiles over the last `days`, and its oldest ready campaign's age."""
            self.principal(ctx)

            async def go(reads: Reads) -> ClassStatus:
                names = [name] if name else [c.name for c in await reads.classes()]
                return ClassStatus(classes=[await reads.class_summary(n, days) for n in names])
            result: ClassStatus = await self._read(go)
            return result

        @tool(annotations=READING)
        async def list_approvals(ctx: Context, class_name: Annotated[str, Field(
                                     min_length=1, max_length=200, pattern=NO_NUL)] | None = None,
                                 limit: Annotated[int, Field(ge=1, le=1000)] = 100) -> WaitingApprovals:
            """Verified candidates that wait for a person before they are promoted (oldest
            first): which conditions of the class asked, and when its timeout decides."""
            self.principal(ctx)
            result: WaitingApprovals = await self._read(
                lambda reads: self._waiting(reads, class_name, limit))
            return result

        @tool(annotations=READING)
        async def show_limits(ctx: Context) -> Limits:
            """Limits and budgets (docs/limits.md): each key's leases and verifications
            against its caps and today's spend, each rate bucket's rates and how long a
            claim would wait on it, usage per class, the latest changes and who made them."""
            self.principal(ctx)

            async def go(reads: Reads) -> Limits:
                return Limits(keys=await reads.limit_keys(), buckets=await reads.limit_buckets(),
                              usage=await reads.usage_by_class(), events=await reads.limit_events(50))
            result: Limits = await self._read(go)
            return result

    def _register_approvals(self) -> None:
        """The approval decisions (an operator's token)."""
        tool = self.server.tool

        @tool(annotations=ACTING)
        async def approve_campaign(
                ctx: Context, campaign_id: CampaignId,
                reason: Annotated[str, Field(min_length=1, max_length=4000, pattern=NO_NUL)] | None = None
        ) -> ApprovalDecision:
            """Approve a candidate that awaits approval (an operator's token): its promotion is
            queued. Journaled with this token's name and the reason."""
            principal = self.principal(ctx)
            return await self._decide(principal, lambda kernel: kernel.approve(
                campaign_id, _identity(principal), reason))

        @tool(annotations=ACTING)
        async def deny_campaign(
                ctx: Context, campaign_id: CampaignId,
                reason: Annotated[str, Field(min_length=1, max_length=4000, pattern=NO_NUL)],
                abandon: bool = False) -> ApprovalDecision:
            """Deny a candidate that awaits approval (an operator's token): back to ready, the
            reason told to the next attempt as a rejection -- or, with abandon, abandoned."""
            principal = self.principal(ctx)
            return await self._decide(principal, lambda kernel: kernel.deny(
                campaign_id, _identity(principal), reason, abandon=abandon))

    def _register_bulk(self) -> None:
        """The HTTP API's bulk actions: previewed first, confirmed on exactly
        the previewed set (an operator's token)."""
        tool = self.server.tool

        @tool(annotations=ACTING)
        async def abandon_campaigns(
                ctx: Context, filter: CampaignFilter,
                reason: Annotated[str, Field(min_length=1, max_length=1000, pattern=NO_NUL)] =
                "abandoned by operator",
                campaign_ids: list[CampaignId] | None = None,
                selection: Annotated[str, Field(max_length=100, pattern=bulk.TOKEN_PATTERN)] | None = None,
                max_campaigns: Annotated[int, Field(ge=1, le=bulk.MAX_CAP)] = bulk.DEFAULT_CAP) -> BulkResult:
            """Abandon the open campaigns a filter matches (an operator's token). Without
            `selection` this only previews: it answers the matching `campaign_ids` and a
            `selection` token, and abandons nothing. Call again with both to abandon those of
            them that still match; campaigns matching by then but not previewed are left alone
            (`not_previewed`)."""
            principal = self.principal(ctx)
            return await self._bulk(principal, "abandon", filter, campaign_ids, selection, max_campaigns,
                                    lambda kernel, cid: kernel.abandon(cid, reason, _identity(principal)))

        @tool(annotations=ACTING)
        async def reopen_campaigns(
                ctx: Context, filter: CampaignFilter,
                extra_attempts: Annotated[int, Field(ge=1, le=1000)] | None = None,
                campaign_ids: list[CampaignId] | None = None,
                selection: Annotated[str, Field(max_length=100, pattern=bulk.TOKEN_PATTERN)] | None = None,
                max_campaigns: Annotated[int, Field(ge=1, le=bulk.MAX_CAP)] = bulk.DEFAULT_CAP) -> BulkResult:
            """Reopen the exhausted campaigns a filter matches with more attempts (an
            operator's token): preview first, then confirm, as for abandon_campaigns."""
            principal = self.principal(ctx)
            return await self._bulk(principal, "reopen", filter, campaign_ids, selection, max_campaigns,
                                    lambda kernel, cid: kernel.reopen(cid, _identity(principal),
                                                                      extra_attempts))

    async def _waiting(self, reads: Reads, class_name: str | None, limit: int) -> WaitingApprovals:
        return WaitingApprovals(items=await reads.approvals_waiting(class_name, limit))

    async def _decide(self, principal: Principal,
                      act: Callable[[Kernel], Awaitable[ApprovalDecision]]) -> ApprovalDecision:
        """A decision as the token's own role: the database refuses a reader's."""
        try:
            return await act(Kernel(await self.pools.session(principal.role)))
        except LedgerError as exc:
            raise _failure(exc) from None

    async def _bulk(self, principal: Principal, action: Literal["abandon", "reopen"], filter: CampaignFilter,
                    campaign_ids: list[int] | None, selection: str | None, cap: int,
                    act: Callable[[Kernel, int], Awaitable[object]]) -> BulkResult:
        """The API's bulk rule (``ledger.bulk``): preview without a selection, else
        act on the previewed ids that still match -- the writes as the token's role."""
        try:
            reads = await self.reads()
            selector = filter.selector()
            key = await self._bulk_key()
            caller = _identity(principal)
            if selection is None:
                preview = await bulk.select(reads, action, selector, cap, key=key, caller=caller)
                return BulkResult(dry_run=True, matched=len(preview.ids), truncated=preview.truncated,
                                  outcomes={}, campaign_ids=list(preview.ids), selection=preview.token)
            if not campaign_ids:
                raise InvalidInput("a bulk action acts only on what was previewed: call it without "
                                   "selection first, then send back its campaign_ids and selection")
            kernel = Kernel(await self.pools.session(principal.role))
            planned = await bulk.plan(reads, action, selector, campaign_ids, selection, key=key,
                                      caller=caller, cap=cap)
            # single use, as in the HTTP API: the job row takes the token's digest
            job_id = "job-" + secrets.token_hex(16)
            await kernel.start_bulk_job(job_id, bulk.token_digest(selection), caller, action,
                                        planned.acting, {"not_previewed": planned.not_previewed,
                                                         "no_longer_matching": planned.no_longer_matching,
                                                         "truncated": planned.truncated})

            async def record(cid: int, outcome: str) -> None:
                await kernel.record_bulk_item(job_id, cid, outcome)
            try:
                done = await bulk.act_on(planned, lambda cid: act(kernel, cid), record)
            except BaseException:
                await asyncio.shield(kernel.finish_bulk_job(job_id, "failed"))
                raise
            await kernel.finish_bulk_job(job_id, "done")
        except LedgerError as exc:
            raise _failure(exc) from None
        return BulkResult(dry_run=False, matched=len(done.acted_on) + len(done.not_previewed),
                          truncated=done.truncated, outcomes=done.outcomes, campaign_ids=done.acted_on,
                          selection=None, not_previewed=done.not_previewed,
                          no_longer_matching=done.no_longer_matching)

    # -- transports ------------------------------------------------------------

    async def serve_stdio(self) -> None:
        """Serve one agent host on stdin/stdout until it closes them."""
        try:
            await self.server.run_stdio_async()
        finally:
            await self.pools.close()

    def http_app(self, host: str = "127.0.0.1") -> Any:
        """The streamable HTTP app (``/mcp``), behind the bearer-token check."""
        app = self.server.streamable_http_app(stateless_http=True, json_response=True, host=host)
        return BearerGate(app, self.tokens)

    async def serve_http(self, host: str, port: int) -> None:
        """Serve streamable HTTP on ``host:port`` until stopped (SIGTERM, SIGINT)."""
        import uvicorn

        config = uvicorn.Config(self.http_app(host), host=host, port=port, log_config=None, access_log=False,
                                server_header=False, timeout_graceful_shutdown=5, lifespan="on")
        try:
            await uvicorn.Server(config).serve()
        finally:
            await self.pools.close()


class BearerGate:
    """ASGI middleware: an HTTP request without a valid reader's or operator's
    bearer token is answered 401 (problem+json) before the MCP app sees it."""

    def __init__(self, app: Any, tokens: TokenTable):
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            scheme, _, token = headers.get("authorization", "").partition(" ")
            try:
                authenticate(self.tokens, token.strip() if scheme.lower() == "bearer" else None)
            except LedgerError as exc:
                body = json.dumps({"type": "about:blank", "title": "Unauthorized", "status": 401,
                                   "detail": exc.message}).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/problem+json"),
                                        (b"www-authenticate", b'Bearer realm="ledger"'),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _identity(principal: Principal) -> str:
    """How an MCP caller is recorded in the journal."""
    return f"mcp:{principal.name}"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ledger")
    except PackageNotFoundError:
        return "0"
