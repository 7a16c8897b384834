"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium) against a real ``ledger serve`` process.

An operator watches a campaign opened by a sensor appear on the board without a
reload, follows it to its page, sees its timeline gain an attempt and its state
change live while a worker (driven through the kernel) claims and records, and
abandons another campaign, which moves on the board. A reader sees the same
pages without any action. Screenshots of the board and a campaign page are
saved to ``artifacts/`` on every run.

Every wait is a condition (``WebDriverWait``), never a sleep. ``.ci/run``
installs the browser; where it is missing the tests skip and say why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import TEST_PREFIX, Actors, stop_process
from drive import fingerprint, new_key, now, sha
from ledger.api import hash_token, new_token

pytestmark = pytest.mark.anyio

CHROMIUM = os.environ.get("LEDGER_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("LEDGER_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
WAIT_S = 20.0

try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover - the test extra brings selenium
    webdriver = None  # type: ignore[assignment]

_missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
if webdriver is None:
    pytest.skip("selenium is not installed (pip install -e '.[test]')", allow_module_level=True)
if _missing:
    pytest.skip(f"no browser for the dashboard tests: {', '.join(_missing)} missing "
                "(apt-get install chromium chromium-driver; .ci/run does)",
                allow_module_level=True)

SENSOR_TOML = """
[sensors.unit-tests]
target = "repo#main"
every_s = 3600
command = ["true"]
class = "test"
"""


@dataclass
class Server:
    """One ``ledger serve`` process and the tokens it accepts."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    tokens: dict[str, str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[Server]:
    """``ledger serve`` on a free port, with a ``ledger.toml`` naming one sensor."""
    yield from serve(db_url, tmp_path, SENSOR_TOML)


def serve(db_url: str, tmp_path: Path, toml: str, **env_extra: str) -> Iterator[Server]:
    """``ledger serve`` on a free port with ``toml`` as its ``ledger.toml``, until closed."""
    tokens = {"operator": new_token(), "reader": new_token()}
    config = tmp_path / "ledger.toml"
    config.write_text(toml)
    port = _free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_API_TOKENS": ",".join(f"{r}-tok:{r}:{hash_token(t)}"
                                         for r, t in tokens.items()),
           "LEDGER_CONFIG": str(config), "LEDGER_LOG_LEVEL": "warning", **env_extra}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "serve", "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    srv = Server(f"http://127.0.0.1:{port}", proc, log, tokens)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"ledger serve exited: {log.read_text()[-2000:]}"
            try:
                if httpx.get(f"{srv.url}/livez", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass  # not listening yet
            assert time.monotonic() < deadline, f"ledger serve never answered: {log.read_text()}"
            time.sleep(0.05)  # polling interval of the condition above
        yield srv
    finally:
        stop_process(proc)


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium with the flags this machine needs (no network but loopback)."""
    profile = tempfile.mkdtemp(prefix="ledger-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1440,1000", "--hide-scrollbars", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except WebDriverException as exc:  # pragma: no cover - a broken install
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"headless Chromium does not start here: {exc.msg}")
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: Any, condition: Any, what: str) -> Any:
    # Live pages swap their sections in place: an element found a moment ago
    # may be replaced before it is read, which only means "look again".
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.05,
                         ignored_exceptions=[StaleElementReferenceException]).until(condition, message=what)


def sign_in(driver: Any, server: Server, role: str) -> None:
    driver.get(f"{server.url}/ui/")
    wait(driver, EC.presence_of_element_located((By.ID, "token")), "the sign-in form")
    driver.find_element(By.ID, "token").send_keys(server.tokens[role])
    driver.find_element(By.ID, "sign-in").click()
    wait(driver, lambda d: d.execute_script("return document.body.dataset.page") == "board",
         "the board after signing in")


def wait_live(driver: Any) -> None:
    wait(driver, lambda d: d.find_element(By.ID, "live").get_attribute("data-state") == "live",
         "the page's live stream to connect")


def mark_page(driver: Any) -> None:
    """Tag this page load; ``same_page`` is then true only until a reload."""
    driver.execute_script("window.__ledgerMark = 'same page';")


def same_page(driver: Any) -> bool:
    return driver.execute_script("return window.__ledgerMark") == "same page"


