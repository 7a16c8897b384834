"""The upgrade drill's load, run by the PREVIOUS release's interpreter (never
imported): it opens campaigns at a steady rate and, as a sensor would,
confirms each promoted one with a green observation -- a role of the old
release that keeps working while the new one migrates the schema under it.
Uses only what every supported release's ``Kernel`` has.

    python upgrade_load.py URL ROLE_PREFIX CLASS COUNT PER_SECOND STOP_FILE

Prints one JSON line per campaign opened ({"opened": id}) and per
confirmation ({"confirmed": id}); stops when STOP_FILE exists (after opening
all COUNT), or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

from ledger import Database, Kernel

URL, PREFIX, CLASS = sys.argv[1:4]
COUNT, PER_SECOND = int(sys.argv[4]), float(sys.argv[5])
STOP = Path(sys.argv[6])


async def main() -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    db = Database(URL, role_prefix=PREFIX)
    opened = 0
    next_open = time.monotonic()
    async with db.session("sensor") as session:
        sensor = Kernel(session)
        while not stopping.is_set() and not (STOP.exists() and opened >= COUNT):
            if opened < COUNT and time.monotonic() >= next_open:
                o = await sensor.open_campaign(CLASS, f"upgrade-{opened}", "repo",
                                               labels=["upgrade-drill"])
                print(json.dumps({"opened": o.campaign_id}), flush=True)
                opened += 1
                next_open += 1.0 / PER_SECOND
            # the promoted ones, read as the administrator (the drill's own look underneath)
            with psycopg.connect(URL) as conn:
                promoted = conn.execute(
                    "SELECT objective_key, id FROM ledger.campaign WHERE class = %s AND state = 'verified' "
                    "AND promoted_at IS NOT NULL AND promoted_at < now() - interval '50 milliseconds'",
                    (CLASS,)).fetchall()
            for key, cid in promoted:
                now = datetime.now(timezone.utc)
                done = await sensor.record_observation("upgrade-load", key, "repo", "green",
                                                       now - timedelta(milliseconds=10), finished_at=now,
                                                       details={"exit_code": 0}, class_=CLASS)
                if done.effect == "confirmed":
                    print(json.dumps({"confirmed": cid}), flush=True)
            await asyncio.sleep(0.1)


asyncio.run(main())
