"""The dashboard's defects and operator controls (README "Operator controls"), in a real browser
(headless Chromium against a real ``ledger serve``, as
tests/test_dashboard_browser.py): live panels that follow new lines unless
scrolled up, a board that does not re-render while output streams, leases
judged by their class's heartbeat, a narrow layout that does not overflow,
attempt badges that say what happened; pausing and resuming a class from its
page (with its configuration shown), the workers view, bulk actions on picked
rows, the candidate's diff, charts of the last hour and day, a theme toggle
that persists. Every wait is a condition, never a sleep."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

# (after the module above, which skips this one where the browser or selenium is missing)
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from test_dashboard_browser import (  # noqa: F401 (fixtures)
    SENSOR_TOML,
    Server,
    _luminance,
    browser,
    mark_page,
    same_page,
    screenshot,
    serve,
    sign_in,
    wait,
    wait_live,
)

from conftest import Actors, Admin
from drive import Driver, fingerprint, new_key, sha
from ledger.db.models import ProcessReport
from ledger.runtime.registry import held, utcnow

pytestmark = pytest.mark.anyio

CLASS = "test"


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    """``ledger serve`` whose ``ledger.toml`` says how class ``test`` is attempted,
    with keepalives every half second (the quiet-board test counts them)."""
    toml = SENSOR_TOML + f"""