def screenshot(driver: Any, name: str, *, dark: bool = False) -> Path:
    """A full-page PNG in artifacts/ (the viewport stretched to the page's height)."""
    ARTIFACTS.mkdir(exist_ok=True)
    # Still pictures: no "just arrived" highlight fading in the journal.
    features = [{"name": "prefers-reduced-motion", "value": "reduce"}]
    if dark:
        features.append({"name": "prefers-color-scheme", "value": "dark"})
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": features})
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 1440, "height": min(int(height), 6000), "deviceScaleFactor": 1,
        "mobile": False})
    path = ARTIFACTS / name
    try:
        assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    assert path.stat().st_size > 10_000, "an empty screenshot"
    return path


async def test_operator_watches_the_loop_live_and_abandons(server: Server, browser: Any, actors: Actors,
                                                           test_class: str) -> None:
    d = browser
    sensor, worker = await actors("sensor"), await actors("worker")
    # Lower priority: the worker below claims the sensor's campaign, not this one.
    other = (await sensor.open_campaign(test_class, new_key("other"), "repo#feature",
                                        priority=-1)).campaign_id
    sign_in(d, server, "operator")
    wait_live(d)
    mark_page(d)
    assert not d.find_elements(By.CSS_SELECTOR, '.card[data-campaign]:not([data-campaign="%d"])'
                               % other), "only the other campaign exists yet"

    # A sensor sees red: the campaign appears on the board, in the ready lane, no reload.
    seen = await sensor.record_observation("unit-tests", "tests-pass:repo#main", "repo#main",
                                           "red", now(), class_=test_class)
    cid = seen.campaign_id
    assert seen.effect == "opened" and cid is not None
    card = f'#lane-ready .card[data-campaign="{cid}"]'
    wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, card)), "the new campaign's card")
    assert same_page(d), "the board reloaded instead of updating in place"
    sensor_row = d.find_element(By.CSS_SELECTOR, '#sensors [data-sensor="unit-tests"]').text
    assert "red" in sensor_row and "next: in" in sensor_row, sensor_row
    screenshot(d, "dashboard-board.png")

    # Open it; a worker claims and records an attempt: the page follows live.
    d.find_element(By.CSS_SELECTOR, card).click()
    wait(d, lambda d: d.execute_script("return document.body.dataset.campaign") == str(cid),
         "the campaign page")
    wait_live(d)
    mark_page(d)
    assert d.find_element(By.CSS_SELECTOR, "#campaign-state .badge").text == "ready"
    assert not d.find_elements(By.CSS_SELECTOR, "svg.timeline .tl-attempt")
    claim = await worker.claim_campaign("worker-7", [test_class])
    assert claim is not None and claim.campaign_id == cid
    await worker.append_events(cid, claim.generation, [
        {"type": "attempt.started", "payload": {"attempt_no": 1, "worker": "worker-7"}},
        {"type": "output", "delta": True, "payload": {"text": "running the tests...\n"}}])
    wait(d, lambda d: len(d.find_elements(By.CSS_SELECTOR, "svg.timeline .tl-attempt")) == 1,
         "the timeline to gain the attempt")
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(2),
                                fingerprint=fingerprint(1), log_tail="2 passed\n")
    wait(d, lambda d: d.find_element(By.CSS_SELECTOR, "#campaign-state .badge").text
         == "attempted", "the state to change to attempted")
    assert same_page(d), "the campaign page reloaded instead of updating in place"
    span = d.find_element(By.CSS_SELECTOR, "svg.timeline .tl-attempt")
    assert span.get_attribute("data-kind") == "attempted"
    row = d.find_element(By.CSS_SELECTOR, '#attempts tr[data-attempt="1"]').text
    assert "worker-7" in row and sha(2)[:12] in row, row
    journal = d.find_element(By.ID, "journal").text
    assert "running the tests..." in journal and "record_attempt: leased → attempted" in journal
    screenshot(d, "dashboard-campaign.png")

    # The attempt's log: its log tail and what it journaled.
    d.find_element(By.CSS_SELECTOR, '#attempts tr[data-attempt="1"] a.log-link').click()
    wait(d, EC.presence_of_element_located((By.ID, "log-tail")), "the attempt's log")
    assert "2 passed" in d.find_element(By.ID, "log-tail").text
    assert "running the tests..." in d.find_element(By.ID, "output").text

    # Abandon the other campaign from its page; it moves to the closed lane.
    d.get(f"{server.url}/ui/campaigns/{other}")
    d.find_element(By.CSS_SELECTOR, "#actions input[name=reason]").send_keys("duplicate")
    d.find_element(By.ID, "abandon").click()
    wait(d, EC.alert_is_present(), "the confirmation")
    d.switch_to.alert.accept()
    wait(d, lambda d: d.find_element(By.CSS_SELECTOR, "#campaign-state .badge").text
         == "abandoned", "the abandoned state")
    assert "abandoned" in d.find_element(By.ID, "flash").text
    assert not d.find_elements(By.ID, "abandon"), "a closed campaign offers no abandon"
    events = await (await actors.reads("reader")).events(other)
    last = events[-1]
    assert last.payload["to"] == "abandoned" and last.actor == "http:operator-tok", last
    d.get(f"{server.url}/ui/")
    wait(d, EC.presence_of_element_located(
        (By.CSS_SELECTOR, f'#lane-closed .card[data-campaign="{other}"]')), "it on the board")
    assert not d.find_elements(By.CSS_SELECTOR, f'#lane-ready .card[data-campaign="{other}"]')


