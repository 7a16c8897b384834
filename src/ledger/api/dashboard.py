"""The operator's dashboard: server-rendered pages under ``/ui`` of ``ledger serve``.

Pages: the **board** (campaigns by state, oldest ready, leases near expiry,
sensors and their next tick, filters kept in the URL, a paginated list), a
**campaign** (header, an SVG timeline, attempts with their logs, verdicts,
side effects, observations, the live journal), an **attempt's log**, bulk
action **previews**, the **autonomy** chart, and sign-in.

Everything is rendered here from the same ``Kernel`` reads as the API, as the
database role of the signed-in token, so a page can show and do exactly what
that role may: a reader gets no action buttons, and the database refuses a
reader's forged form anyway. Operator actions are recorded as
``http:<token name>``, like the API's. Progressive enhancement is one small
script (``static/dashboard.js``): it follows ``/ui/board/events`` (a "changed"
event when anything the board shows changed) or the campaign's journal stream
(``/campaigns/{id}/events``) and swaps in fresh copies of the page's live
regions; it pauses while the tab is hidden. Without it every page still works.

The dashboard is its own (mounted) application: its routes are pages, not part
of the API's OpenAPI contract, and its errors are pages, not problem+json.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, unquote, urlencode

import jinja2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import LedgerConfig, SensorConfig
from ..errors import Forbidden, InvalidInput, LedgerError, NotFound
from ..hub import NullHub, Subscription
from ..kernel import Kernel
from ..logs import get_logger
from ..models import STATES, TERMINAL_STATES, Campaign, Event
from ..report import autonomy_report
from ..sensors import next_tick, trigger_for
from . import cookies
from .auth import Principal, TokenTable
from .campaigns import BIGINT_MAX, OPEN_STATES, decode_cursor, encode_cursor
from .charts import autonomy_chart
from .timeline import campaign_timeline

if TYPE_CHECKING:
    from .app import ApiState

log = get_logger("dashboard")

HERE = Path(__file__).parent
#: Lanes of the board: one per open state, then the recently closed.
LANES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ready", "Ready", ("ready",)), ("leased", "Leased", ("leased",)),
    ("attempted", "Attempted", ("attempted",)), ("verified", "Verified", ("verified",)),
    ("exhausted", "Exhausted", ("exhausted",)),
    ("closed", "Recently closed", ("confirmed", "dismissed", "abandoned")),
)
LANE_SIZE = 6
PAGE_SIZE = 50
BULK_CAP = 1000
EXPIRING_WITHIN_S = 60.0
#: A busy ledger changes many times a second; a board needs at most this many
#: "changed" events a second per browser (each one re-renders the board).
MIN_CHANGE_GAP_S = 0.5
JOURNAL_TAIL = 100
FLASH_COOKIE = "ledger_flash"
#: Journal event types the page's script listens for by name (an EventSource
#: cannot listen to "any" named event); types found in the journal are added.
KNOWN_EVENT_TYPES = ("transition", "output", "progress", "attempt.started", "command.started",
                     "command.exited", "commit.made", "verification.started",
                     "side_effect.requested", "side_effect.done", "side_effect.conflict",
                     "side_effect.retry", "side_effect.failed", "side_effect.cancelled")
_TEXT_LIMIT = 200
_SECURITY_HEADERS = {
    # Everything is served from here: no CDN, no inline script or style.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class SignInRequired(Exception):
    """The request carries no valid token or sign-in."""


# --- formatting --------------------------------------------------------------------


def duration(seconds: float | None) -> str:
    """A short human duration: ``45s``, ``3m 12s``, ``2h 5m``, ``3d 4h``."""
    if seconds is None:
        return "–"
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _clock(t: datetime | None) -> str:
    return "–" if t is None else t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _short_clock(t: datetime | None) -> str:
    return "–" if t is None else t.astimezone(timezone.utc).strftime("%H:%M:%S")


def _short(text: object, n: int = 12) -> str:
    return "–" if text in (None, "") else str(text)[:n]


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def describe(event: Event) -> str:
    """One line for a journal event."""
    p = event.payload
    if event.type == "transition":
        line = f"{p.get('transition') or 'closed'}: {p.get('from') or '–'} → {p.get('to')}"
        extra = p.get("reason") or p.get("failure_reason")
        return f"{line} ({extra})" if extra else line
    if event.type == "output":
        return str(p.get("text", ""))
    parts = []
    for key, value in sorted(p.items()):
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        parts.append(f"{key}={text[:40] + '…' if len(text) > 40 else text}")
    line = "  ".join(parts)
    return line if len(line) <= _TEXT_LIMIT else line[:_TEXT_LIMIT] + "…"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(duration=duration, clock=_clock, short_clock=_short_clock,
                       short=_short, pretty=_pretty, describe=describe)
    env.globals.update(states=STATES, terminal=TERMINAL_STATES)
    return env


# --- who is looking -----------------------------------------------------------------


@dataclass(frozen=True)
class Viewer:
    """The signed-in caller: principal, browser sign-in (if by cookie), kernel."""

    principal: Principal
    session: cookies.BrowserSession | None
    kernel: Kernel

    @property
    def can_act(self) -> bool:
        """Whether to offer operator actions (the database decides in the end)."""
        return self.principal.role == "operator"

    @property
    def csrf(self) -> str:
        """The CSRF token forms carry (empty for a bearer caller: nothing to forge)."""
        return self.session.csrf if self.session else ""


def _api(request: Request) -> ApiState:
    return request.app.state.ledger  # type: ignore[no-any-return]


def _authenticate(request: Request) -> tuple[Principal, cookies.BrowserSession | None]:
    tokens: TokenTable = _api(request).tokens
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        principal = tokens.authenticate(header[7:].strip())
        if principal is not None:
            return principal, None
        raise SignInRequired()
    session = cookies.session_of(request)
    principal = tokens.authenticate(session.token) if session else None
    if principal is None:
        raise SignInRequired()
    return principal, session


async def viewer_of(request: Request) -> Viewer:
    """The caller of a page; ``SignInRequired`` if none."""
    principal, session = _authenticate(request)
    request.state.principal = principal  # for the request log
    kernel = await _api(request).pools.kernel(principal.role)
    return Viewer(principal, session, kernel)


async def _form(request: Request, viewer: Viewer) -> dict[str, str]:
    """A POSTed form, after the CSRF checks; ``Forbidden`` if they fail."""
    origin = request.headers.get("origin")
    if origin and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise Forbidden("the form was posted from another origin")
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise InvalidInput("expected a form (application/x-www-form-urlencoded)")
    body = (await request.body()).decode("utf-8", errors="replace")
    form = {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}
    if viewer.session is not None and not viewer.session.csrf_matches(form.get(cookies.CSRF_FIELD)):
        raise Forbidden("the form's CSRF token does not match this sign-in; reload the page")
    return form


def _local_path(target: str | None, default: str = "/ui/") -> str:
    """``target`` if it is a path of this dashboard (never another site)."""
    if target and target.startswith("/ui") and not target.startswith("//") \
            and "\\" not in target and "\n" not in target and "\r" not in target:
        return target
    return default


# --- filters ------------------------------------------------------------------------

_FILTER_TEXT = re.compile(r"^[^\x00]{1,200}$")


@dataclass(frozen=True)
class BoardFilter:
    """What the board is narrowed to; kept in the URL."""

    states: tuple[str, ...] = ()
    class_: str | None = None
    target: str | None = None
    label: str | None = None
    q: str | None = None

    @classmethod
    def parse(cls, get: Callable[[str], str | None], get_all: Callable[[str], list[str]]
              ) -> BoardFilter:
        """From query or form fields; ``InvalidInput`` for what cannot be a filter."""
        states = tuple(dict.fromkeys(s for s in get_all("state") if s))
        unknown = [s for s in states if s not in STATES]
        if unknown:
            raise InvalidInput(f"unknown state(s): {', '.join(unknown)}")
        values = {}
        for name in ("class", "target", "label", "q"):
            value = (get(name) or "").strip()
            if value and not _FILTER_TEXT.match(value):
                raise InvalidInput(f"{name}: at most 200 characters, no NUL")
            values[name] = value or None
        return cls(states, values["class"], values["target"], values["label"], values["q"])

    @classmethod
    def from_query(cls, request: Request) -> BoardFilter:
        """From the URL."""
        return cls.parse(request.query_params.get, request.query_params.getlist)

    def is_empty(self) -> bool:
        """Whether nothing narrows the board."""
        return not (self.states or self.class_ or self.target or self.label or self.q)

    def pairs(self) -> list[tuple[str, str]]:
        """The filter as query pairs."""
        pairs = [("state", s) for s in self.states]
        pairs += [(k, v) for k, v in (("class", self.class_), ("target", self.target),
                                      ("label", self.label), ("q", self.q)) if v]
        return pairs

    def query(self, **extra: str) -> str:
        """The URL query of this filter (plus ``extra``)."""
        return urlencode(self.pairs() + [(k, v) for k, v in extra.items() if v])

    def with_states(self, states: Sequence[str]) -> BoardFilter:
        """The same filter, narrowed to ``states`` (those of it, if it names any)."""
        kept = tuple(s for s in states if not self.states or s in self.states)
        return replace(self, states=kept or tuple(states))

    def describe(self) -> str:
        """The filter in words."""
        return ", ".join(f"{k}={v}" for k, v in self.pairs()) or "everything"

    def reads(self, states: Sequence[str] | None = None) -> dict[str, Any]:
        """Keyword arguments of ``Kernel.campaigns`` (``states`` overrides)."""
        return {"states": list(states) if states is not None else (list(self.states) or None),
                "classes": [self.class_] if self.class_ else None, "target": self.target,
                "label": self.label, "search": self.q}


# --- sensors ------------------------------------------------------------------------


@dataclass
class SensorRow:
    """A sensor as the board shows it."""

    name: str
    target: str | None = None
    last: dict[str, Any] | None = None  # the latest observation's columns
    last_tick: datetime | None = None
    schedule: str | None = None
    next_tick: datetime | None = None


def _schedule(sensor: SensorConfig) -> str:
    return f"every {sensor.every_s:g}s" if sensor.every_s is not None else f"cron {sensor.cron}"


def sensor_rows(summaries: Sequence[dict[str, Any]], config: LedgerConfig | None,
                now: datetime) -> list[SensorRow]:
    """Sensors seen in the database and declared in the config, with the next
    tick where the config gives a schedule."""
    rows: dict[str, SensorRow] = {}
    for s in summaries:
        rows[s["sensor"]] = SensorRow(
            name=s["sensor"], target=s["target"],
            last=s if s["observation_id"] is not None else None, last_tick=s["last_tick"])
    for name, sensor in (config.sensors.items() if config else ()):
        row = rows.setdefault(name, SensorRow(name=name))
        row.target = row.target or sensor.target
        row.schedule = _schedule(sensor)
        try:
            row.next_tick = next_tick(trigger_for(sensor), now)
        except LedgerError:
            row.schedule = f"{row.schedule} (invalid)"
    return sorted(rows.values(), key=lambda r: r.name)


# --- the board's change stream ------------------------------------------------------


async def _either(a: Subscription, b: Subscription, timeout: float) -> None:
    waits = [asyncio.ensure_future(a.wait(timeout)), asyncio.ensure_future(b.wait(timeout))]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def board_changes(kernel: Kernel, hub: Any, *, poll_s: float, keepalive_s: float,
                        min_gap_s: float = MIN_CHANGE_GAP_S) -> AsyncIterator[ServerSentEvent]:
    """A ``changed`` event whenever what the board shows changed.

    Woken by the hub (a journal grew, a campaign became ready) and, because
    notifications are only hints (claims send none), by a poll tick; either way
    it compares the ledger's ``board_version``, so the stream says "changed"
    only when something did, and at most once per ``min_gap_s``."""
    loop = asyncio.get_running_loop()
    with hub.subscribe("ledger_event") as journal, hub.subscribe("ledger_ready") as ready:
        version = await kernel.board_version()
        yield ServerSentEvent(event="hello", data=json.dumps({"campaigns": version[0]}))
        quiet_since = loop.time()
        while True:
            await _either(journal, ready, min(poll_s, keepalive_s))
            journal.drain()
            ready.drain()
            current = await kernel.board_version()
            if current != version:
                version = current
                yield ServerSentEvent(event="changed", data=json.dumps(
                    {"campaigns": current[0], "events": current[1]}))
                quiet_since = loop.time()
                await asyncio.sleep(min_gap_s)  # rate limit, not a wait for a condition
            elif loop.time() - quiet_since >= keepalive_s:
                yield ServerSentEvent(comment="keepalive")
                quiet_since = loop.time()


# --- the application ----------------------------------------------------------------


@dataclass
class Dashboard:
    """The mounted application and what its pages share."""

    state: ApiState
    config: LedgerConfig | None
    env: jinja2.Environment = field(default_factory=_environment)

    def page(self, request: Request, template: str, viewer: Viewer | None = None, *,
             status: int = 200, **context: Any) -> HTMLResponse:
        """Render a page (and hand over a pending flash message)."""
        flash = unquote(request.cookies.get(FLASH_COOKIE, ""))[:300] or None
        html = self.env.get_template(template).render(
            request=request, viewer=viewer, flash=flash, path=request.url.path,
            full_path=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            **context)
        response = HTMLResponse(html, status_code=status, headers=_SECURITY_HEADERS)
        if flash:
            response.delete_cookie(FLASH_COOKIE, path="/ui")
        return response


def _redirect(url: str, flash: str | None = None) -> RedirectResponse:
    response = RedirectResponse(url, status_code=303)
    if flash:
        response.set_cookie(FLASH_COOKIE, quote(flash[:300]), path="/ui", httponly=True,
                            samesite="strict", max_age=60)
    return response


def create_dashboard(state: ApiState, config: LedgerConfig | None = None) -> FastAPI:
    """The dashboard application, to mount at ``/ui`` of the API."""
    ui = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    ui.state.ledger = state
    dash = Dashboard(state, config)
    ui.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    async def on_sign_in(request: Request, exc: Exception) -> Response:
        if request.url.path.endswith("/events"):
            return Response("sign in first", status_code=401, media_type="text/plain")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/ui/login?" + urlencode({"next": target}), status_code=303)

    async def on_ledger_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LedgerError)
        return dash.page(request, "error.html", status=exc.http_status, title=exc.slug,
                         message=exc.message)

    async def on_invalid(request: Request, exc: Exception) -> Response:
        return dash.page(request, "error.html", status=422, title="invalid-input",
                         message="the address or form is not valid here")

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return dash.page(request, "error.html", status=exc.status_code,
                         title=f"http-{exc.status_code}", message=str(exc.detail))

    ui.add_exception_handler(SignInRequired, on_sign_in)
    ui.add_exception_handler(LedgerError, on_ledger_error)
    ui.add_exception_handler(RequestValidationError, on_invalid)
    ui.add_exception_handler(StarletteHTTPException, on_http)

    # --- sign-in ----------------------------------------------------------------

    @ui.get("/login", response_class=HTMLResponse)
    async def login_page(request: Request) -> Response:
        return dash.page(request, "login.html", next=_local_path(request.query_params.get("next")),
                         error=None, configured=len(state.tokens) > 0)

    @ui.post("/login", response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin and origin != f"{request.url.scheme}://{request.url.netloc}":
            raise Forbidden("the form was posted from another origin")
        body = (await request.body()).decode("utf-8", errors="replace")
        form = {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}
        token, target = form.get("token", "").strip(), _local_path(form.get("next"))
        principal = state.tokens.authenticate(token) if token else None
        if principal is None:
            return dash.page(request, "login.html", status=401, next=target,
                             error="That token is not configured on this server.",
                             configured=len(state.tokens) > 0)
        response = _redirect(target)
        cookies.set_session(response, cookies.BrowserSession.new(token),
                            secure=request.url.scheme == "https")
        log.info("signed in", caller=principal.identity, role=principal.role)
        return response

    @ui.post("/logout")
    async def logout(request: Request) -> Response:
        viewer = await viewer_of(request)
        await _form(request, viewer)
        response = _redirect("/ui/login")
        cookies.clear_session(response)
        return response

    # --- the board ----------------------------------------------------------------

    @ui.get("/", response_class=HTMLResponse)
    async def board(request: Request) -> Response:
        viewer = await viewer_of(request)
        flt = BoardFilter.from_query(request)
        cursor_text = request.query_params.get("cursor")
        cursor = decode_cursor(cursor_text) if cursor_text else None
        k = viewer.kernel
        now = datetime.now(timezone.utc)
        lanes = [lane for lane in LANES
                 if not flt.states or set(lane[2]) & set(flt.states)]

        async def lane(states: tuple[str, ...]) -> list[Campaign]:
            wanted = [s for s in states if not flt.states or s in flt.states]
            return await k.campaigns(**flt.reads(wanted), limit=LANE_SIZE)

        # Independent reads, concurrently: each takes its own pooled connection.
        (counts, matching, page_rows, expiring, oldest_age, summaries,
         classes, *lane_rows) = await asyncio.gather(
            k.state_counts(), k.matching_state_counts(**flt.reads()),
            k.campaigns(**flt.reads(), cursor=cursor, limit=PAGE_SIZE + 1),
            k.leases_expiring(EXPIRING_WITHIN_S, limit=10), k.oldest_ready_age(),
            k.sensor_summaries(50), k.classes(), *(lane(s) for _, _, s in lanes))
        more = len(page_rows) > PAGE_SIZE
        page_rows = page_rows[:PAGE_SIZE]
        next_cursor = encode_cursor(page_rows[-1]) if more else None
        return dash.page(
            request, "board.html", viewer, flt=flt, now=now, counts=counts,
            matching=matching, matching_total=sum(matching.values()),
            lanes=[(key, title, states, rows, sum(matching.get(s, 0) for s in states
                                                   if not flt.states or s in flt.states))
                   for (key, title, states), rows in zip(lanes, lane_rows)],
            rows=page_rows, next_cursor=next_cursor, first_page=cursor is None,
            expiring=expiring, oldest_age=oldest_age,
            sensors=sensor_rows(summaries, dash.config, now), has_config=dash.config is not None,
            classes=[c.name for c in classes], page_size=PAGE_SIZE)

    @ui.get("/board/events")
    async def board_events(request: Request) -> Response:
        viewer = await viewer_of(request)
        await viewer.kernel.board_version()  # fail (and say so) before the stream starts
        return EventSourceResponse(
            board_changes(viewer.kernel, state.hub or NullHub(), poll_s=state.options.poll_s,
                          keepalive_s=state.options.keepalive_s), ping=0)

    # --- a campaign -----------------------------------------------------------------

    @ui.get("/campaigns/{campaign_id}", response_class=HTMLResponse)
    async def campaign_page(request: Request, campaign_id: int) -> Response:
        if not 1 <= campaign_id <= BIGINT_MAX:
            raise NotFound(f"campaign {campaign_id} does not exist")
        viewer = await viewer_of(request)
        k = viewer.kernel
        # The journal before the rest: whatever happens after this read reaches
        # the page through its stream (which starts after the journal's head)
        # and refreshes it, so the page can never stay older than its journal.
        journal = await k.recent_events(campaign_id, JOURNAL_TAIL)
        campaign = await k.campaign(campaign_id)
        (attempts, verifications, side_effects, observations,
         transitions) = await asyncio.gather(
            k.attempts_of(campaign_id), k.verifications_of(campaign_id),
            k.side_effects_of(campaign_id), k.recent_observations(campaign_id, 200),
            k.transitions_of(campaign_id))
        now = datetime.now(timezone.utc)
        timeline = campaign_timeline(campaign, transitions=transitions, attempts=attempts,
                                     verifications=verifications, side_effects=side_effects,
                                     observations=observations, now=now)
        attempt_no = {a.id: a.attempt_no for a in attempts}
        head = journal[-1].seq if journal else 0
        types = sorted(set(KNOWN_EVENT_TYPES) | {e.type for e in journal})
        return dash.page(
            request, "campaign.html", viewer, c=campaign, now=now, attempts=attempts,
            verifications=verifications, attempt_no=attempt_no, side_effects=side_effects,
            observations=list(reversed(observations)), timeline=timeline, journal=journal,
            journal_head=head, event_types=",".join(types),
            journal_from=journal[0].seq if journal else 0)

    @ui.get("/campaigns/{campaign_id}/attempts/{attempt_no}", response_class=HTMLResponse)
    async def attempt_log(request: Request, campaign_id: int, attempt_no: int) -> Response:
        if not 1 <= campaign_id <= BIGINT_MAX:
            raise NotFound(f"campaign {campaign_id} does not exist")
        viewer = await viewer_of(request)
        k = viewer.kernel
        campaign = await k.campaign(campaign_id)
        attempt = next((a for a in await k.attempts_of(campaign_id)
                        if a.attempt_no == attempt_no), None)
        if attempt is None:
            raise NotFound(f"campaign {campaign_id} has no attempt {attempt_no}")
        events = await k.generation_events(campaign_id, attempt.generation)
        output = "".join(str(e.payload.get("text", "")) for e in events if e.type == "output")
        return dash.page(request, "attempt.html", viewer, c=campaign, a=attempt,
                         events=[e for e in events if e.type != "output"], output=output)

    # --- operator actions -------------------------------------------------------------

    @ui.post("/campaigns/{campaign_id}/abandon")
    async def abandon(request: Request, campaign_id: int) -> Response:
        viewer = await viewer_of(request)
        form = await _form(request, viewer)
        reason = (form.get("reason") or "").strip()[:1000] or "abandoned by operator"
        generation = await viewer.kernel.abandon(campaign_id, reason,
                                                 viewer.principal.identity)
        return _redirect(_local_path(form.get("next"), f"/ui/campaigns/{campaign_id}"),
                         f"Campaign {campaign_id} abandoned (generation {generation}).")

    @ui.post("/campaigns/{campaign_id}/reopen")
    async def reopen(request: Request, campaign_id: int) -> Response:
        viewer = await viewer_of(request)
        form = await _form(request, viewer)
        extra = _extra_attempts(form.get("extra_attempts"))
        await viewer.kernel.reopen(campaign_id, viewer.principal.identity, extra)
        return _redirect(_local_path(form.get("next"), f"/ui/campaigns/{campaign_id}"),
                         f"Campaign {campaign_id} reopened.")

    @ui.get("/bulk/{action}", response_class=HTMLResponse)
    async def bulk_preview(request: Request, action: str) -> Response:
        viewer = await viewer_of(request)
        flt = BoardFilter.from_query(request)
        allowed = _bulk_states(action)
        ids, truncated = await _bulk_matches(viewer.kernel, flt, allowed)
        sample = await asyncio.gather(*(viewer.kernel.campaign(cid) for cid in ids[:20]))
        return dash.page(request, "bulk.html", viewer, action=action, flt=flt, ids=ids,
                         truncated=truncated, sample=sample, cap=BULK_CAP, changed=False)

    @ui.post("/bulk/{action}", response_class=HTMLResponse)
    async def bulk(request: Request, action: str) -> Response:
        viewer = await viewer_of(request)
        form = await _form(request, viewer)
        pairs = parse_qs((await request.body()).decode("utf-8", errors="replace"))
        flt = BoardFilter.parse(form.get, lambda name: pairs.get(name, []))
        allowed = _bulk_states(action)
        ids, truncated = await _bulk_matches(viewer.kernel, flt, allowed)
        expected = form.get("expected", "")
        if str(len(ids)) != expected:
            # What was confirmed is not what would now happen: show it again.
            sample = await asyncio.gather(*(viewer.kernel.campaign(cid) for cid in ids[:20]))
            return dash.page(request, "bulk.html", viewer, status=409, action=action, flt=flt,
                             ids=ids, truncated=truncated, sample=sample, cap=BULK_CAP,
                             changed=True)
        identity = viewer.principal.identity
        outcomes: dict[str, int] = {}
        for cid in ids:
            try:
                if action == "abandon":
                    reason = (form.get("reason") or "").strip()[:1000] or "abandoned by operator"
                    await viewer.kernel.abandon(cid, reason, identity)
                else:
                    await viewer.kernel.reopen(cid, identity,
                                               _extra_attempts(form.get("extra_attempts")))
                outcome = "abandoned" if action == "abandon" else "reopened"
            except Forbidden:
                raise  # the role may not do this at all: no point going on
            except LedgerError as exc:
                outcome = exc.slug  # it moved meanwhile (e.g. illegal-transition)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        summary = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items())) or "nothing"
        return _redirect("/ui/?" + flt.query(), f"Bulk {action} on {flt.describe()}: {summary}.")

    # --- autonomy ------------------------------------------------------------------

    @ui.get("/autonomy", response_class=HTMLResponse)
    async def autonomy(request: Request) -> Response:
        viewer = await viewer_of(request)
        text = request.query_params.get("days", "14")
        if not text.isdigit() or not 1 <= int(text) <= 366:
            raise InvalidInput("days: 1 to 366")
        report = await autonomy_report(viewer.kernel, int(text))
        return dash.page(request, "autonomy.html", viewer, report=report, days=int(text),
                         chart=autonomy_chart(report))

    return ui


def _extra_attempts(text: str | None) -> int | None:
    if not text or not text.strip():
        return None
    if not text.strip().isdigit() or not 1 <= int(text) <= 1000:
        raise InvalidInput("extra attempts: a whole number from 1 to 1000")
    return int(text)


def _bulk_states(action: str) -> tuple[str, ...]:
    if action == "abandon":
        return OPEN_STATES
    if action == "reopen":
        return ("exhausted",)
    raise NotFound(f"no bulk action {action!r}")


async def _bulk_matches(kernel: Kernel, flt: BoardFilter, allowed: Sequence[str]
                        ) -> tuple[list[int], bool]:
    """Ids of the campaigns a bulk action would act on (at most ``BULK_CAP``)."""
    if flt.is_empty():
        raise InvalidInput("a bulk action needs a filter (state, class, target, label or text)")
    states = [s for s in allowed if not flt.states or s in flt.states]
    if not states:
        return [], False
    ids: list[int] = []
    cursor: tuple[datetime, int] | None = None
    while len(ids) <= BULK_CAP:
        page = await kernel.campaigns(**flt.reads(states), cursor=cursor,
                                      limit=min(500, BULK_CAP + 1 - len(ids)))
        ids.extend(c.id for c in page)
        if not page or len(ids) > BULK_CAP:
            break
        cursor = (page[-1].updated_at, page[-1].id)
    return ids[:BULK_CAP], len(ids) > BULK_CAP
