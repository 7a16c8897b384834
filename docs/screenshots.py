"""Screenshots of every dashboard page, for a reviewer: ``python docs/screenshots.py``.

It makes a scratch database on the server of ``--database-url`` (default
``LEDGER_DATABASE_URL``, else the local PostgreSQL), fills it with campaigns
in every state through the kernel (as the real roles would), starts
``ledger serve`` against it, drives Debian's headless Chromium (selenium and
chromedriver, as the browser tests do) to each page, light and dark, and
writes PNGs to ``artifacts/screenshots/`` (ignored by git). The database is
dropped at the end. Nothing here is a test: look at the pictures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

from ledger import Database, Kernel
from ledger.api import hash_token, new_token
from ledger.db import migrations
from ledger.db.embedded import create_database, drop_database

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "ledgershots_"
WIDTH = 1440


async def seed(url: str) -> dict[str, int]:
    """Campaigns in every state, with attempts, verdicts, output and a backoff."""
    db = Database(url, role_prefix=PREFIX)
    sessions = {r: await db.session(r, max_size=2).open()
                for r in ("sensor", "worker", "verifier", "operator", "reader")}
    k = {r: Kernel(s) for r, s in sessions.items()}
    try:
        await k["operator"].register_class("tests-pass", max_attempts=3, lease_seconds=600,
                                           backoff_base_s=900, backoff_jitter=0)
        await k["operator"].register_class("lint", max_attempts=1, lease_seconds=600,
                                           backoff_base_s=0, backoff_jitter=0)
        now = datetime.now(timezone.utc)
        ids = []
        for i in range(9):
            seen = await k["sensor"].record_observation(
                "ci-watch", f"tests-pass:repo-{i}#main", f"repo-{i}#main", "red",
                now - timedelta(seconds=5), class_="tests-pass",
                labels=["nightly"] if i % 2 else ["flaky"])
            ids.append(seen.campaign_id)
        w, v = k["worker"], k["verifier"]
        # Leased with live output; attempted; verified; failed and waiting out a backoff.
        running = await w.claim_campaign("worker-a", ["tests-pass"])
        await w.append_events(running.campaign_id, running.generation, [
            {"type": "attempt.started", "payload": {"attempt_no": 1, "worker": "worker-a"}},
            {"type": "output", "delta": True,
             "payload": {"text": "collecting 42 items\ntest_api.py ........ [ 20%]\n"}}])
        attempted = await w.claim_campaign("worker-b", ["tests-pass"])
        await w.record_attempt(attempted.campaign_id, attempted.generation,
                               base_sha="a" * 40, candidate_sha="b" * 40,
                               fingerprint="sha256:" + "1" * 64, log_tail="42 passed\n")
        verified = await w.claim_campaign("worker-c", ["tests-pass"])
        await w.record_attempt(verified.campaign_id, verified.generation, base_sha="c" * 40,
                               candidate_sha="d" * 40, fingerprint="sha256:" + "2" * 64)
        check = await v.claim_verification("verifier-1", classes=["tests-pass"])
        if check is not None:
            await v.accept(check.verification_id, {"passed": 42})
        waiting = await w.claim_campaign("worker-d", ["tests-pass"])
        await w.fail_attempt(waiting.campaign_id, waiting.generation, "3 tests failed",
                             fingerprint="sha256:" + "3" * 64)
        # Exhausted and abandoned ones.
        lint = await k["sensor"].open_campaign("lint", "lint:repo-x#main", "repo-x#main")
        spent = await w.claim_campaign("worker-e", ["lint"])
        await w.fail_attempt(spent.campaign_id, spent.generation, "ruff: 12 errors")
        await k["operator"].abandon(ids[-1], "duplicate of another campaign", "cli:alice@ops")
        return {"running": running.campaign_id, "attempted": attempted.campaign_id,
                "waiting": waiting.campaign_id, "exhausted": lint.campaign_id}
    finally:
        for s in sessions.values():
            await s.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shoot(base: str, tokens: dict[str, str], ids: dict[str, int], out: Path,
          chromium: str, chromedriver: str) -> list[Path]:
    """Sign in and save a full-page PNG of every page, light and dark."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", f"--window-size={WIDTH},1000", "--hide-scrollbars",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='ledger-shots-')}"):
        options.add_argument(flag)
    d = webdriver.Chrome(service=Service(chromedriver), options=options)
    pages = {
        "login": "/ui/login", "board": "/ui/", "board-filtered": "/ui/?label=nightly",
        "campaign": f"/ui/campaigns/{ids['attempted']}",
        "campaign-waiting": f"/ui/campaigns/{ids['waiting']}",
        "attempt-live": f"/ui/campaigns/{ids['running']}/attempts/1",
        "bulk-preview": "/ui/bulk/abandon?label=flaky", "classes": "/ui/classes",
        "class": "/ui/classes/tests-pass", "autonomy": "/ui/autonomy",
        "problem": "/problems/illegal-transition", "docs": "/docs",
    }
    saved = []
    try:
        d.get(base + "/ui/login")
        d.find_element(By.ID, "token").send_keys(tokens["operator"])
        d.find_element(By.ID, "sign-in").click()
        WebDriverWait(d, 20).until(lambda d: d.execute_script("return document.body.dataset.page") == "board")
        for scheme in ("light", "dark"):
            for name, path in pages.items():
                if name == "login":
                    continue  # signed in: shown once, below
                d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [
                    {"name": "prefers-color-scheme", "value": scheme},
                    {"name": "prefers-reduced-motion", "value": "reduce"}]})
                d.get(base + path)
                WebDriverWait(d, 20).until(lambda d: d.execute_script("return document.readyState") == "complete")
                if name == "docs":
                    WebDriverWait(d, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock"))
                height = d.execute_script("return document.documentElement.scrollHeight")
                d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                    "width": WIDTH, "height": min(int(height), 6000), "deviceScaleFactor": 1,
                    "mobile": False})
                path_out = out / f"{name}-{scheme}.png"
                d.save_screenshot(str(path_out))
                d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
                saved.append(path_out)
        d.delete_all_cookies()
        d.get(base + "/ui/login")
        d.save_screenshot(str(out / "login-light.png"))
        saved.append(out / "login-light.png")
    finally:
        d.quit()
    return saved


def main() -> int:
    """Make the screenshots; print where they are."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get(
        "LEDGER_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="an administrator's URL of the server to make the scratch database on")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "screenshots")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"ledger_screens_{uuid.uuid4().hex[:8]}"
    url = create_database(args.database_url, name)
    server = None
    try:
        print(f"seeding {name} ...", flush=True)
        migrations.upgrade(url, PREFIX)
        ids = asyncio.run(seed(url))
        tokens = {"operator": new_token(), "reader": new_token()}
        port = _free_port()
        env = {**os.environ, "LEDGER_DATABASE_URL": url, "LEDGER_ROLE_PREFIX": PREFIX,
               "LEDGER_API_TOKENS": ",".join(f"{r}-tok:{r}:{hash_token(t)}"
                                             for r, t in tokens.items()),
               "LEDGER_LOG_LEVEL": "warning"}
        server = subprocess.Popen([sys.executable, "-m", "ledger", "serve", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, stdout=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/livez", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("ledger serve did not start")
            time.sleep(0.05)  # polling interval of the condition above
        saved = shoot(base, tokens, ids, args.out, args.chromium, args.chromedriver)
        print(f"{len(saved)} screenshots in {args.out}")
        return 0
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        drop_database(args.database_url, name)


if __name__ == "__main__":
    sys.exit(main())