async def test_reader_sees_no_actions(server: Server, browser: Any, actors: Actors, test_class: str) -> None:
    d = browser
    sensor = await actors("sensor")
    cid = (await sensor.open_campaign(test_class, new_key(), "repo#main")).campaign_id
    sign_in(d, server, "reader")
    assert d.find_element(By.CSS_SELECTOR, ".who").get_attribute("data-role") == "reader"
    d.get(f"{server.url}/ui/?class={test_class}")
    wait(d, EC.presence_of_element_located((By.ID, "filter-summary")), "the filtered board")
    assert not d.find_elements(By.ID, "bulk-abandon")
    d.get(f"{server.url}/ui/campaigns/{cid}")
    wait(d, EC.presence_of_element_located((By.ID, "campaign-head")), "the campaign page")
    assert not d.find_elements(By.CSS_SELECTOR, "#abandon, #reopen, #actions")


# --- the operator's surface in a real browser ---------------------------------------


async def test_bulk_confirm_acts_only_on_what_the_browser_previewed(server: Server, browser: Any, actors: Actors,
                                                                 test_class: str) -> None:
    """As tests/test_dashboard.py finds it through the page: "Abandon 8" previewed for a label; elsewhere
    one is abandoned and a new campaign opens with the label; the confirmation
    leaves the new campaign alone and shows the difference."""
    d = browser
    sensor, op = await actors("sensor"), await actors("operator")
    batch = [(await sensor.open_campaign(test_class, new_key("batch"), "repo#main",
                                         labels=["nightly"])).campaign_id for _ in range(8)]
    sign_in(d, server, "operator")
    d.get(f"{server.url}/ui/?label=nothing-has-this")
    wait(d, EC.presence_of_element_located((By.ID, "filter-summary")), "the filtered board")
    assert not d.find_elements(By.CSS_SELECTOR, "#bulk-abandon, #bulk-reopen"), \
        "bulk buttons offered with nothing to act on"
    d.get(f"{server.url}/ui/?label=nightly")
    wait(d, EC.presence_of_element_located((By.ID, "bulk-abandon")), "the bulk button")
    assert d.find_element(By.CSS_SELECTOR, '[data-state-count="ready"] .tile-n').text == "8"
    assert d.find_element(By.CSS_SELECTOR, '[data-state-count="abandoned"] .tile-n').text == "0"
    assert not d.find_elements(By.ID, "bulk-reopen"), "nothing matching is exhausted"
    d.find_element(By.ID, "bulk-abandon").click()
    wait(d, EC.presence_of_element_located((By.ID, "confirm")), "the preview")
    assert d.find_element(By.ID, "confirm").text == "Abandon 8"
    assert "exactly the campaigns listed here" in d.find_element(By.ID, "explain").text
    screenshot(d, "dashboard-bulk-preview.png")

    await op.abandon(batch[0], "elsewhere", "cli:bob@host")
    late = (await sensor.open_campaign(test_class, new_key("late"), "repo#main",
                                       labels=["nightly"])).campaign_id
    d.find_element(By.CSS_SELECTOR, ".confirm input[name=reason]").send_keys("cleanup")
    d.find_element(By.ID, "confirm").click()
    wait(d, EC.presence_of_element_located((By.ID, "difference")), "the difference")
    left_alone = d.find_element(By.ID, "not-previewed").find_element(By.XPATH, "following-sibling::*[1]")
    assert left_alone.find_elements(By.CSS_SELECTOR, f'tr[data-campaign="{late}"]')
    gone = d.find_element(By.ID, "no-longer-matching").find_element(By.XPATH, "following-sibling::*[1]")
    assert gone.find_elements(By.CSS_SELECTOR, f'tr[data-campaign="{batch[0]}"]')
    assert d.find_element(By.ID, "confirm").text == "Abandon 1"  # what matches now: the new one
    screenshot(d, "dashboard-bulk-difference.png")
    reader = await actors.reads()
    assert (await reader.campaign(late)).state == "ready"
    assert [(await reader.campaign(c)).state for c in batch] == ["abandoned"] * 8