[classes.{CLASS}]
repository = "{tmp_path / 'repo'}"
base_ref = "main"
attempt_command = ["my-agent", "--fix", "{{campaign_file}}"]
attempt_timeout_s = 900
lease_s = 30
heartbeat_s = 5
"""
    yield from serve(db_url, tmp_path, toml, LEDGER_API_KEEPALIVE_S="0.5")


@pytest.fixture
async def test_class(actors: Actors) -> str:
    """Class ``test`` as its ledger.toml registers it: a 30 s lease renewed every
    5 s, acceptance commands, promoted to main."""
    op = await actors("operator")
    await op.register_class(CLASS, max_attempts=3, lease_seconds=30, heartbeat_seconds=5,
                            backoff_base_s=0, backoff_jitter=0,
                            acceptance={"commands": [["pytest", "-q", "tests/"]], "timeout_s": 300},
                            promotion={"ref": "refs/heads/main", "repository": "/srv/git/app.git"})
    return CLASS


def scrolled(d: Any, element_id: str) -> dict[str, float]:
    return d.execute_script(
        "var e = document.getElementById(arguments[0]);"
        "return {top: e.scrollTop, height: e.scrollHeight, client: e.clientHeight};", element_id)


def at_bottom(d: Any, element_id: str) -> bool:
    s = scrolled(d, element_id)
    return s["height"] > s["client"] + 50 and s["height"] - s["top"] - s["client"] < 4


def lines(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"type": "output", "delta": True, "payload": {"text": f"output line {i}\n"}}
            for i in range(start, start + n)]


# --- the defects ----------------------------------------------------------


async def test_live_panels_follow_new_lines_unless_scrolled_up(server: Server, browser: Any, actors: Actors,
                                                            test_class: str) -> None:
    d = browser
    sensor, worker = await actors("sensor"), await actors("worker")
    cid = (await sensor.open_campaign(test_class, new_key(), "repo#main")).campaign_id
    claim = await worker.claim_campaign("worker-5", [test_class])
    assert claim is not None
    gen = claim.generation
    await worker.append_events(cid, gen, [{"type": "attempt.started", "payload": {"attempt_no": 1}}])
    for i in range(0, 120, 40):  # more than the panels hold without scrolling
        await worker.append_events(cid, gen, lines(40, i))
    sign_in(d, server, "reader")

    # The attempt's output starts at its newest line and follows new ones.
    d.get(f"{server.url}/ui/campaigns/{cid}/attempts/1")
    wait_live(d)
    wait(d, lambda d: at_bottom(d, "output"), "the output scrolled to its newest line")
    await worker.append_events(cid, gen, lines(5, 120))
    wait(d, lambda d: "output line 124" in d.find_element(By.ID, "output").text, "new output")
    wait(d, lambda d: at_bottom(d, "output"), "the output following the new lines")
    # Scrolled up, it stays where the operator put it; a button offers the rest.
    d.execute_script("document.getElementById('output').scrollTop = 0;")
    wait(d, lambda d: d.find_element(By.ID, "output").get_attribute("data-following") == "false",
         "the panel to stop following")
    await worker.append_events(cid, gen, lines(5, 125))
    wait(d, lambda d: "output line 129" in d.find_element(By.ID, "output").text, "more output")
    assert scrolled(d, "output")["top"] == 0, "the panel jumped although the operator scrolled up"
    jump = d.find_element(By.CSS_SELECTOR, "#output + .jump")
    assert jump.is_displayed()
    jump.click()
    wait(d, lambda d: at_bottom(d, "output"), "following again after the button")

    # The campaign's journal does the same.
    d.get(f"{server.url}/ui/campaigns/{cid}")
    wait_live(d)
    wait(d, lambda d: at_bottom(d, "journal"), "the journal scrolled to its newest event")
    await worker.append_events(cid, gen, lines(3, 130))
    wait(d, lambda d: "output line 132" in d.find_element(By.ID, "journal").text, "new events")
    wait(d, lambda d: at_bottom(d, "journal"), "the journal following new events")
    d.execute_script("document.getElementById('journal').scrollTop = 0;")
    wait(d, lambda d: d.find_element(By.ID, "journal").get_attribute("data-following") == "false",
         "the journal to stop following")
    await worker.append_events(cid, gen, lines(3, 133))
    wait(d, lambda d: "output line 135" in d.find_element(By.ID, "journal").text, "more events")
    assert scrolled(d, "journal")["top"] == 0


async def _sse_blocks(response: httpx.Response) -> AsyncIterator[list[str]]:
    block: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if block:
                yield block
            block = []
        else:
            block.append(line)


async def test_the_board_does_not_rerender_while_an_attempt_streams_output(
        server: Server, browser: Any, actors: Actors, test_class: str) -> None:
    """The board's stream says "changed" for a step, never for output or a
    lease renewal: streamed output is followed by keepalives only, and the
    open board has not re-rendered once; the attempt's ending then shows."""
    d = browser
    sensor, worker = await actors("sensor"), await actors("worker")
    cid = (await sensor.open_campaign(test_class, new_key(), "repo#main")).campaign_id
    claim = await worker.claim_campaign("worker-3", [test_class])
    assert claim is not None
    sign_in(d, server, "reader")
    wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, f'#lane-leased .card[data-campaign="{cid}"]')),
         "the leased card")
    wait_live(d)
    mark_page(d)
    headers = {"Authorization": f"Bearer {server.tokens['reader']}"}
    changed: list[list[str]] = []
    keepalives = 0
    n = 0
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        async with client.stream("GET", "/ui/board/events", headers=headers) as response:
            assert response.status_code == 200
            blocks = _sse_blocks(response)
            assert "event: hello" in await anext(blocks)
            # A line of output (and a heartbeat) before every block the stream
            # sends, until two keepalives came: each a whole quiet half second.
            while keepalives < 2 and not changed:
                await worker.append_events(cid, claim.generation, lines(1, n))
                await worker.heartbeat(cid, claim.generation)
                n += 1
                block = await anext(blocks)
                if block == [": keepalive"]:
                    keepalives += 1
                elif any(b.startswith("event: changed") for b in block):
                    changed.append(block)
    assert not changed, f"output made the board's stream say it changed: {changed}"
    assert d.execute_script("return document.body.dataset.refreshes || '0'") == "0", \
        "the open board re-rendered while output streamed"
    # A real step does reach it, in place.
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(2),
                                fingerprint=fingerprint(1))
    wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, f'#lane-attempted .card[data-campaign="{cid}"]')),
         "the card to move to attempted")
    assert same_page(d)


async def test_a_short_lease_renewed_on_time_is_not_flagged(server: Server, browser: Any, actors: Actors,
                                                           admin: Admin, test_class: str) -> None:
    d = browser
    d_ = Driver(actors, test_class)
    cid, _ = await d_.leased("worker-healthy")
    sign_in(d, server, "reader")
    # A 30 s lease just renewed (heartbeat every 5 s) ends within 60 s: healthy.
    assert d.find_element(By.CSS_SELECTOR, "#expiring-count .tile-n").text == "0"
    assert "leases at risk" in d.find_element(By.ID, "expiring-count").text
    assert not d.find_elements(By.CSS_SELECTOR, f'#expiring [data-campaign="{cid}"]')
    # Its holder misses two heartbeats: last renewed 11 s ago.
    admin.execute("UPDATE ledger.campaign SET lease_expires_at = statement_timestamp() + interval '19 s' "
                  "WHERE id = %s", (cid,))
    d.get(f"{server.url}/ui/")
    wait(d, lambda d: d.find_element(By.CSS_SELECTOR, "#expiring-count .tile-n").text == "1",
         "the overdue lease counted")
    line = d.find_element(By.CSS_SELECTOR, f'#expiring [data-campaign="{cid}"]').text
    assert "worker-healthy" in line and "renewed 11s ago" in line, line


