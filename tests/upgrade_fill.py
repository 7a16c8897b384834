"""Fill a database through an earlier release's own API: run by that release's
interpreter (tests/releases.py), never by this checkout's. Uses only what
every supported release's ``Kernel`` has (0.1.0 and 0.2.0 alike).

    python upgrade_fill.py URL ROLE_PREFIX CLASS LIVE_CLASS

CLASS is a registered class nobody serves after the upgrade: its campaigns
are left in every state (ready, leased with progress in the journal,
attempted, rejected and back to ready, exhausted, abandoned, dismissed,
with observations, verifications and a pending side effect). LIVE_CLASS is
served after the upgrade: its one campaign (its sensor opened it) is left
leased by a worker that is gone (the new reaper must hand it back). Prints a JSON object
naming the campaigns by the state they were left in.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime, timedelta, timezone

from ledger import Database, Kernel

URL, PREFIX, CLASS, LIVE_CLASS = sys.argv[1:5]


def fingerprint(n: int) -> str:
    return f"sha256:{n:016x}"


def sha(n: int) -> str:
    return f"{n:040x}"


async def main() -> None:
    db = Database(URL, role_prefix=PREFIX)
    now = datetime.now(timezone.utc)
    left: dict[str, list[int]] = {}
    async with db.session("sensor") as sensor_s, db.session("worker") as worker_s, \
            db.session("verifier") as verifier_s, db.session("operator") as operator_s:
        sensor, worker, verifier, operator = (Kernel(sensor_s), Kernel(worker_s), Kernel(verifier_s),
                                              Kernel(operator_s))

        async def open_(key: str, class_: str = CLASS, priority: int = 100) -> int:
            o = await sensor.open_campaign(class_, key, f"{key}-target", priority=priority,
                                           observation={"status": "red", "seen": key},
                                           labels=["upgrade", key])
            return o.campaign_id

        async def claim(cid: int, who: str = "old-worker", classes: list[str] | None = None):
            claim = await worker.claim_campaign(who, classes or [CLASS])
            assert claim is not None and claim.campaign_id == cid, (claim, cid)
            return claim

        # ready, never claimed: priority 0, where every claim below takes the one just
        # opened at priority 100
        left["ready"] = [await open_("ready-1", priority=0), await open_("ready-2", priority=0)]

        # exhausted: every attempt failed with its own approach
        cid = await open_("exhausted")
        n = 0
        while True:
            c = await claim(cid)
            n += 1
            state = await worker.fail_attempt(cid, c.generation, f"attempt {n} failed",
                                              fingerprint=fingerprint(1000 + n))
            if state == "exhausted":
                break
            await operator.retry_now(cid)
        left["exhausted"] = [cid]

        # abandoned while ready
        cid = await open_("abandoned")
        await operator.abandon(cid, "the upgrade test abandons it", operator="upgrade-test")
        left["abandoned"] = [cid]

        # attempted, then rejected by a verifier (back to ready, its approach refused), then
        # attempted again and left awaiting a verdict
        cid = await open_("attempted")
        c = await claim(cid)
        await worker.append_events(cid, c.generation, [
            {"type": "progress", "payload": {"step": "thinking", "pct": 30}},
            {"type": "output", "payload": {"stream": "stdout", "text": "working on it\n"}}])
        await worker.record_attempt(cid, c.generation, base_sha=sha(1), candidate_sha=sha(2),
                                    fingerprint=fingerprint(2000), log_tail="first try")
        v = await verifier.claim_verification("old-verifier", model_family="none", classes=[CLASS])
        assert v is not None and v.campaign_id == cid, v
        await verifier.reject(v.verification_id, "the tests still fail", evidence={"failed": 1})
        await operator.retry_now(cid)
        c = await claim(cid)
        await worker.record_attempt(cid, c.generation, base_sha=sha(1), candidate_sha=sha(3),
                                    fingerprint=fingerprint(2001), log_tail="second try")
        left["attempted"] = [cid]

        # leased by a worker that is gone, with progress in the journal (both classes)
        cid = await open_("leased")
        c = await claim(cid, "gone-worker")
        await worker.append_events(cid, c.generation, [
            {"type": "progress", "payload": {"step": "halfway", "pct": 50}}])
        left["leased"] = [cid]
        # the live class's one campaign (its sensor opened it), leased by the same gone worker
        live = await worker.claim_campaign("gone-worker", [LIVE_CLASS])
        assert live is not None
        left["live_leased"] = [live.campaign_id]

        # dismissed: the target turned green with nothing in flight
        cid = await open_("dismissed")
        await sensor.record_observation("upgrade-sensor", "dismissed", "dismissed-target", "green",
                                        now - timedelta(seconds=1), finished_at=now,
                                        details={"exit_code": 0}, class_=CLASS)
        left["dismissed"] = [cid]
        # and a red observation of an objective already open (no new campaign)
        await sensor.record_observation("upgrade-sensor", "ready-1", "ready-1-target", "red",
                                        now - timedelta(seconds=1), finished_at=now,
                                        details={"exit_code": 1}, class_=CLASS)

    print(json.dumps(left))


asyncio.run(main())
