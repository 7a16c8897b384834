"""Visibility of waiting (README "Faults that are not the attempt's own"): a campaign held back by what is not its
attempt's own says so everywhere an operator looks -- the gauge
``ledger_campaigns_waiting{class, reason}``, ``/readyz`` (degraded while
campaigns wait on a system fault, with counts only: the probe is
unauthenticated), ``ledger show`` and the dashboard's campaign page (with the
reason)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from test_dashboard import Ui, ui  # noqa: F401  (the fixture)

from conftest import TEST_PREFIX, Actors
from drive import Driver
from ledger import Database

pytestmark = pytest.mark.anyio

REASON = "could not publish the candidate: cannot reach git://git.internal:9418/app.git"


async def two_waiting(actors: Actors) -> tuple[int, int]:
    """A campaign released on a system fault (class ``test``), and one whose
    promotion waits on its target (class ``promoting``)."""
    op = await actors("operator")
    await op.register_class("test", max_attempts=3, lease_seconds=30, backoff_base_s=0, backoff_jitter=0)
    await op.register_class("promoting", max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0, promotion={"ref": "refs/heads/main", "repository": "/r"})
    faulted, generation = await Driver(actors, "test").leased()
    await (await actors("worker")).release_attempt(faulted, generation, REASON)
    blocked = await Driver(actors, "promoting").verified()
    dispatcher = await actors("dispatcher")
    claim = await dispatcher.claim_side_effect("dispatcher-1")
    assert claim is not None and claim.campaign_id == blocked
    await dispatcher.complete_side_effect(claim.side_effect_id, claim.claim_token, "retry",
                                          result={"waiting_on": "target"},
                                          error="refs/heads/main is checked out with changes",
                                          retry_after_s=60)
    return faulted, blocked


def gauge(text: str, cls: str, reason: str) -> float:
    line = f'ledger_campaigns_waiting{{class="{cls}",reason="{reason}"}} '
    found = [ln for ln in text.splitlines() if ln.startswith(line)]
    assert len(found) == 1, text
    return float(found[0].split()[-1])


async def test_waiting_is_counted_reported_and_explained(db: Database, actors: Actors, ui: Ui) -> None:
    faulted, blocked = await two_waiting(actors)
    reader = {"Authorization": f"Bearer {ui.tokens['reader']}"}

    metrics = (await ui.client.get("/metrics", headers=reader)).text
    assert gauge(metrics, "test", "system_fault") == 1 and gauge(metrics, "test", "target") == 0
    assert gauge(metrics, "promoting", "target") == 1 and gauge(metrics, "promoting", "system_fault") == 0

    ready = await ui.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text
    [why] = [r for r in ready.json()["degraded"] if "system fault" in r]
    assert why.startswith("1 campaign(s) wait on a system fault")
    assert "git.internal" not in ready.text  # the reason, naming hosts, is not for an anonymous probe

    await ui.sign_in("reader")
    page = (await ui.client.get(f"/ui/campaigns/{faulted}")).text
    assert 'data-waiting-on="system_fault"' in page and "waiting on a system fault" in page
    assert "git.internal:9418" in page and "nothing charged" in page
    page = (await ui.client.get(f"/ui/campaigns/{blocked}")).text
    assert "waiting on its target" in page and "checked out with changes" in page

    env = {**os.environ, "LEDGER_DATABASE_URL": db.url, "LEDGER_ROLE_PREFIX": TEST_PREFIX, "NO_COLOR": "1",
           "COLUMNS": "300"}
    shown = subprocess.run([sys.executable, "-m", "ledger", "show", str(faulted)], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    [line] = [ln for ln in shown.stdout.splitlines() if ln.startswith("waiting on")]
    assert "a system fault" in line and REASON in line and "1 in a row, nothing charged" in line


async def test_a_ready_server_with_nothing_waiting_is_not_degraded_by_a_target(actors: Actors, ui: Ui) -> None:
    """Waiting on a target (someone's dirty checkout) is the target's state,
    not the system's: counted, shown, but /readyz stays ready."""
    op = await actors("operator")
    await op.register_class("promoting", max_attempts=3, lease_seconds=30, backoff_base_s=0,
                            backoff_jitter=0, promotion={"ref": "refs/heads/main", "repository": "/r"})
    await Driver(actors, "promoting").verified()
    dispatcher = await actors("dispatcher")
    claim = await dispatcher.claim_side_effect("dispatcher-1")
    assert claim is not None
    await dispatcher.complete_side_effect(claim.side_effect_id, claim.claim_token, "retry",
                                          result={"waiting_on": "target"}, error="dirty", retry_after_s=60)
    ready: Any = (await ui.client.get("/readyz")).json()
    assert ready["status"] == "ready", ready
