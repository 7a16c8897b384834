"""Usage reported through the attempt protocol (``LEDGER_USAGE`` lines,
``ledger.protocol.UsageReport``): a real attempt prints well-formed,
malformed and lying reports; the good ones are summed per attempt and
campaign, each bad one is refused with its reason in the journal, and the
attempt itself loses nothing (its candidate is recorded)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_protocol import make_repository

from conftest import Actors, Admin
from ledger.config import parse_config
from ledger.roles.attempt import AttemptRun
from ledger.roles.usage import parse_usage

pytestmark = [pytest.mark.anyio, pytest.mark.cells]

CLASS = "usage"

SCRIPT = r'''
import sys
print("LEDGER_USAGE {\"tokens_in\": 100, \"tokens_out\": 10, \"requests\": 1, \"cost\": 0.5}", flush=True)
print("working...", flush=True)
print("LEDGER_USAGE {\"tokens_in\": -5}", flush=True)
print("LEDGER_USAGE this is not json", flush=True)
print("LEDGER_USAGE {\"tokens_in\": \"9\"}", file=sys.stderr, flush=True)
print("LEDGER_USAGE {\"cost\": 1e300}", flush=True)
print("LEDGER_USAGE {\"tokens_in\": 1, \"bribe\": 1}", flush=True)
print("LEDGER_USAGE [1, 2]", flush=True)
with open("fixed.txt", "w") as f:
    f.write("fixed\n")
sys.stdout.write("LEDGER_USAGE {\"tokens_in\": 50, \"cost\": 0.25}")  # its last line, unterminated
'''


def test_a_usage_line_is_the_model_or_refused_with_a_reason() -> None:
    assert parse_usage('LEDGER_USAGE {"tokens_in": 3, "cost": 2}').cost == 2.0
    for line, said in [('LEDGER_USAGE {"tokens_out": -1}', "tokens_out"),
                       ("LEDGER_USAGE {", "one JSON object"),
                       ('LEDGER_USAGE {"requests": 1.5}', "requests"),
                       ('LEDGER_USAGE {"cost": "free"}', "cost"),
                       ('LEDGER_USAGE {"cost": true}', "cost"),
                       ('LEDGER_USAGE {"tokens_in": 10000000000}', "tokens_in"),
                       ("LEDGER_USAGE " + " " * 5000 + "{}", "at most")]:
        with pytest.raises(ValueError, match=said):
            parse_usage(line)


async def test_an_attempt_reports_its_usage_and_lies_are_refused(tmp_path: Path, actors: Actors,
                                                                 admin: Admin) -> None:
    repo = make_repository(tmp_path)
    script = tmp_path / "attempt.py"
    script.write_text(SCRIPT)
    config = parse_config({"classes": {CLASS: {
        "repository": str(repo), "attempt_command": [sys.executable, str(script)],
        "attempt_timeout_s": 60, "lease_s": 30, "heartbeat_s": 5, "max_cost": 10}}})
    cls = config.classes[CLASS]
    operator = await actors("operator")
    await operator.register_class(CLASS, **cls.registration())
    await config.sync_limits(operator, operator="test")
    cid = (await (await actors("sensor")).open_campaign(CLASS, "usage-check", "repo#main")).campaign_id
    worker = await actors("worker")
    claim = await worker.claim_campaign("worker-usage", [CLASS])
    assert claim is not None
    run = AttemptRun(worker, claim, cls, identity="worker-usage", data_dir=tmp_path / "data")
    assert await run.run() == "attempted"  # nothing of the attempt was lost
    usage = admin.execute("SELECT tokens_in, tokens_out, requests, cost, reports FROM ledger.attempt_usage "
                          "WHERE campaign_id = %s", (cid,)).fetchone()
    assert usage is not None
    assert dict(usage) == {"tokens_in": 150, "tokens_out": 10, "requests": 1, "cost": 0.75, "reports": 2}
    campaign = await (await actors.reads()).campaign(cid)
    assert campaign.cost_spent == 0.75 and campaign.max_cost == 10
    events = await (await actors.reads()).events(cid)
    refused = [e.payload["reason"] for e in events if e.type == "usage.refused"]
    assert len(refused) == 6, refused
    assert any("tokens_in" in r and "greater than or equal" in r for r in refused)
    assert any("one JSON object" in r for r in refused)
    assert any("bribe" in r for r in refused)
    assert any("cost" in r for r in refused)
    reported = [e.payload for e in events if e.type == "usage.reported"]
    assert [r["cost"] for r in reported] == [0.5, 0.25]
    assert (run.usage.reported, run.usage.refused) == (2, 6)
