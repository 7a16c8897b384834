"""Concurrent verifiers never collide on a campaign: no unique violation
(``verification_one_running``) and no campaign verified twice at once."""

from __future__ import annotations

import asyncio

import pytest

from conftest import Actors, Admin
from drive import fingerprint, sha
from ledger import Database, Kernel
from ledger.db.database import Transaction
from ledger.errors import LedgerError

pytestmark = pytest.mark.anyio

CAMPAIGNS, VERIFIERS = 200, 6


async def test_concurrent_verifiers_claim_each_candidate_once_without_errors(db: Database, admin: Admin, actors: Actors, test_class: str) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    for i in range(CAMPAIGNS):
        await sensor.open_campaign(test_class, f"v-{i}", "t")
    claims = await worker.claim_campaigns("w", [test_class], limit=CAMPAIGNS)
    await worker.record_attempts([{"campaign_id": c.campaign_id, "generation": c.generation,
                                   "candidate_sha": sha(c.campaign_id), "fingerprint": fingerprint(c.campaign_id)}
                                  for c in claims])
    claimed: dict[int, list[int]] = {i: [] for i in range(VERIFIERS)}
    errors: list[str] = []

    async def verifier(i: int) -> None:
        # a connection each, every claim its own transaction: as racy as it gets
        conn = await db.connect("verifier")
        kernel = Kernel(Transaction(conn))
        try:
            while True:
                try:
                    claim = await kernel.claim_verification(f"verifier-{i}", lease_s=60)
                except LedgerError as exc:
                    errors.append(f"{type(exc).__name__}: {exc.message}")
                    continue
                if claim is None:
                    return
                claimed[i].append(claim.campaign_id)
        finally:
            await conn.close()

    await asyncio.gather(*(verifier(i) for i in range(VERIFIERS)))
    everything = [cid for ids in claimed.values() for cid in ids]
    assert errors == [], errors[:5]
    assert sorted(everything) == sorted(c.campaign_id for c in claims), "each candidate claimed exactly once"
    assert sum(1 for ids in claimed.values() if ids) > 1, "claims were not spread over the verifiers"
    running = admin.execute("SELECT count(*) AS n FROM ledger.verification WHERE status = 'running'").fetchone()
    assert running["n"] == CAMPAIGNS