NARROW_PAGES = ("/ui/", "/ui/campaigns/{cid}", "/ui/campaigns/{cid}/attempts/1", "/ui/classes",
                "/ui/classes/test", "/ui/workers", "/ui/autonomy", "/ui/bulk/abandon?label=wide", "/ui/approvals")


@pytest.mark.parametrize("width", [390, 768])
async def test_the_narrow_layout_does_not_overflow(server: Server, browser: Any, actors: Actors,
                                                   test_class: str, width: int) -> None:
    d = browser
    sensor, worker, reporter = await actors("sensor"), await actors("worker"), await actors("worker")
    wide = "a-long-objective-without-spaces-" * 4
    cid = (await sensor.open_campaign(test_class, wide, "https://git.example.com/org/" + "repo" * 12,
                                      labels=["wide", "nightly"])).campaign_id
    claim = await worker.claim_campaign("worker:" + "h" * 60 + ":1234:abcdef", [test_class])
    assert claim is not None
    await worker.append_events(cid, claim.generation, lines(3) + [
        {"type": "progress", "payload": {"step": "x" * 150}}])
    await reporter.report_worker_process(ProcessReport(
        host="host-" + "n" * 50, pid=1234, started_at=utcnow(), identity="worker:" + "h" * 60 + ":1234:abcdef",
        service="worker", interval_s=5, holds=[held("campaign", cid, utcnow(), attempt=1)]))
    sign_in(d, server, "operator")
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": True})
    try:
        for page in NARROW_PAGES:
            d.get(server.url + page.format(cid=cid))
            wait(d, EC.presence_of_element_located((By.TAG_NAME, "main")), page)
            over = d.execute_script("""
                var w = document.documentElement.clientWidth, out = [];
                document.querySelectorAll('body *').forEach(function (e) {
                  var r = e.getBoundingClientRect();
                  var inside = false;  // within a box that scrolls (a wide table, a log)
                  for (var a = e.parentElement; a && a !== document.body; a = a.parentElement) {
                    var o = getComputedStyle(a).overflowX;
                    if (o === 'auto' || o === 'scroll' || o === 'hidden') { inside = true; break; }
                  }
                  if (r.width && r.right > w + 1 && !inside)
                    out.push(e.tagName + (e.id ? '#' + e.id : '') + '.' + e.className + ' ' + Math.round(r.right));
                });
                return {scroll: document.documentElement.scrollWidth, width: w, out: out.slice(0, 8)};""")
            assert over["scroll"] <= over["width"] and not over["out"], (page, width, over)
        d.get(f"{server.url}/ui/")
        screenshot(d, f"dashboard-board-{width}.png")
    finally:
        d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


async def test_the_attempt_badge_says_what_became_of_the_attempt(server: Server, browser: Any, actors: Actors,
                                                                test_class: str) -> None:
    d_ = Driver(actors, test_class)
    worker, verifier = await actors("worker"), await actors("verifier")
    cid, gen = await d_.attempted(1)
    vclaim = await verifier.claim_verification("verifier-1", classes=[test_class])
    assert vclaim is not None
    await verifier.reject(vclaim.verification_id, "tests fail", {"failed": 1})
    claim = await worker.claim_campaign("worker-2", [test_class])
    assert claim is not None and claim.campaign_id == cid
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(300),
                                fingerprint=fingerprint(2))
    vclaim = await verifier.claim_verification("verifier-1", classes=[test_class])
    assert vclaim is not None
    await verifier.accept(vclaim.verification_id, {"ok": True})
    dispatcher = await actors("dispatcher")
    se = await dispatcher.claim_side_effect("dispatcher-1")
    assert se is not None and se.campaign_id == cid
    await dispatcher.complete_side_effect(se.side_effect_id, se.claim_token, "done",
                                          result={"read_back": se.payload["new"]})
    verified = await d_.verified()  # accepted, its promotion not yet done
    d = browser
    sign_in(d, server, "reader")
    d.get(f"{server.url}/ui/campaigns/{cid}")
    wait(d, EC.presence_of_element_located((By.ID, "attempts")), "the campaign page")
    badges = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#attempts tr[data-attempt] td:nth-child(2) .badge")]
    assert badges == ["rejected", "promoted"], badges
    d.get(f"{server.url}/ui/campaigns/{cid}/attempts/2")
    assert d.find_element(By.ID, "outcome").text == "promoted"
    d.get(f"{server.url}/ui/campaigns/{verified}")
    badges = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#attempts tr[data-attempt] td:nth-child(2) .badge")]
    assert badges == ["accepted"], badges


