"""The dashboard in process (httpx over ASGI, real PostgreSQL): sign-in and its
cookie, CSRF on every change, the database's authorisation behind the pages,
bulk actions with a preview and a confirmation, filters and pages, the board's
change stream, the timeline and the autonomy chart."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import httpx
import pytest
from test_api import token_table

from conftest import Actors
from drive import Driver, fingerprint, new_key, now, sha
from ledger import Database, Kernel
from ledger.api import ApiOptions, create_app, new_token
from ledger.api.charts import autonomy_chart
from ledger.api.dashboard import board_changes, sensor_rows
from ledger.api.timeline import GUTTER, RIGHT, WIDTH, campaign_timeline
from ledger.config import parse_config
from ledger.db.hub import NullHub
from ledger.db.models import SensorSummary
from ledger.report import Day, Report

pytestmark = pytest.mark.anyio

BASE = "http://ledger.test"


@dataclass
class Ui:
    """An in-process client (a browser without script) and one token per role."""

    client: httpx.AsyncClient
    tokens: dict[str, str]

    async def sign_in(self, role: str) -> str:
        """Sign in as ``role``; returns the session's CSRF token (from a page)."""
        self.client.cookies.clear()
        r = await self.client.post("/ui/login", data={"token": self.tokens[role], "next": "/ui/"})
        assert r.status_code == 303, r.text
        return csrf_of(await self.client.get("/ui/"))


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.text)
    assert found, page.text[:500]
    return found.group(1)


