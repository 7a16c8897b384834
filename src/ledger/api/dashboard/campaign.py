"""A campaign's page (header, timeline, attempts, verdicts, side effects,
observations, the live journal), an attempt's page (its output, live while it
runs), and the single-campaign operator actions: abandon, reopen, retry now."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ledger.api.dashboard.render import pages_of, redirect
from ledger.api.dashboard.viewer import local_path, read_form, viewer_of
from ledger.api.timeline import campaign_timeline
from ledger.db.bounds import ascii_int
from ledger.db.cursors import BIGINT_MAX
from ledger.errors import NotFound

router = APIRouter()

JOURNAL_TAIL = 100
#: The most of a candidate's diff a page shows (the database keeps up to 64 MiB).
DIFF_CAP = 256 * 1024
#: Journal event types the page's script listens for by name (an EventSource
#: cannot listen to "any" named event); types found in the journal are added.
KNOWN_EVENT_TYPES = ("transition", "output", "progress", "attempt.started", "command.started",
                     "command.exited", "commit.made", "verification.started",
                     "side_effect.requested", "side_effect.done", "side_effect.conflict",
                     "side_effect.retry", "side_effect.failed", "side_effect.cancelled",
                     "operator.retry_now", "security.refused")


def check_id(campaign_id: int) -> None:
    if not 1 <= campaign_id <= BIGINT_MAX:
        raise NotFound(f"campaign {campaign_id} does not exist")


def extra_attempts(text: str | None) -> int | None:
    """The "extra attempts" field of a reopen form (empty: the class's budget)."""
    if not text or not text.strip():
        return None
    return ascii_int(text, "extra attempts", 1, 1000)


@router.get("/campaigns/{campaign_id}", response_class=HTMLResponse)
async def campaign_page(request: Request, campaign_id: int) -> Response:
    """One campaign."""
    check_id(campaign_id)
    viewer = await viewer_of(request)
    k = viewer.reads
    # The journal before the rest: whatever happens after this read reaches
    # the page through its stream (which starts after the journal's head)
    # and refreshes it, so the page can never stay older than its journal.
    journal = await k.recent_events(campaign_id, JOURNAL_TAIL)
    campaign = await k.campaign(campaign_id)
    (attempts, verifications, side_effects, observations,
     transitions, approvals) = await asyncio.gather(
        k.attempts_of(campaign_id), k.verifications_of(campaign_id),
        k.side_effects_of(campaign_id), k.recent_observations(campaign_id, 200),
        k.transitions_of(campaign_id), k.approvals_of(campaign_id))
    now = datetime.now(timezone.utc)
    timeline = campaign_timeline(campaign, transitions=transitions, attempts=attempts,
                                 verifications=verifications, side_effects=side_effects,
                                 observations=observations, now=now)
    head = journal[-1].seq if journal else 0
    types = sorted(set(KNOWN_EVENT_TYPES) | {e.type for e in journal})
    return pages_of(request).page(
        request, "campaign.html", viewer, c=campaign, now=now, attempts=attempts,
        verifications=verifications, attempt_no={a.id: a.attempt_no for a in attempts},
        side_effects=side_effects, observations=list(reversed(observations)),
        timeline=timeline, journal=journal, journal_head=head, event_types=",".join(types),
        journal_from=journal[0].seq if journal else 0, has_approvals=bool(approvals),
        waiting=campaign.state == "ready" and campaign.next_attempt_at > now)


@router.get("/campaigns/{campaign_id}/attempts/{attempt_no}", response_class=HTMLResponse)
async def attempt_page(request: Request, campaign_id: int, attempt_no: int) -> Response:
    """One attempt: what its lease journaled, its output (live while it runs)."""
    check_id(campaign_id)
    viewer = await viewer_of(request)
    k = viewer.reads
    # The head first: the stream resumes after it, so an event appended after
    # the reads below arrives through the stream (the page skips what it shows).
    campaign = await k.campaign(campaign_id)
    attempt = next((a for a in await k.attempts_of(campaign_id)
                    if a.attempt_no == attempt_no), None)
    if attempt is None:
        raise NotFound(f"campaign {campaign_id} has no attempt {attempt_no}")
    events = await k.generation_events(campaign_id, attempt.generation)
    diff = await k.attempt_diff(campaign_id, attempt_no, DIFF_CAP) if attempt.diff_bytes else None
    output = "".join(str(e.payload.get("text", "")) for e in events if e.type == "output")
    live = attempt.outcome == "running" and not campaign.is_terminal
    exited = next((e.payload for e in reversed(events) if e.type == "command.exited"), {})
    cell = cell_limits(exited.get("limits")) if isinstance(exited, dict) else None
    types = sorted(set(KNOWN_EVENT_TYPES) | {e.type for e in events})
    return pages_of(request).page(
        request, "attempt.html", viewer, c=campaign, a=attempt,
        events=[e for e in events if e.type != "output"], output=output, live=live,
        journal_head=campaign.event_seq, shown_head=max([e.seq for e in events], default=0),
        event_types=",".join(types), diff=diff, diff_lines=diff_lines(diff.text) if diff else [],
        cell=cell)


def cell_limits(limits: object) -> str | None:
    """How the attempt's cell was limited, in one line: the mode (a cgroup
    v2 or v1 of its own, or rlimits only), the limits, and what stopped it."""
    if not isinstance(limits, dict) or "mode" not in limits:
        return None
    mode = {"cgroup2": "cgroup v2", "cgroup1": "cgroup v1", "rlimits": "rlimits only"}.get(
        str(limits["mode"]), str(limits["mode"]))
    line = (f"{mode} · memory {limits.get('memory_mb')} MiB · {limits.get('processes')} processes · "
            f"{limits.get('cpu_s')} CPU s · workspace +{limits.get('workspace_mb')} MiB")
    used = [f"{k} {limits[k]}" for k in ("memory_peak_mb", "cpu_used_s", "workspace_peak_mb") if k in limits]
    if used:
        line += " (used: " + ", ".join(used) + ")"
    if limits.get("exceeded"):
        line += f" · stopped at its {limits['exceeded']} limit"
    return line


def diff_lines(text: str) -> list[tuple[str, str]]:
    """A unified diff's lines, each with what it is (for its colour): a file
    header, a hunk header, an addition, a removal, or context. The template
    escapes the text; nothing of the diff is ever markup."""
    lines = []
    for line in text.splitlines():
        if line.startswith(("diff --git", "index ", "--- ", "+++ ", "new file", "deleted file",
                            "similarity", "rename ", "old mode", "new mode", "Binary files")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        lines.append((kind, line))
    return lines


@router.post("/campaigns/{campaign_id}/abandon")
async def abandon(request: Request, campaign_id: int) -> Response:
    """Abandon one campaign."""
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    reason = (form.get("reason") or "").strip()[:1000] or "abandoned by operator"
    generation = await viewer.kernel.abandon(campaign_id, reason, viewer.principal.identity)
    return redirect(request, local_path(form.get("next"), f"/ui/campaigns/{campaign_id}"),
                    f"Campaign {campaign_id} abandoned (generation {generation}).")


@router.post("/campaigns/{campaign_id}/reopen")
async def reopen(request: Request, campaign_id: int) -> Response:
    """Give an exhausted campaign more attempts."""
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    await viewer.kernel.reopen(campaign_id, viewer.principal.identity,
                               extra_attempts(form.get("extra_attempts")))
    return redirect(request, local_path(form.get("next"), f"/ui/campaigns/{campaign_id}"),
                    f"Campaign {campaign_id} reopened.")


@router.post("/campaigns/{campaign_id}/retry")
async def retry_now(request: Request, campaign_id: int) -> Response:
    """Let a ready campaign that waits out its backoff be claimed now."""
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    await viewer.kernel.retry_now(campaign_id, viewer.principal.identity)
    return redirect(request, local_path(form.get("next"), f"/ui/campaigns/{campaign_id}"),
                    f"Campaign {campaign_id} may be claimed now (its backoff was skipped).")