# --- the operator's controls --------------------------------------------------


async def test_pause_and_resume_a_class_from_its_page(server: Server, browser: Any, actors: Actors,
                                                     test_class: str) -> None:
    d = browser
    worker = await actors("worker")
    d_ = Driver(actors, test_class)
    cid = await d_.open()
    sign_in(d, server, "operator")
    d.get(f"{server.url}/ui/classes/{test_class}")
    wait(d, EC.presence_of_element_located((By.ID, "class-config")), "the class page")
    # Its configuration: what the database judges and what ledger.toml says.
    assert d.find_element(By.ID, "config-promotion").text == "refs/heads/main of /srv/git/app.git"
    assert d.find_element(By.ID, "config-acceptance").text.startswith("pytest -q tests/")
    assert d.find_element(By.ID, "config-command").text.startswith("my-agent --fix '{campaign_file}'")
    assert d.find_element(By.ID, "config-repository").text.endswith("repo at main")
    assert d.find_element(By.ID, "class-heartbeat").text == "every 5s"
    d.find_element(By.CSS_SELECTOR, "#class-actions input[name=reason]").send_keys("agent upgrade")
    d.find_element(By.ID, "pause-class").click()
    wait(d, EC.alert_is_present(), "the confirmation")
    d.switch_to.alert.accept()
    wait(d, EC.presence_of_element_located((By.ID, "class-paused")), "the paused class")
    assert "paused" in d.find_element(By.ID, "flash").text
    note = d.find_element(By.ID, "paused-note").text
    assert "http:operator-tok" in note and "agent upgrade" in note, note
    assert await worker.claim_campaign("w", [test_class]) is None, "a paused class was claimed"
    d.get(f"{server.url}/ui/")
    assert d.find_element(By.CSS_SELECTOR, f'#paused-classes [data-paused-class="{test_class}"]')
    d.get(f"{server.url}/ui/classes/{test_class}")
    d.find_element(By.ID, "resume-class").click()
    wait(d, EC.presence_of_element_located((By.ID, "class-running")), "the resumed class")
    journal = d.find_element(By.ID, "class-journal").text
    assert journal.count("http:operator-tok") == 2 and "agent upgrade" in journal, journal
    claim = await worker.claim_campaign("w", [test_class])
    assert claim is not None and claim.campaign_id == cid
    # A reader sees the state, never the buttons.
    d.delete_all_cookies()
    sign_in(d, server, "reader")
    d.get(f"{server.url}/ui/classes/{test_class}")
    assert not d.find_elements(By.CSS_SELECTOR, "#pause-class, #resume-class")


async def test_the_workers_view_lists_processes_what_they_hold_and_who_is_gone(
        server: Server, browser: Any, actors: Actors, admin: Admin, test_class: str) -> None:
    d_ = Driver(actors, test_class)
    cid, gen = await d_.leased("worker:alpha:101:aaa")
    worker, verifier = await actors("worker"), await actors("verifier")
    since = utcnow()
    await worker.report_worker_process(ProcessReport(
        host="alpha", pid=101, started_at=since, identity="worker:alpha:101:aaa", service="worker",
        interval_s=1, holds=[held("campaign", cid, since, attempt=1, generation=gen)]))
    await verifier.report_verifier_process(ProcessReport(
        host="beta", pid=202, started_at=since, identity="verifier:beta:202:bbb", service="verifier",
        interval_s=1))
    await worker.report_worker_process(ProcessReport(
        host="gamma", pid=303, started_at=since, identity="worker:gamma:303:ccc", service="worker",
        interval_s=1))
    admin.execute("UPDATE ledger.process SET last_seen = statement_timestamp() - interval '1 minute' "
                  "WHERE pid = 303")
    d = browser
    sign_in(d, server, "reader")
    d.find_element(By.CSS_SELECTOR, 'nav a[href="/ui/workers"]').click()
    wait(d, EC.presence_of_element_located((By.ID, "process-list")), "the workers view")
    rows = {r.get_attribute("data-process"): r for r in d.find_elements(By.CSS_SELECTOR, "#process-list tr[data-process]")}
    assert set(rows) == {"worker:alpha:101:aaa", "verifier:beta:202:bbb", "worker:gamma:303:ccc"}
    assert rows["worker:gamma:303:ccc"].get_attribute("data-status") == "gone"
    alpha = rows["worker:alpha:101:aaa"]
    assert alpha.get_attribute("data-status") == "live"
    holds = alpha.find_element(By.CSS_SELECTOR, f'.held[data-kind="campaign"][data-id="{cid}"]')
    assert "attempt 1" in holds.text and "since" in holds.text
    assert "nothing" in rows["verifier:beta:202:bbb"].text
    assert d.find_element(By.ID, "process-counts").text == "2 live · 1 gone · 0 stopped"
    screenshot(d, "dashboard-workers.png")
    # The page refreshes itself: the verifier stops, and it says so.
    mark_page(d)
    await verifier.report_verifier_process(ProcessReport(
        host="beta", pid=202, started_at=since, identity="verifier:beta:202:bbb", service="verifier",
        interval_s=1, stopping=True))
    wait(d, lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-process="verifier:beta:202:bbb"]')
         .get_attribute("data-status") == "stopped", "the refreshed view")
    assert same_page(d)