@pytest.fixture
async def ui(db: Database) -> AsyncIterator[Ui]:
    tokens = {role: new_token() for role in ("reader", "operator", "sensor")}
    config = parse_config({"sensors": {"unit-tests": {
        "target": "repo#main", "every_s": 60, "command": ["true"], "class": "test"}}})
    app = create_app(db, token_table(tokens), ApiOptions(), config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield Ui(client, tokens)


async def state_of(actors: Any, cid: int) -> str:
    return (await (await actors.reads("reader")).campaign(cid)).state


# --- sign-in ------------------------------------------------------------------------


async def test_sign_in_sets_a_strict_http_only_cookie_that_the_api_accepts(ui: Ui, actors: Actors, test_class: str) -> None:
    cid = await Driver(actors, test_class).open()
    r = await ui.client.get("/ui/campaigns/1?x=1")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui%2Fcampaigns%2F1%3Fx%3D1"
    r = await ui.client.post("/ui/login", data={"token": new_token()})
    assert r.status_code == 401 and "not configured" in r.text and "set-cookie" not in r.headers
    r = await ui.client.post("/ui/login", data={"token": ui.tokens["operator"],
                                                "next": "//elsewhere.example/"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/"  # never off-site
    cookie = r.headers["set-cookie"].lower()
    for attribute in ("httponly", "samesite=strict", "path=/", "max-age="):
        assert attribute in cookie, cookie
    # The API takes the cookie for reads; a change also needs the CSRF header.
    assert (await ui.client.get(f"/campaigns/{cid}")).status_code == 200
    r = await ui.client.post(f"/campaigns/{cid}/abandon", json={"reason": "no csrf"})
    assert r.status_code == 403 and r.json()["type"] == "/problems/forbidden"
    assert await state_of(actors, cid) == "ready"
    csrf = csrf_of(await ui.client.get("/ui/"))
    r = await ui.client.post(f"/campaigns/{cid}/abandon", json={"reason": "with csrf"},
                             headers={"X-CSRF-Token": csrf})
    assert r.status_code == 200, r.text
    assert (await (await actors.reads("reader")).events(cid))[-1].actor == "http:operator-tok"
    # Signing out ends it; the old CSRF token is worthless with another sign-in.
    # The session is signed: an edited cookie is no sign-in at all.
    value = ui.client.cookies["ledger_session"]
    ui.client.cookies.set("ledger_session", value[:-2] + ("A" if value[-2] != "A" else "B")
                          + value[-1])
    assert (await ui.client.get("/campaigns")).status_code == 401
    ui.client.cookies.set("ledger_session", value)
    r = await ui.client.post("/ui/logout", data={"csrf": csrf})
    assert r.status_code == 303
    assert "ledger_session=null" in r.headers["set-cookie"] and "1970" in r.headers["set-cookie"]
    ui.client.cookies.clear()
    assert (await ui.client.get("/campaigns")).status_code == 401
    other = await ui.sign_in("operator")
    assert other != csrf


async def test_forms_need_the_csrf_token_and_the_database_has_the_last_word(ui: Ui, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid = await d.open()
    csrf = await ui.sign_in("operator")
    page = (await ui.client.get(f"/ui/campaigns/{cid}")).text
    assert 'id="abandon"' in page
    for form in ({"reason": "forged"}, {"reason": "forged", "csrf": "0" * 64}):
        r = await ui.client.post(f"/ui/campaigns/{cid}/abandon", data=form)
        assert r.status_code == 403 and "CSRF" in r.text
    r = await ui.client.post(f"/ui/campaigns/{cid}/abandon", data={"reason": "by hand"},
                             headers={"Origin": "http://elsewhere.example"})
    assert r.status_code == 403
    assert await state_of(actors, cid) == "ready"
    r = await ui.client.post(f"/ui/campaigns/{cid}/abandon",
                             data={"reason": "by hand", "csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == f"/ui/campaigns/{cid}"
    last = (await (await actors.reads("reader")).events(cid))[-1]
    assert last.payload["to"] == "abandoned" and last.actor == "http:operator-tok"
    assert last.payload.get("reason") == "by hand"
    flashed = await ui.client.get(r.headers["location"])
    assert f"Campaign {cid} abandoned" in flashed.text

    # A reader gets no buttons; a forged form is refused by PostgreSQL.
    other = await d.open()
    reader_csrf = await ui.sign_in("reader")
    page = (await ui.client.get(f"/ui/campaigns/{other}")).text
    assert 'id="abandon"' not in page and 'id="actions"' not in page
    board = (await ui.client.get(f"/ui/?class={test_class}")).text
    assert 'id="bulk-abandon"' not in board
    r = await ui.client.post(f"/ui/campaigns/{other}/abandon",
                             data={"reason": "reader", "csrf": reader_csrf})
    assert r.status_code == 403 and "error-message" in r.text
    assert await state_of(actors, other) == "ready"


# --- bulk -----------------------------------------------------------------------------


def preview_form(page: httpx.Response) -> dict[str, str]:
    """The hidden fields of a bulk preview's confirmation form."""
    fields = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)"', page.text))
    assert "ids" in fields and "selection" in fields, page.text[:2000]
    return fields


async def test_bulk_confirm_acts_only_on_the_previewed_campaigns(ui: Ui, actors: Actors, test_class: str) -> None:
    """Preview "Abandon 8" for a label; elsewhere one of them is
    abandoned and a new campaign opens with that label; the confirmation abandons
    the seven still matching, not the new one, and shows both differences."""
    d = Driver(actors, test_class)
    batch = [await d.open(labels=["batch"]) for _ in range(8)]
    spared = await d.open()
    csrf = await ui.sign_in("operator")
    assert (await ui.client.get("/ui/bulk/abandon")).status_code == 422  # never on everything
    preview = await ui.client.get("/ui/bulk/abandon?label=batch")
    assert preview.status_code == 200 and 'data-count="8"' in preview.text
    assert "Abandon 8" in preview.text and 'id="explain"' in preview.text
    assert [await state_of(actors, c) for c in batch] == ["ready"] * 8  # a preview does nothing
    form = preview_form(preview)
    assert sorted(map(int, form["ids"].split(","))) == sorted(batch)

    # Elsewhere: one is abandoned, and a new campaign opens with the label.
    op = await actors("operator")
    await op.abandon(batch[0], "by someone else", "cli:bob@host")
    late = await d.open(labels=["batch"])

    r = await ui.client.post("/ui/bulk/abandon", data={**form, "reason": "cleanup",
                                                       "csrf": csrf})
    assert r.status_code == 200, r.text[:2000]
    assert await state_of(actors, late) == "ready", "the campaign nobody previewed was abandoned"
    reader = await actors.reads()
    for cid in batch[1:]:
        last = (await reader.events(cid))[-1]
        assert (last.payload["to"], last.actor) == ("abandoned", "http:operator-tok")
    assert (await reader.events(batch[0]))[-1].actor == "cli:bob@host"
    assert await state_of(actors, spared) == "ready"
    # The difference is shown: what was left alone and what no longer matched.
    assert 'id="difference"' in r.text and 'data-acted="7"' in r.text
    not_previewed = r.text[r.text.index('id="not-previewed"'):r.text.index('id="no-longer-matching"')]
    assert f'data-campaign="{late}"' in not_previewed
    gone = r.text[r.text.index('id="no-longer-matching"'):r.text.index('id="preview"')]
    assert f'data-campaign="{batch[0]}"' in gone
    # ... and what matches now is offered as a fresh preview: only the new one.
    assert 'data-count="1"' in r.text and preview_form(r)["ids"] == str(late)


async def test_bulk_confirm_without_a_preview_or_with_a_forged_one_does_nothing(ui: Ui, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    batch = [await d.open(labels=["batch"]) for _ in range(3)]
    csrf = await ui.sign_in("operator")
    form = preview_form(await ui.client.get("/ui/bulk/abandon?label=batch"))
    extra = await d.open(labels=["batch"])
    for forged in ({"label": "batch"},  # the old form: a filter and a count
                   {"label": "batch", "expected": "4"},
                   {**form, "ids": f"{form['ids']},{extra}"},  # an id the preview never had
                   {**form, "selection": "sel2-" + "9" * 10 + "-" + "0" * 64},
                   {**form, "label": "other"}):  # the same ids under another filter
        r = await ui.client.post("/ui/bulk/abandon", data={**forged, "csrf": csrf})
        assert r.status_code == 422, (forged, r.status_code)
    assert [await state_of(actors, c) for c in [*batch, extra]] == ["ready"] * 4
    # Unchanged since the preview: all of it, and back to the board with a summary.
    form = preview_form(await ui.client.get("/ui/bulk/abandon?label=batch"))
    r = await ui.client.post("/ui/bulk/abandon", data={**form, "csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/ui/?label=batch"
    assert "4 abandoned" in (await ui.client.get(r.headers["location"])).text


async def test_a_reader_sees_what_a_bulk_action_would_do_and_why_it_cannot(ui: Ui, actors: Actors, test_class: str) -> None:
    await Driver(actors, test_class).open(labels=["batch"])
    await ui.sign_in("reader")
    page = await ui.client.get("/ui/bulk/abandon?label=batch")
    assert page.status_code == 200 and 'id="reader-note"' in page.text
    assert "only an operator" in page.text and 'id="confirm"' not in page.text


# --- the board --------------------------------------------------------------------------


async def test_board_filters_count_and_page_through_campaigns(ui: Ui, actors: Actors, test_class: str) -> None:
    sensor = await actors("sensor")
    ids = [(await sensor.open_campaign(test_class, f"flaky-{i:03d}", "repo#main")).campaign_id
           for i in range(55)]
    odd = (await sensor.open_campaign(test_class, "docs-build", "repo#docs")).campaign_id
    await ui.sign_in("reader")
    first = await ui.client.get("/ui/?q=flaky&state=ready")
    assert first.status_code == 200
    assert 'data-matching="55"' in first.text
    rows = re.findall(r'<tr data-campaign="(\d+)"', first.text)
    assert len(rows) == 50 and str(odd) not in rows
    after = re.search(r'href="/ui/\?([^"]*cursor=[^"]+)" id="next-page"', first.text)
    assert after, "a next page"
    second = await ui.client.get("/ui/?" + after.group(1).replace("&amp;", "&"))
    more = re.findall(r'<tr data-campaign="(\d+)"', second.text)
    assert len(more) == 5 and not set(rows) & set(more)
    assert sorted(map(int, rows + more)) == sorted(ids)
    # Counts per state on the tiles; the sensors panel knows the schedule.
    board = (await ui.client.get("/ui/")).text
    assert re.search(r'data-state-count="ready">\s*<span class="tile-n">56<', board)
    assert 'data-sensor="unit-tests"' in board and "every 60s" in board
    assert (await ui.client.get("/ui/?state=bogus")).status_code == 422
    assert (await ui.client.get("/ui/?cursor=forged")).status_code == 422


async def test_the_board_honours_the_apis_search_parameter(ui: Ui, actors: Actors,
                                                           test_class: str) -> None:
    """``?search=`` is GET /campaigns' name for the board's ``q``: a link written
    for the API narrows the board too, instead of being ignored."""
    sensor = await actors("sensor")
    flaky = (await sensor.open_campaign(test_class, "flaky-one", "repo#main")).campaign_id
    other = (await sensor.open_campaign(test_class, "docs-build", "repo#docs")).campaign_id
    await ui.sign_in("reader")
    for query in ("q=flaky", "search=flaky"):
        page = await ui.client.get(f"/ui/?{query}")
        assert page.status_code == 200
        rows = re.findall(r'<tr data-campaign="(\d+)"', page.text)
        assert rows == [str(flaky)] and str(other) not in rows, query
    too_long = await ui.client.get("/ui/?search=" + "x" * 201)
    assert too_long.status_code == 422  # refused as q is, not ignored


async def test_the_sensor_panel_shows_a_check_that_keeps_failing(ui: Ui, actors: Actors) -> None:
    sensor = await actors("sensor")
    await sensor.record_observation("unit-tests", "k", "repo#main", "green", now())
    for n in range(2):
        await sensor.record_observation("unit-tests", "k", "repo#main", "error", now(),
                                        details={"error": f"fatal: unable to connect <{n}>"})
    await ui.sign_in("reader")
    page = (await ui.client.get("/ui/")).text
    panel = page[page.index('data-sensor="unit-tests"'):]
    assert 'dot error' in panel[:400] and 'data-consecutive-errors="2"' in panel
    assert "2 errors in a row" in panel and "fatal: unable to connect &lt;1&gt;" in panel  # escaped
    await sensor.record_observation("unit-tests", "k", "repo#main", "green", now())
    page = (await ui.client.get("/ui/")).text
    panel = page[page.index('data-sensor="unit-tests"'):]
    assert "data-consecutive-errors" not in panel and "last error" in panel


async def test_sensor_rows_without_a_config_have_no_next_tick() -> None:
    seen = [SensorSummary(sensor="ext", observation_id=7, target="t", status="red", last_tick=None)]
    config = parse_config({"sensors": {"nightly": {"target": "repo", "cron": "0 3 * * *",
                                                   "command": ["true"], "class": "c"}}})
    at = now()
    rows = sensor_rows(seen, None, at)
    assert [(r.name, r.next_tick) for r in rows] == [("ext", None)]
    rows = sensor_rows(seen, config, at)
    assert [r.name for r in rows] == ["ext", "nightly"]
    nightly = rows[1]
    assert nightly.last is None and nightly.next_tick is not None
    assert nightly.next_tick > at and nightly.next_tick.hour == 3 and nightly.next_tick.minute == 0


async def test_board_stream_says_changed_only_when_something_changed(actors: Actors, test_class: str) -> None:
    reader = await actors.reads()
    stream = board_changes(reader, NullHub(), poll_s=0.05, keepalive_s=0.3, min_gap_s=0.0)
    async with aclosing(stream):
        hello = await anext(stream)
        assert hello.event == "hello"
        # Nothing happens: a keepalive comment, not a "changed".
        idle = await anext(stream)
        assert idle.event is None and idle.comment == "keepalive"
        await Driver(actors, test_class).open()
        changed = await anext(stream)
        assert changed.event == "changed" and '"campaigns": 1' in str(changed.data)


# --- the campaign page -------------------------------------------------------------------


async def test_timeline_draws_attempts_verdicts_leases_lost_and_observations(actors: Actors, test_class: str, ui: Ui) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    verifier = await actors("verifier")
    seen = await sensor.record_observation("unit-tests", new_key(), "repo#main", "red", now(),
                                           class_=test_class)
    cid = seen.campaign_id
    claim = await worker.claim_campaign("worker-1", [test_class])
    assert cid is not None and claim is not None
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(2),
                                fingerprint=fingerprint(1), log_tail="1 failed")
    check = await verifier.claim_verification("verifier-1", classes=[test_class])
    await verifier.reject(check.verification_id, "tests fail", {"exit": 1})
    await actors("reaper")
    second = await worker.claim_campaign("worker-2", [test_class])
    assert second is not None and second.campaign_id == cid
    async with actors.session("reaper").transaction(now=now() + timedelta(minutes=5)) as tx:
        assert [r.campaign_id for r in await Kernel(tx).expire_leases()] == [cid]

    k = await actors.reads()
    campaign = await k.campaign(cid)
    tl = campaign_timeline(campaign, transitions=await k.transitions_of(cid),
                           attempts=await k.attempts_of(cid),
                           verifications=await k.verifications_of(cid), side_effects=[],
                           observations=await k.recent_observations(cid), now=now())
    assert [(s.key, s.kind) for s in tl.of("attempt")] == [("1", "attempted"), ("2", "lost")]
    assert [s.kind for s in tl.of("verification")] == ["rejected"]
    lease = tl.of("lease")
    assert [s.kind for s in lease if not s.hatched] == ["held", "lost"]
    assert [s.key for s in lease if s.hatched] == ["2"], "the time past a lost lease's expiry"
    assert [p.shape for p in tl.points if p.row == "lease"] == ["cross"]
    assert [(p.row, p.kind) for p in tl.points if p.row == "observation"] == [("observation", "red")]
    states = tl.of("state")
    assert [s.kind for s in states] == ["ready", "leased", "attempted", "ready", "leased", "ready"]
    for before, after in zip(states, states[1:]):  # bands follow each other, in time order
        assert before.x <= after.x
    assert all(GUTTER <= s.x and s.x + s.width <= WIDTH - RIGHT + 3 for s in tl.spans)

    await ui.sign_in("reader")
    page = await ui.client.get(f"/ui/campaigns/{cid}")
    assert page.status_code == 200
    assert page.text.count('class="tl-span tl-attempt') == 2
    assert 'data-outcome="lost"' in page.text and "tests fail" in page.text
    log = await ui.client.get(f"/ui/campaigns/{cid}/attempts/1")
    assert log.status_code == 200 and "1 failed" in log.text and sha(2) in log.text
    assert (await ui.client.get(f"/ui/campaigns/{cid}/attempts/9")).status_code == 404
    assert (await ui.client.get("/ui/campaigns/99999")).status_code == 404


async def test_the_attempt_page_says_how_its_cell_was_limited(actors: Actors, test_class: str, ui: Ui) -> None:
    """Which mode ran (a cgroup of its own, or rlimits only) is recorded on the
    attempt (its command.exited event) and shown, with what stopped it."""
    sensor, worker = await actors("sensor"), await actors("worker")
    cid = (await sensor.open_campaign(test_class, new_key(), "repo")).campaign_id
    claim = await worker.claim_campaign("worker-1", [test_class])
    assert claim is not None and claim.campaign_id == cid
    limits = {"mode": "cgroup1", "memory_mb": 4096, "processes": 1024, "cpu_s": 3600, "workspace_mb": 64,
              "workspace_start_mb": 1.0, "workspace_peak_mb": 70.5, "exceeded": "workspace"}
    await worker.append_events(cid, claim.generation, [
        {"type": "command.exited", "payload": {"exit_code": -9, "sandboxed": True, "limits": limits}}])
    await worker.fail_attempt(cid, claim.generation, "the attempt command was stopped")
    await ui.sign_in("reader")
    page = await ui.client.get(f"/ui/campaigns/{cid}/attempts/1")
    assert page.status_code == 200
    shown = page.text.split('id="cell-limits">', 1)[1].split("</dd>", 1)[0]
    assert shown.startswith("cgroup v1 · memory 4096 MiB · 1024 processes") and "workspace +64 MiB" in shown
    assert "stopped at its workspace limit" in shown


# --- autonomy ------------------------------------------------------------------------------


def _day(n: int, **counts: Any) -> Day:
    base = {"opened": 0, "attempts": 0, "rejections": 0, "verified": 0, "confirmed": 0,
            "human_actions": 0, "exercised": True}
    return Day(day=date(2026, 1, 1) + timedelta(days=n), **{**base, **counts})


async def test_autonomy_chart_marks_idle_days_and_scales_bars() -> None:
    report = Report(days=[_day(0, exercised=False), _day(1, confirmed=4), _day(2, human_actions=2),
                          _day(3)], streak=0)
    chart = autonomy_chart(report)
    cols = chart.columns
    assert [c.verdict for c in cols] == ["under-exercised", "autonomous", "human-assisted",
                                         "no-closure"]
    assert cols[1].confirmed_h == pytest.approx(chart.plot_bottom - chart.plot_top)  # the max
    assert cols[2].human_h == pytest.approx(cols[1].confirmed_h / 2)
    assert cols[0].confirmed_h == cols[0].human_h == 0
    assert [c.x for c in cols] == sorted(c.x for c in cols)


async def test_autonomy_page_shows_idle_days_as_idle(ui: Ui, actors: Actors, test_class: str) -> None:
    await ui.sign_in("reader")
    page = await ui.client.get("/ui/autonomy?days=3")
    assert page.status_code == 200
    assert page.text.count('<g class="day v-under-exercised"') == 3  # nothing was ever open
    await Driver(actors, test_class).open()
    page = await ui.client.get("/ui/autonomy?days=3")
    assert page.text.count('<g class="day v-under-exercised"') == 2
    assert page.text.count('<g class="day v-no-closure"') == 1  # today: open, nothing closed
    assert (await ui.client.get("/ui/autonomy?days=0")).status_code == 422


# --- cards under a filter, timeline labels, the class view, retry -------------------------


async def test_cards_count_what_the_filter_matches_and_bulk_buttons_need_a_match(ui: Ui, actors: Actors, test_class: str) -> None:
    op = await actors("operator")
    await op.register_class("once", max_attempts=1, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0)
    once = Driver(actors, "once")
    for _ in range(3):
        await once.exhausted()
    d = Driver(actors, test_class)
    for _ in range(2):
        await d.open(labels=["mine"])
    await ui.sign_in("operator")

    def tile(page: str, state: str) -> int:
        found = re.search(rf'data-state-count="{state}">\s*<span class="tile-n">(\d+)<', page)
        assert found, page[:500]
        return int(found.group(1))

    everything = (await ui.client.get("/ui/")).text
    assert tile(everything, "exhausted") == 3 and tile(everything, "ready") == 2
    mine = (await ui.client.get("/ui/?label=mine")).text
    assert tile(mine, "exhausted") == 0 and tile(mine, "ready") == 2  # not 3 above an empty lane
    assert 'id="bulk-abandon"' in mine and 'id="bulk-reopen"' not in mine
    nothing = (await ui.client.get("/ui/?label=nobody")).text
    assert sum(tile(nothing, s) for s in ("ready", "exhausted", "abandoned")) == 0
    assert 'id="bulk-abandon"' not in nothing and 'id="bulk-reopen"' not in nothing
    spent = (await ui.client.get("/ui/?class=once")).text
    assert 'id="bulk-reopen"' in spent and tile(spent, "exhausted") == 3
    assert 'id="charts"' in everything and everything.count('class="hour-chart"') == 3


async def test_timeline_labels_never_overlap(actors: Actors, test_class: str) -> None:
    """The axis label of a tick just before "now" used to run into it ("00:53:27now")."""
    k = await actors.reads()
    cid = await Driver(actors, test_class).open()
    campaign = await k.campaign(cid)
    for seconds in range(1, 400, 7):  # "now" at every position relative to the ticks
        tl = campaign_timeline(campaign, transitions=await k.transitions_of(cid), attempts=[],
                               verifications=[], side_effects=[], observations=[],
                               now=campaign.created_at + timedelta(seconds=seconds))
        boxes = tl.axis_labels()
        assert any(text == "now" for _, _, text in boxes)
        for (_, right, a), (left, _, b) in zip(boxes, boxes[1:]):
            assert right <= left, (seconds, a, b, boxes)


async def test_class_view_counts_and_times_open_to_confirm(ui: Ui, actors: Actors, test_class: str) -> None:
    from test_report import _close_one

    hour_ago = now() - timedelta(hours=1)
    for key in ("a", "b"):
        await _close_one(actors, key, hour_ago)  # opened at +1 s, confirmed at +7 s
    await Driver(actors, test_class).open()
    await ui.sign_in("reader")
    page = await ui.client.get(f"/ui/classes/{test_class}")
    assert page.status_code == 200, page.text[:500]
    assert re.search(r'id="confirmed-n">2<', page.text)
    assert 'id="confirm-p50">6s<' in page.text and 'id="confirm-p95">6s<' in page.text
    assert re.search(r'data-state-count="confirmed"><span class="tile-n">2<', page.text)
    assert re.search(r'data-state-count="ready"><span class="tile-n">1<', page.text)
    assert "2 attempts started, 2 accepted, 0 rejected" in page.text
    listing = await ui.client.get("/ui/classes")
    assert f'data-class="{test_class}"' in listing.text
    assert (await ui.client.get("/ui/classes/nope")).status_code == 404


async def test_retry_now_from_the_campaign_page(ui: Ui, actors: Actors, test_class: str) -> None:
    op = await actors("operator")
    await op.register_class("slow", max_attempts=3, lease_seconds=30, backoff_base_s=3600,
                            backoff_jitter=0)
    cid, gen = await Driver(actors, "slow").leased()
    csrf = await ui.sign_in("operator")
    assert 'id="retry-now"' not in (await ui.client.get(f"/ui/campaigns/{cid}")).text
    await (await actors("worker")).fail_attempt(cid, gen, "red", fingerprint=fingerprint(1))
    assert 'id="retry-now"' in (await ui.client.get(f"/ui/campaigns/{cid}")).text
    r = await ui.client.post(f"/ui/campaigns/{cid}/retry", data={"csrf": csrf})
    assert r.status_code == 303
    page = (await ui.client.get(r.headers["location"])).text
    assert "may be claimed now" in page and 'id="retry-now"' not in page
    last = (await (await actors.reads("reader")).events(cid))[-1]
    assert (last.type, last.actor, last.actor_role) == \
        ("operator.retry_now", "http:operator-tok", "operator")
    r = await ui.client.post(f"/ui/campaigns/{cid}/retry", data={"csrf": csrf})
    assert r.status_code == 409 and "error-message" in r.text


# --- the workers view ---------------------------------------------------------------


async def test_the_workers_view_marks_a_process_that_waits_to_start(ui: Ui, actors: Actors) -> None:
    """A live process whose row says why it waits to start (no sandbox ...)
    is marked not ready with the reason; once it works, the mark is gone."""
    from ledger.db.models import ProcessReport
    from ledger.runtime.registry import utcnow

    worker = await actors("worker")
    report = ProcessReport(host="host-a", pid=4242, started_at=utcnow(), identity="worker:host-a:1",
                           service="worker", interval_s=5.0,
                           not_ready="commands cannot be sandboxed: bubblewrap (bwrap) is not installed")
    await worker.report_worker_process(report)
    await ui.sign_in("reader")
    page = (await ui.client.get("/ui/workers")).text
    assert "data-not-ready" in page and "waits to start: commands cannot be sandboxed" in page
    await worker.report_worker_process(report.model_copy(update={"not_ready": None}))
    page = (await ui.client.get("/ui/workers")).text
    assert "data-not-ready" not in page and 'data-status="live"' in page


# --- the limits view ----------------------------------------------------------------


async def test_the_limits_view_and_api_show_and_change_limits_live(ui: Ui, actors: Actors) -> None:
    """Each key against its cap, each bucket, usage; an operator's change over
    HTTP is journaled with the token's name; a bad figure is a problem+json
    422 naming it."""
    op = await actors("operator")
    await op.register_class("test", lease_seconds=30)
    await op.set_class_limits("test", limit_keys=["class"], resources=["model-a"], max_cost=2.0)
    await op.set_bucket("model-a", requests_per_minute=60)
    await op.set_limit("class:test", max_leased=1)
    await (await actors("sensor")).open_campaign("test", "limits-view", "t")
    claim = await (await actors("worker")).claim_campaign("w", ["test"])
    assert claim is not None
    await (await actors("worker")).report_usage(claim.campaign_id, claim.generation, tokens_in=7, cost=0.5, key="k")
    await ui.sign_in("reader")
    page = (await ui.client.get("/ui/limits")).text
    assert 'data-key="class:test" class="at-cap"' in page and "1 / 1" in page
    assert 'data-resource="model-a"' in page and 'data-class="test"' in page
    auth = {"Authorization": f"Bearer {ui.tokens['operator']}"}
    r = await ui.client.put("/limits/keys/class:test", json={"max_leased": 3}, headers=auth)
    assert r.status_code == 200 and r.json()["max_leased"] == 3
    r = await ui.client.put("/limits/keys/class:test", json={"max_leased": -1}, headers=auth)
    assert r.status_code == 422 and "max_leased must be" in r.json()["detail"]
    assert r.headers["content-type"].startswith("application/problem+json")
    r = await ui.client.put("/limits/buckets/model-a", json={"requests_per_minute": 120}, headers=auth)
    assert r.status_code == 200 and r.json()["requests_per_minute"] == 120
    shown = (await ui.client.get("/limits", headers=auth)).json()
    assert [e["actor"] for e in shown["events"]][:2] == ["http:operator-tok"] * 2
    assert shown["usage"][0]["cost"] == 0.5
    r = await ui.client.post(f"/campaigns/{claim.campaign_id}/budget", json={"max_cost": 0.1}, headers=auth)
    assert r.status_code == 422 and "raise it above 0.5" in r.json()["detail"]
    r = await ui.client.post(f"/campaigns/{claim.campaign_id}/budget", json={"max_cost": 9}, headers=auth)
    assert r.status_code == 200 and r.json() == {"campaign_id": claim.campaign_id, "state": "leased"}