async def test_attempt_page_follows_the_output_live_and_resumes(server: Server, browser: Any, actors: Actors,
                                                               test_class: str) -> None:
    """The attempt's page shows output as it is journaled, without a
    reload, and a paused stream resumes where it stopped (each line once)."""
    d = browser
    sensor, worker = await actors("sensor"), await actors("worker")
    cid = (await sensor.open_campaign(test_class, new_key(), "repo#main")).campaign_id
    claim = await worker.claim_campaign("worker-9", [test_class])
    assert claim is not None and claim.campaign_id == cid
    await worker.append_events(cid, claim.generation, [
        {"type": "attempt.started", "payload": {"attempt_no": 1}},
        {"type": "output", "delta": True, "payload": {"text": "collecting tests\n"}}])
    sign_in(d, server, "reader")
    d.get(f"{server.url}/ui/campaigns/{cid}/attempts/1")
    wait_live(d)
    mark_page(d)
    assert d.find_element(By.ID, "output").text == "collecting tests"
    await worker.append_events(cid, claim.generation, [
        {"type": "output", "delta": True, "payload": {"text": "test_a PASSED\n"}},
        {"type": "command.exited", "payload": {"code": 0}}])
    wait(d, lambda d: "test_a PASSED" in d.find_element(By.ID, "output").text, "live output")
    wait(d, lambda d: "command.exited" in d.find_element(By.ID, "attempt-journal").text,
         "the live journal")
    # The tab is hidden: the stream closes; output keeps coming; shown again, the
    # page resumes after the last seq it had.
    d.execute_script("Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
                     "document.dispatchEvent(new Event('visibilitychange'));")
    wait(d, lambda d: d.find_element(By.ID, "live").get_attribute("data-state") == "paused",
         "the paused stream")
    await worker.append_events(cid, claim.generation, [
        {"type": "output", "delta": True, "payload": {"text": "test_b PASSED\n"}}])
    d.execute_script("Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
                     "document.dispatchEvent(new Event('visibilitychange'));")
    wait(d, lambda d: "test_b PASSED" in d.find_element(By.ID, "output").text, "resumed output")
    await worker.append_events(cid, claim.generation, [
        {"type": "commit.made", "payload": {"sha": sha(2)}}])
    await worker.record_attempt(cid, claim.generation, base_sha=sha(1), candidate_sha=sha(2),
                                fingerprint=fingerprint(1), log_tail="2 passed\n")
    wait(d, lambda d: d.find_element(By.ID, "outcome").text == "awaiting verdict", "the outcome")
    assert same_page(d), "the attempt page reloaded instead of updating in place"
    assert d.find_element(By.ID, "output").text.splitlines() == [
        "collecting tests", "test_a PASSED", "test_b PASSED"]
    assert "2 passed" in d.find_element(By.ID, "log-tail").text
    screenshot(d, "dashboard-attempt.png")
    # The campaign's journal is wide enough for a whole SHA on one line.
    d.get(f"{server.url}/ui/campaigns/{cid}")
    wait(d, EC.presence_of_element_located((By.ID, "journal")), "the campaign page")
    line = next(e for e in d.find_elements(By.CSS_SELECTOR, "#journal .what")
                if sha(2) in e.text)
    assert d.execute_script("return arguments[0].getClientRects().length", line) == 1
    assert d.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth + 1",
                            line)