async def test_bulk_abandon_of_picked_rows_previews_and_confirms_exactly_them(
        server: Server, browser: Any, actors: Actors, test_class: str) -> None:
    d_ = Driver(actors, test_class)
    ids = [await d_.open() for _ in range(5)]
    d = browser
    sign_in(d, server, "operator")
    wait_live(d)
    assert d.find_element(By.ID, "abandon-picked").get_attribute("disabled") is not None
    for cid in (ids[1], ids[3]):
        d.find_element(By.CSS_SELECTOR, f'#campaign-list input[name=id][value="{cid}"]').click()
    assert d.find_element(By.ID, "picked-count").text == "2 picked"
    # A live refresh (a new campaign) keeps what was picked.
    mark_page(d)
    late = await d_.open()
    wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, f'#campaign-list tr[data-campaign="{late}"]')),
         "the refreshed list")
    assert same_page(d)
    picked = [e.get_attribute("value") for e in d.find_elements(By.CSS_SELECTOR, "#campaign-list input[name=id]:checked")]
    assert sorted(picked) == sorted([str(ids[1]), str(ids[3])])
    d.find_element(By.ID, "abandon-picked").click()
    wait(d, EC.presence_of_element_located((By.ID, "confirm")), "the preview")
    assert d.find_element(By.ID, "confirm").text == "Abandon 2"
    previewed = sorted(e.get_attribute("data-campaign") for e in d.find_elements(By.CSS_SELECTOR, "#preview tr[data-campaign]"))
    assert previewed == sorted([str(ids[1]), str(ids[3])])
    await (await actors("operator")).abandon(ids[3], "elsewhere", "cli:bob@host")
    d.find_element(By.CSS_SELECTOR, ".confirm input[name=reason]").send_keys("picked by hand")
    d.find_element(By.ID, "confirm").click()
    wait(d, EC.presence_of_element_located((By.ID, "difference")), "what changed since the preview")
    gone = d.find_element(By.ID, "no-longer-matching").find_element(By.XPATH, "following-sibling::*[1]")
    assert gone.find_elements(By.CSS_SELECTOR, f'tr[data-campaign="{ids[3]}"]')
    reads = await actors.reads()
    assert [(await reads.campaign(c)).state for c in ids + [late]] == [
        "ready", "abandoned", "ready", "abandoned", "ready", "ready"]
    events = await reads.events(ids[1])
    assert events[-1].payload["reason"] == "picked by hand" and events[-1].actor == "http:operator-tok"


