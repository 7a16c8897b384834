"""Rendering shared by every page: the template environment and its filters,
the security headers, flash messages and redirects."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse

from ledger.config import LedgerConfig
from ledger.db.models import TERMINAL_STATES, Attempt, Campaign, Event, State

if TYPE_CHECKING:
    from ledger.api.dashboard.viewer import Viewer
    from ledger.api.state import ApiState

HERE = Path(__file__).resolve().parents[1]  # ledger/api: templates/ and static/
#: The states, in the machine's order (the ``State`` type is checked against
#: the database's ``ledger.state`` by the model tests).
STATES: tuple[str, ...] = get_args(State)
_TEXT_LIMIT = 200
#: Everything is served from here: no CDN, no inline script or style.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
_FLASH = "flash"
#: The theme a browser chose (dashboard.js and POST /ui/theme keep it here);
#: without one, the browser's own preference decides.
THEME_COOKIE = "ledger_theme"
THEMES = ("light", "dark")


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


def _argv(argv: Any) -> str:
    """A command's argv as a shell would read it back."""
    return shlex.join(str(a) for a in argv) if isinstance(argv, (list, tuple)) else str(argv)


def _css(text: str) -> str:
    """A word as a CSS class suffix (``awaiting verdict`` -> ``awaiting-verdict``)."""
    return "".join(ch if ch.isalnum() else "-" for ch in text)


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


def attempt_status(attempt: Attempt, campaign: Campaign) -> str:
    """What became of an attempt, in one word for its badge: how it ended,
    then what the verifier and the dispatcher made of it -- an accepted,
    promoted attempt reads "promoted", never "attempted"."""
    if attempt.outcome != "attempted":
        return attempt.outcome  # running, failed, lost, drained, released, abandoned
    if attempt.verdict == "rejected":
        return "rejected"
    if attempt.verdict == "accepted":
        promoted = campaign.promoted_sha is not None and campaign.promoted_sha == attempt.candidate_sha
        return "promoted" if promoted else "accepted"
    return "awaiting verdict"


def environment() -> jinja2.Environment:
    """The pages' template environment."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    env.filters.update(duration=duration, clock=_clock, short_clock=_short_clock,
                       short=_short, pretty=_pretty, describe=describe,
                       attempt_status=attempt_status, css=_css, argv=_argv)
    env.globals.update(states=STATES, terminal=TERMINAL_STATES)
    return env


@dataclass
class Pages:
    """What every page shares: the API's state, the config, the templates."""

    state: ApiState
    config: LedgerConfig | None
    env: jinja2.Environment = field(default_factory=environment)
    #: Chart figures by (class (None: all), window), with when they were read:
    #: a board re-renders on every change (up to twice a second per browser),
    #: and a window's aggregates need not be fresher than its ``ttl_s``.
    charts: dict[tuple[str | None, str], tuple[float, Any]] = field(default_factory=dict)

    def page(self, request: Request, template: str, viewer: Viewer | None = None, *,
             status: int = 200, **context: Any) -> HTMLResponse:
        """Render a page (and hand over a pending flash message)."""
        session = request.scope.get("session")
        flash = session.pop(_FLASH, None) if session is not None else None
        theme = request.cookies.get(THEME_COOKIE)
        html = self.env.get_template(template).render(
            request=request, viewer=viewer, flash=flash, path=request.url.path,
            theme=theme if theme in THEMES else "auto",
            full_path=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            **context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def pages_of(request: Request) -> Pages:
    """The dashboard's ``Pages`` (on the mounted app's state)."""
    return request.app.state.pages  # type: ignore[no-any-return]


def redirect(request: Request, url: str, flash: str | None = None) -> RedirectResponse:
    """A 303 to ``url``; ``flash`` is shown once on the next page (kept in the
    signed session, so only a signed-in browser sees it)."""
    session = request.scope.get("session")
    if flash and session is not None and session:
        session[_FLASH] = flash[:300]
    return RedirectResponse(url, status_code=303)