async def test_class_view_from_the_board(server: Server, browser: Any, actors: Actors, test_class: str) -> None:
    d = browser
    sensor, worker = await actors("sensor"), await actors("worker")
    ids = [(await sensor.open_campaign(test_class, new_key(), "repo#main")).campaign_id
           for _ in range(3)]
    claim = await worker.claim_campaign("worker-1", [test_class])
    await worker.fail_attempt(claim.campaign_id, claim.generation, "red",
                              fingerprint=fingerprint(1))
    sign_in(d, server, "reader")
    d.find_element(By.CSS_SELECTOR, f'#campaign-list tr[data-campaign="{ids[0]}"] a[href="/ui/classes/{test_class}"]').click()
    wait(d, lambda d: d.execute_script("return document.body.dataset.page") == "class",
         "the class view")
    assert d.find_element(By.ID, "class-name").text == test_class
    assert d.find_element(By.CSS_SELECTOR, '#class-counts [data-state-count="ready"] .tile-n').text == "3"
    assert d.find_element(By.CSS_SELECTOR, "#exhausted .tile-n").text == "0"
    assert d.find_element(By.CSS_SELECTOR, "#oldest-ready .tile-n").text != "–"
    attempts = d.find_element(By.ID, "class-chart-1")
    assert attempts.get_attribute("data-empty") == "false"
    assert len(attempts.find_elements(By.CSS_SELECTOR, "rect.bar")) == 2  # started, ended
    assert d.find_element(By.ID, "confirm-p50").text == "–"  # nothing confirmed yet
    screenshot(d, "dashboard-class.png")
    d.find_element(By.CSS_SELECTOR, 'nav a[href="/ui/classes"]').click()
    wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, f'#class-list tr[data-class="{test_class}"]')),
         "the list of classes")


def _luminance(css_colour: str) -> float:
    """Relative luminance (0 black .. 1 white) of an rgb()/rgba() colour."""
    parts = [float(p) for p in css_colour[css_colour.index("(") + 1:-1].split(",")[:3]]
    r, g, b = (p / 255 for p in parts)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


async def test_dark_mode_focus_and_keyboard_navigation(server: Server, browser: Any, actors: Actors, test_class: str) -> None:
    d = browser
    sensor = await actors("sensor")
    first = (await sensor.open_campaign(test_class, new_key(), "repo#main")).campaign_id
    second = (await sensor.open_campaign(test_class, new_key(), "repo#main")).campaign_id
    sign_in(d, server, "reader")

    def colours() -> tuple[float, float, float]:
        body = d.execute_script("return getComputedStyle(document.body).backgroundColor") or ""
        bg = d.execute_script("return getComputedStyle(document.documentElement).backgroundColor")
        panel = d.execute_script("return getComputedStyle(document.querySelector('.panel')).backgroundColor")
        ink = d.execute_script("return getComputedStyle(document.querySelector('.panel')).color")
        return _luminance(bg if "0, 0, 0, 0" in body or not body else body), _luminance(panel), _luminance(ink)

    light = colours()
    assert light[0] > 0.8 and light[1] > 0.9 and light[2] < 0.2, light
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    d.get(f"{server.url}/ui/")
    wait(d, EC.presence_of_element_located((By.ID, "lanes")), "the board")
    dark = colours()
    assert dark[0] < 0.1 and dark[1] < 0.1 and dark[2] > 0.6, dark
    screenshot_dark = screenshot(d, "dashboard-board-dark.png", dark=True)
    assert screenshot_dark.exists()

    # Keyboard: j moves to the first campaign, j again to the next, with a visible
    # focus ring; Enter opens it.
    d.find_element(By.TAG_NAME, "body").send_keys("j")
    wait(d, lambda d: d.execute_script("return document.activeElement.dataset.campaign") is not None,
         "a focused campaign")
    focused = d.execute_script("return document.activeElement.dataset.campaign")
    outline = d.execute_script("var s = getComputedStyle(document.activeElement);"
                               "return [s.outlineStyle, s.outlineWidth]")
    assert outline[0] != "none" and outline[1] != "0px", outline
    d.switch_to.active_element.send_keys("j")
    wait(d, lambda d: d.execute_script("return document.activeElement.dataset.campaign") not in (None, focused),
         "the next campaign")
    target = d.execute_script("return document.activeElement.dataset.campaign")
    assert {focused, target} == {str(first), str(second)}
    d.switch_to.active_element.send_keys("k")
    wait(d, lambda d: d.execute_script("return document.activeElement.dataset.campaign") == focused,
         "back to the first")
    d.switch_to.active_element.send_keys("/")
    wait(d, lambda d: d.execute_script("return document.activeElement.name") == "q", "the search")
    d.execute_script("document.activeElement.blur()")
    d.find_element(By.TAG_NAME, "body").send_keys("j")
    wait(d, lambda d: d.execute_script("return document.activeElement.dataset.campaign") is not None,
         "a focused campaign")
    opened = d.execute_script("return document.activeElement.dataset.campaign")
    d.switch_to.active_element.send_keys("\n")
    wait(d, lambda d: d.execute_script("return document.body.dataset.campaign") == opened,
         "the campaign opened from the keyboard")
