"""``ledger demo --ui``: the dashboard is served while the loop runs, with an
operator token printed for it, and keeps serving after the loop closed until
Ctrl-C (SIGINT), which ends the demo with the loop's exit code."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import TEST_PREFIX

pytestmark = pytest.mark.slow


def _wait_for(out: Path, pattern: str, proc: subprocess.Popen[bytes],
              timeout_s: float = 90.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(pattern, out.read_text(errors="replace"))
        if found:
            return found
        assert proc.poll() is None, f"the demo exited: {out.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in: {out.read_text()[-3000:]}"
        time.sleep(0.05)  # polling interval of the condition above


def test_demo_ui_serves_the_dashboard_until_interrupted(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "demo.out"
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "NO_COLOR": "1", "COLUMNS": "200"}
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "demo", "--ui"], env=env,
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        found = _wait_for(out, r"(http://127\.0\.0\.1:\d+)/ui/ +\(sign in with the token "
                               r"(ldg_[A-Za-z0-9_-]+)\)", proc)
        base, token = found.group(1), found.group(2)
        with httpx.Client(base_url=base, timeout=10.0) as client:
            assert client.post("/ui/login", data={"token": token}).status_code == 303
            board = client.get("/ui/")
            assert board.status_code == 200 and 'data-role="operator"' in board.text
            _wait_for(out, r"keeps serving; Ctrl-C to stop", proc)
            page = client.get("/ui/campaigns/1")
            assert page.status_code == 200
            assert re.search(r'id="campaign-state"><span class="badge st-confirmed"', page.text)
            assert page.text.count('class="tl-span tl-attempt') == 2  # a wrong fix, then a right one
        assert proc.poll() is None, "still serving after the loop closed"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, out.read_text()[-2000:]
        # Stopped cleanly: no traceback logged on the way out.
        assert "Traceback" not in out.read_text(), out.read_text()[-3000:]
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{base}/livez", timeout=2.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