async def test_the_candidates_diff_is_shown_escaped_and_capped(server: Server, browser: Any, actors: Actors,
                                                              admin: Admin, test_class: str) -> None:
    d_ = Driver(actors, test_class)
    cid, _ = await d_.attempted()
    big, _ = await d_.attempted(2)
    diff = ("diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n"
            " import os\n-<b>old</b>\n+<script>window.__pwned = 1</script>\n")
    admin.execute("UPDATE ledger.attempt SET diff = %s WHERE campaign_id = %s", (diff.encode(), cid))
    admin.execute("UPDATE ledger.attempt SET diff = %s WHERE campaign_id = %s",
                  (("+x\n" * 200_000).encode(), big))
    d = browser
    sign_in(d, server, "reader")
    d.get(f"{server.url}/ui/campaigns/{cid}")
    d.find_element(By.CSS_SELECTOR, '#attempts tr[data-attempt="1"] a.diff-link').click()
    wait(d, EC.presence_of_element_located((By.ID, "diff-text")), "the diff")
    text = d.find_element(By.ID, "diff-text").text
    assert "+<script>window.__pwned = 1</script>" in text and "-<b>old</b>" in text
    assert d.execute_script("return window.__pwned") is None
    assert not d.find_elements(By.CSS_SELECTOR, "#diff-text b, #diff-text script")
    kinds = [e.get_attribute("class") for e in d.find_elements(By.CSS_SELECTOR, "#diff-text .dl")]
    assert kinds[:4] == ["dl dl-file"] * 3 + ["dl dl-hunk"] and kinds[-2:] == ["dl dl-del", "dl dl-add"]
    d.get(f"{server.url}/ui/campaigns/{big}/attempts/1")
    shown = d.find_element(By.ID, "diff-text")
    assert shown.get_attribute("data-truncated") == "true" and shown.get_attribute("data-bytes") == "600000"
    assert "600000 bytes" in d.find_element(By.ID, "diff-truncated").text
    assert len(d.find_elements(By.CSS_SELECTOR, "#diff-text .dl")) < 100_000


async def test_charts_of_the_last_hour_and_the_last_day(server: Server, browser: Any, actors: Actors,
                                                       test_class: str) -> None:
    await Driver(actors, test_class).attempted()
    d = browser
    sign_in(d, server, "reader")
    charts = d.find_element(By.ID, "charts")
    assert (charts.get_attribute("data-window"), charts.get_attribute("data-buckets")) == ("24h", "96")
    assert "per 15 minutes" in charts.text
    d.find_element(By.CSS_SELECTOR, '#windows a[data-window="1h"]').click()
    wait(d, lambda d: d.find_element(By.ID, "charts").get_attribute("data-window") == "1h", "the hour")
    charts = d.find_element(By.ID, "charts")
    assert charts.get_attribute("data-buckets") == "60" and "per 1 minute" in charts.text
    opened = d.find_element(By.ID, "chart-1")
    assert opened.get_attribute("data-empty") == "false"
    assert len(opened.find_elements(By.CSS_SELECTOR, "rect.bar.s-opened")) == 1
    labels = [t.text for t in opened.find_elements(By.CSS_SELECTOR, "text.date")]
    assert labels and all(len(t) == 5 and t[2] == ":" for t in labels), labels
    d.get(f"{server.url}/ui/classes/{test_class}?window=1h")
    assert d.find_element(By.ID, "charts").get_attribute("data-buckets") == "60"
    assert len(d.find_element(By.ID, "class-chart-1").find_elements(By.CSS_SELECTOR, "rect.bar")) == 2
    d.get(f"{server.url}/ui/?window=7d")
    assert "window" in d.find_element(By.TAG_NAME, "main").text


async def test_the_theme_toggle_persists(server: Server, browser: Any, actors: Actors, test_class: str) -> None:
    d = browser
    sign_in(d, server, "reader")

    def background() -> float:
        return _luminance(d.execute_script("return getComputedStyle(document.querySelector('.panel')).backgroundColor"))

    assert background() > 0.9  # the browser prefers light
    toggle = d.find_element(By.ID, "theme-toggle")
    assert toggle.text == "theme: auto"
    mark_page(d)
    toggle.click()
    wait(d, lambda d: d.find_element(By.ID, "theme-toggle").text == "theme: dark", "the dark theme")
    assert same_page(d), "the toggle reloaded the page"
    assert background() < 0.1
    d.get(f"{server.url}/ui/classes")  # another page, rendered by the server: still dark
    assert d.execute_script("return document.documentElement.dataset.theme") == "dark"
    assert background() < 0.1
    screenshot(d, "dashboard-classes-dark-toggle.png")
    # Light, although the browser now prefers dark; then back to auto (dark).
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    d.find_element(By.ID, "theme-toggle").click()
    wait(d, lambda d: d.find_element(By.ID, "theme-toggle").text == "theme: light", "light")
    assert background() > 0.9
    d.refresh()
    assert background() > 0.9 and d.find_element(By.ID, "theme-toggle").text == "theme: light"
    d.find_element(By.ID, "theme-toggle").click()
    wait(d, lambda d: d.find_element(By.ID, "theme-toggle").text == "theme: auto", "auto")
    assert background() < 0.1
    d.refresh()
    assert d.execute_script("return document.documentElement.dataset.theme") is None
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
