"""Drive campaigns into a given state through the real API (test helper)."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
from pathlib import Path

from conftest import Actors
from ledger import Database, Kernel, Reads
from ledger.db.models import Claim

_ids = itertools.count(1)
PROMOTING_CLASS = "promoting"
#: A promoting class whose every candidate a person approves first.
APPROVING_CLASS = "approving"


def new_key(prefix: str = "objective") -> str:
    """A fresh objective key."""
    return f"{prefix}-{next(_ids)}"


def fingerprint(n: int) -> str:
    """A valid, distinct approach fingerprint."""
    return f"sha256:{n:016x}"


def sha(n: int) -> str:
    """A valid, distinct commit id."""
    return f"{n:040x}"


def now() -> datetime:
    return datetime.now(timezone.utc)


class Driver:
    """Kernels for every role, and steps that move a campaign along."""

    def __init__(self, actors: Actors, class_: str):
        self.actors = actors
        self.class_ = class_

    async def k(self, actor: str) -> Kernel:
        return await self.actors(actor)

    async def reads(self, actor: str = "reader") -> Reads:
        return await self.actors.reads(actor)

    async def open(self, key: str | None = None, **kw) -> int:
        sensor = await self.k("sensor")
        opened = await sensor.open_campaign(self.class_, key or new_key(), "target-1", **kw)
        return opened.campaign_id

    async def leased(self, worker: str = "worker-1") -> tuple[int, int]:
        cid = await self.open()
        claim = await (await self.k("worker")).claim_campaign(worker, [self.class_])
        assert claim is not None and claim.campaign_id == cid
        return cid, claim.generation

    async def attempted(self, n: int = 1) -> tuple[int, int]:
        cid, gen = await self.leased()
        await (await self.k("worker")).record_attempt(
            cid, gen, base_sha=sha(1), candidate_sha=sha(100 + n), fingerprint=fingerprint(n))
        return cid, gen

    async def verifying(self) -> tuple[int, int]:
        """An attempted campaign and a verification claimed on it."""
        cid, _ = await self.attempted()
        claim = await (await self.k("verifier")).claim_verification("verifier-1", classes=[self.class_])
        assert claim is not None and claim.campaign_id == cid
        return cid, claim.verification_id

    async def verified(self) -> int:
        cid, vid = await self.verifying()
        await (await self.k("verifier")).accept(vid, {"ok": True})
        return cid

    async def promoted(self) -> int:
        """Verified, and its promotion intent done (needs a promoting class)."""
        cid = await self.verified()
        dispatcher = await self.k("dispatcher")
        claim = await dispatcher.claim_side_effect("dispatcher-1")
        assert claim is not None and claim.campaign_id == cid
        await dispatcher.complete_side_effect(claim.side_effect_id, claim.claim_token, "done",
                                              result={"read_back": claim.payload["new"]})
        return cid

    async def exhausted(self) -> int:
        """Needs a class with max_attempts=1."""
        cid, gen = await self.leased()
        state = await (await self.k("worker")).fail_attempt(cid, gen, "boom")
        assert state == "exhausted"
        return cid


async def wait_for_lock_waiters(db: Database, application: str, count: int = 1, timeout_s: float = 10.0) -> None:
    """Wait until ``count`` backends of ``application`` are blocked on a lock."""
    import asyncio

    conn = await db.connect(None)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + scaled(timeout_s)
        while loop.time() < deadline:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = %s AND wait_event_type = 'Lock'", (application,))
            if (await cur.fetchone())["n"] >= count:
                return
            await asyncio.sleep(0.005)  # polling interval of the condition, not a synchronisation
        raise AssertionError(f"{count} backend(s) of {application} never blocked on a lock")
    finally:
        await conn.close()


def load_factor() -> float:
    """How much slower than a quiet machine this one is now: the 1-minute load
    average per core, at least 1. Deadlines of tests scale by it, so that a
    condition that takes 10 s on a quiet machine is not declared lost at a load
    of 10 on 2 cores (where everything takes five times as long)."""
    import os

    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def scaled(seconds: float) -> float:
    """A deadline of ``seconds`` on a quiet machine, scaled to the load now."""
    return seconds * load_factor()


async def eventually(check, *, timeout: float = 15.0, interval: float = 0.05, what: str = "a condition") -> None:
    """Await until ``check()`` (sync or async) is true: waiting on a condition,
    polled, instead of sleeping for a guessed time. ``timeout`` is what a quiet
    machine needs; on a loaded one the deadline grows with the load (and is
    looked at again while waiting, as the load changes)."""
    import asyncio
    import inspect

    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        waited = loop.time() - start
        if waited > scaled(timeout):
            raise AssertionError(f"timed out after {waited:.0f}s ({timeout}s on a quiet machine, "
                                 f"load factor {load_factor():.1f}) waiting for {what}")
        await asyncio.sleep(interval)


async def record_candidate(kernel: Kernel, claim: Claim, *, repo: Path, base: str, sha_: str,
                           acceptance: dict, verifier: str = "command", worker: str = "worker-1",
                           repository: str | None = None) -> tuple[int, str]:
    """What the worker does with a candidate, without the attempt: publish it
    under its ledger ref, and record it with its bundle and diff in the
    database. Returns the attempt number and the bundle digest."""
    import subprocess

    from ledger.git import bundle as bundles
    from ledger.git import repository as repositories

    ref = f"refs/heads/ledger/{claim.campaign_id}/{claim.attempt_no}"
    subprocess.run(["git", "-C", str(repo), "update-ref", ref, sha_], check=True)
    diff = repositories.diff(repo, base, sha_)
    frozen = bundles.Bundle(
        campaign_id=claim.campaign_id, attempt_no=claim.attempt_no, generation=claim.generation,
        worker=worker, **{"class": claim.class_}, objective_key=claim.objective_key,
        target=claim.target, repository=repository or str(repo), base_ref="main", base_sha=base,
        candidate_sha=sha_, fingerprint=bundles.fingerprint_of(diff), acceptance=acceptance,
        verifier=verifier, created_at=now())
    digest = bundles.digest_of(frozen, diff)
    n = await kernel.record_attempt(
        claim.campaign_id, claim.generation, base_sha=base, candidate_sha=sha_,
        fingerprint=frozen.fingerprint, bundle=frozen.model_dump(mode="json", by_alias=True),
        bundle_digest=digest, diff=diff, candidate_ref=ref)
    return n, digest


def bubblewrap_hiding() -> tuple[list[str], str | None]:
    """The argv prefix that runs a command with bubblewrap hidden from it (a
    private mount namespace with /dev/null bound over ``bwrap``: what a host
    without it looks like), and why that cannot be done here (``None``: it
    can; it needs root and util-linux)."""
    import os
    import shutil

    for tool in ("unshare", "nsenter", "mount", "umount"):
        if shutil.which(tool) is None:
            return [], f"{tool} is not installed (Debian's util-linux)"
    binary = shutil.which("bwrap")
    if binary is None:
        return [], "bubblewrap is not installed (apt-get install bubblewrap): nothing to hide"
    if os.geteuid() != 0:
        return [], "hiding bubblewrap needs root (a private mount namespace)"
    binary = os.path.realpath(binary)
    return ["unshare", "-m", "sh", "-c", f'mount --bind /dev/null {binary} && exec "$0" "$@"'], None
