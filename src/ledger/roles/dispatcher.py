"""The outbox dispatcher ("intent before action"; README "What a lease guarantees"):
claims recorded side-effect intents (``git.update_ref``, ``http.request``; their
documents are ``ledger.db.documents``), carries each out with its precondition,
reads the target back and records what it saw. A promotion whose target moved
goes through its merge queue (``ledger.roles.merge_queue``).

The design at length: docs/internals.md (``ledger.roles.dispatcher``).
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from ledger import tracing
from ledger.backoff import backoff
from ledger.db.documents import (
    GitPayload,
    GitPrecondition,
    HttpPayload,
    HttpPrecondition,
    InvalidDocument,
    PromotionTarget,
)
from ledger.db.hub import WakeSource
from ledger.db.kernel import Kernel
from ledger.db.models import Campaign, SideEffectClaim
from ledger.db.reads import Reads
from ledger.errors import StaleLease, Unavailable
from ledger.git import bundle as bundles
from ledger.git import repository as repositories
from ledger.git.repository import GitError, RefMoved, Repository, SystemFault, WorktreeDirty
from ledger.identity import process_identity
from ledger.logs import get_logger
from ledger.roles.lease import LeaseClock
from ledger.roles.merge_queue import MergeQueue
from ledger.roles.promotion import (
    Dispatched,
    GoAhead,
    NotOurs,
    Outcome,
    Verdict,
    done,
    failed,
    land,
    waiting,
)
from ledger.runtime import seams
from ledger.runtime.registry import Registration, held, utcnow
from ledger.runtime.service import Loop
from ledger.settings import default

OUTBOX_CHANNEL = "ledger_outbox"
#: The longest pause between retries of a promotion waiting on a system fault
#: or on its target.
WAIT_CAP_S = 300.0
FAULT_AFTER_ACTION = "dispatcher.after_action"
KINDS = ("git.update_ref", "http.request")

_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
# Statuses that say "not now" rather than "no": 408 timeout, 409 a request with
# the same Idempotency-Key still in flight (IETF idempotency-key draft), 425,
# 429 and every 5xx.
_TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})


class Dispatcher(Loop):
    """Claims intents, acts with their precondition, reads back, records.

    ``kernel`` must act as the dispatcher role. ``lease_s`` is the claim lease:
    it must outlast one dispatch, or a second dispatcher may claim the intent
    while this one still works on it (harmless -- the CAS and the
    Idempotency-Key hold -- but wasteful), hence the check against the HTTP
    timeout. ``max_tries`` bounds transient retries (and crash loops).
    """

    name = "dispatcher"
    wake_channel = OUTBOX_CHANNEL

    def __init__(
        self,
        kernel: Kernel,
        *,
        hub: WakeSource | None = None,
        identity: str | None = None,
        poll_s: float = default("poll_s"),
        lease_s: float = default("dispatcher_lease_s"),
        max_tries: int = 8,
        backoff_base_s: float = 2.0,
        backoff_cap_s: float = 600.0,
        http_timeout_s: float = 10.0,
        kinds: list[str] | None = None,
        batch: int = 100,
        http_client: httpx.AsyncClient | None = None,
        data_dir: Path | None = None,
        pause: seams.Pause | None = None,
    ):
        super().__init__(poll_s, hub=hub)
        if max_tries < 1:
            raise ValueError(f"dispatcher: max_tries must be at least 1, not {max_tries}")
        if batch < 1:
            raise ValueError(f"dispatcher: batch must be at least 1, not {batch}")
        if kinds is not None and not set(kinds) <= set(KINDS):
            raise ValueError(f"dispatcher: kinds must be among {', '.join(KINDS)}, not {kinds}")
        if http_timeout_s <= 0 or lease_s <= 3 * http_timeout_s:
            # one dispatch may wait for a read-back, the request and a read-back
            raise ValueError(f"dispatcher: lease_s ({lease_s}) must exceed 3 x http_timeout_s "
                             f"({http_timeout_s}), or a slow target outlives the claim")
        self.kernel = kernel
        self.reads = Reads(kernel.executor)
        self.identity = identity or process_identity("dispatcher")
        self.lease_s = lease_s
        self.max_tries = max_tries
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.http_timeout_s = http_timeout_s
        self.kinds = kinds
        self.batch = batch
        #: where rebased candidates' bundles are frozen; without it a moved
        #: promotion target is a plain conflict
        self.data_dir = data_dir
        self._http_client = http_client
        #: awaited at the seams a drill may stop the process at (FAULT_AFTER_ACTION)
        self.pause = pause if pause is not None else seams.installed()
        self._stop: asyncio.Event | None = None
        self.queue = MergeQueue(kernel, self.reads, self.identity)
        self.log = get_logger(self.name, dispatcher=self.identity)
        #: outcomes recorded by this dispatcher, for logs and tests
        self.recorded: dict[str, int] = {"done": 0, "conflict": 0, "retry": 0, "failed": 0}
        #: the intent being dispatched, for the registry of processes
        self.holding: dict[int, dict[str, Any]] = {}
        self.registration = Registration(kernel, "dispatcher", self.name, self.identity, poll_s,
                                         holds=lambda: list(self.holding.values()))

    # --- the loop ------------------------------------------------------------

    async def run_once(self) -> int:
        """Dispatch every intent that is due now (up to ``batch``); returns how many."""
        handled = 0
        while handled < self.batch and not (self._stop and self._stop.is_set()):
            sent = LeaseClock.now()
            claim = await self.kernel.claim_side_effect(self.identity, lease_s=self.lease_s,
                                                        kinds=self.kinds)
            if claim is None:
                break
            self.holding[claim.side_effect_id] = held(
                "side_effect", claim.side_effect_id, utcnow(), campaign=claim.campaign_id)
            try:
                await self.dispatch(claim, sent_at=sent)
            finally:
                self.holding.pop(claim.side_effect_id, None)
            handled += 1
        return handled

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until ``stop`` is set. Between passes it idles on the
        ``ledger_outbox`` channel with the poll tick as timeout (a lost NOTIFY
        costs latency, never an intent). An intent being dispatched is always
        finished and recorded before stopping: stopping between the action and
        the record would only leave work for the next dispatcher's read-back."""
        self._stop = stop
        self.log.info("dispatcher started", poll_s=self.interval_s, lease_s=self.lease_s)
        await super().run(stop)
        self.log.info("dispatcher stopped", recorded=self.recorded)

    # --- one intent ------------------------------------------------------------

    async def dispatch(self, claim: SideEffectClaim, *, sent_at: float | None = None) -> Dispatched | None:
        """Carry out one claimed intent and record what the read-back showed;
        returns the outcome recorded (``retry`` past ``max_tries`` is ``failed``),
        or ``None`` when it did not act because the claim or the intent's
        generation was no longer live (nothing recorded by this dispatcher).
        ``sent_at``: the local time the claim was sent (default: now)."""
        log = self.log.bind(side_effect=claim.side_effect_id, campaign=claim.campaign_id,
                            kind=claim.kind, purpose=claim.purpose, target=claim.target,
                            tries=claim.tries)
        lease = LeaseClock()
        lease.confirm(LeaseClock.now() if sent_at is None else sent_at, claim.lease_remaining_s)
        campaign = await self.reads.campaign(claim.campaign_id)
        return await tracing.traced(
            tracing.PROMOTION_SPAN if claim.purpose == "promotion" else tracing.SIDE_EFFECT_SPAN,
            self.reads.executor, claim.campaign_id,
            {tracing.CAMPAIGN_CLASS: campaign.class_, tracing.GENERATION: claim.generation,
             tracing.SIDE_EFFECT_ID: claim.side_effect_id, tracing.SIDE_EFFECT_KIND: claim.kind,
             tracing.SIDE_EFFECT_PURPOSE: claim.purpose, tracing.SIDE_EFFECT_TRIES: claim.tries,
             tracing.DISPATCHER: self.identity},
            self._dispatch(claim, campaign, lease, log), context=campaign.trace_context, known=True)

    async def _dispatch(self, claim: SideEffectClaim, campaign: Campaign, lease: LeaseClock,
                        log: Any) -> Dispatched | None:
        async def go_ahead(needed_s: float) -> None:
            await self._go_ahead(claim, lease, needed_s=needed_s)

        try:
            kind: str = claim.kind  # typed as the known kinds; the guard below is for the rest
            if kind == "git.update_ref":
                verdict = await self._git(claim, campaign, go_ahead)
            elif kind == "http.request":
                verdict = await self._http(claim, campaign, go_ahead)
            else:  # the schema's CHECK makes this unreachable; say so if it is not
                verdict = failed(f"unknown side effect kind {claim.kind!r}")
        except InvalidDocument as exc:
            verdict = failed(str(exc))
        except NotOurs as exc:
            log.warning("not carried out: " + str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 -- a bug must not strand the claim
            log.exception("dispatch raised")
            verdict = Verdict("retry", error=f"dispatcher error: {type(exc).__name__}: {exc}")

        if verdict.outcome == "rebased":
            log.info("promotion target moved: candidate rebased and sent back for verification",
                     **verdict.result)
            return "rebased"
        if verdict.outcome == "batched":
            # recorded by the merge queue's own functions (a batch stacked, or landed)
            log.info("merge queue: " + ("batch landed" if "landed" in verdict.result
                                        else "batch stacked and its probe sent to be verified"),
                     **verdict.result)
            return "batched"
        outcome: Outcome = verdict.outcome
        error = verdict.error
        retry_after = 0.0
        if outcome == "retry":
            if claim.tries >= self.max_tries and not verdict.waiting_on:
                outcome, error = "failed", f"gave up after {claim.tries} tries: {error}"
            elif verdict.queue_wait_s is not None:
                # its turn in the merge queue: a verdict or a landing comes first
                retry_after = verdict.queue_wait_s
            elif verdict.waiting_on:
                # Waiting on a fault that is not the candidate's: the pause
                # grows with the campaign's faults in a row (the kernel does
                # not count such a retry as a try), up to WAIT_CAP_S.
                retry_after = backoff(campaign.fault_count + 1, base_s=2.0, cap_s=WAIT_CAP_S, jitter=0.2)
            else:
                # jittered, so a fleet of dispatchers does not hammer a
                # recovering target in lockstep
                retry_after = max(backoff(claim.tries, base_s=self.backoff_base_s,
                                          cap_s=self.backoff_cap_s, jitter=0.2),
                                  min(verdict.retry_after_s or 0.0, self.backoff_cap_s))
        result = {**verdict.stored(), "dispatcher": self.identity}
        try:
            await self.kernel.complete_side_effect(claim.side_effect_id, claim.claim_token,
                                                   outcome, result=result, error=error,
                                                   retry_after_s=retry_after,
                                                   timeout_s=max(lease.remaining(), 0.001))
        except (StaleLease, Unavailable) as exc:
            # Our lease lapsed (another dispatcher may hold the intent now) or
            # the database stayed out of reach for the rest of it: the next
            # claimant reads back first, so whatever we did is seen and
            # recorded there.
            log.warning("claim lost before recording; the next claimant reads back",
                        outcome=outcome, error=exc.message)
            return outcome
        self.recorded[outcome] += 1
        log_at = log.info if outcome == "done" else log.warning
        log_at("side effect " + outcome, error=error,
               retry_in_s=round(retry_after, 2) if outcome == "retry" else None,
               already_applied=verdict.result.get("already_applied"))
        return outcome

    async def _go_ahead(self, claim: SideEffectClaim, lease: LeaseClock, *,
                        needed_s: float) -> None:
        """Just before acting: confirm the claim and the intent's generation
        (extending the claim's ``lease``), and that enough of the lease is left
        for the action by this dispatcher's own clock; else ``NotOurs``."""
        if lease.lapsed:
            raise NotOurs("the claim's lease lapsed by the dispatcher's own clock")
        sent = LeaseClock.now()
        try:
            renewed = await self.kernel.confirm_side_effect(
                claim.side_effect_id, claim.claim_token, lease_s=self.lease_s,
                timeout_s=lease.remaining())
        except StaleLease as exc:
            raise NotOurs(exc.message) from exc
        except Unavailable as exc:
            raise NotOurs(f"the claim could not be confirmed: {exc.message}") from exc
        lease.confirm(sent, renewed.lease_remaining_s)
        if lease.remaining() < needed_s:
            raise NotOurs(f"less than {needed_s:g}s of the claim's lease is left to act")

    def _gave_up(self, claim: SideEffectClaim) -> Verdict | None:
        # More claims than tries happen only when dispatchers died mid-dispatch
        # (every retry past max_tries is recorded as failed): a poison intent.
        if claim.tries > self.max_tries:
            return failed(f"gave up after {claim.tries} claims without a record "
                           "(dispatchers died while carrying it out)")
        return None

    # --- git.update_ref ----------------------------------------------------------

    async def _git(self, claim: SideEffectClaim, campaign: Campaign, go_ahead: GoAhead) -> Verdict:
        """A ref's compare-and-swap: check the intent, read the target back,
        build what lands, then act (or hand a moved target to the queue)."""
        payload = GitPayload.load(claim.payload, what="payload")
        precondition = GitPrecondition.of(claim.precondition)
        refused = await self._refused_git(claim, campaign, payload, precondition)
        if refused is not None:
            return refused
        assert payload.repository is not None
        new, old = str(payload.new).lower(), precondition.old.lower() if precondition.old else None
        remote = "://" in payload.repository or payload.repository.startswith("git@")
        if remote and self.data_dir is None:
            return waiting(f"{payload.repository} is a remote: this dispatcher needs a data dir "
                           "for its cache of it (a configuration error)")
        repo = Repository(payload.repository,
                          cache_dir=self.data_dir / "repos" if self.data_dir else None)
        landing = payload.landing if claim.purpose == "promotion" else None
        try:
            current = await self._read_target(repo, claim.target, payload.candidate_ref)
        except GitError as exc:
            return waiting(f"cannot read {claim.target} of {payload.repository}: {exc.message}")
        landed: dict[str, Any] = {}
        if landing is not None:
            if not await asyncio.to_thread(repo.has_commit, new):
                return waiting(f"commit {new} is not in {payload.repository}"
                               + (f" (fetched {payload.candidate_ref})" if payload.candidate_ref
                                  else ""), read_back=current)
            try:
                new_sha = await asyncio.to_thread(land, repo, new, old, landing)
            except (GitError, ValueError) as exc:
                return failed(f"cannot build the commit to land for {new}: {exc}", read_back=current)
            landed = {"landed": new_sha, "candidate": new}
            new = new_sha
        # Read back FIRST: a dispatcher that died after acting left the effect.
        if current == new:
            return done(read_back=current, already_applied=True, **landed)
        if campaign.state == "abandoned":
            return failed("campaign abandoned before the intent was carried out", read_back=current)
        if current != old:
            return await self._moved(claim, campaign, repo, payload, old, current, go_ahead)
        if (gave_up := self._gave_up(claim)) is not None:
            return gave_up
        if not await asyncio.to_thread(repo.has_commit, new):
            return waiting(f"commit {new} is not in {payload.repository}", read_back=current)
        return await self._update_ref(repo, claim.target, new, old, go_ahead, landed)

    async def _refused_git(self, claim: SideEffectClaim, campaign: Campaign, payload: GitPayload,
                           precondition: GitPrecondition) -> Verdict | None:
        """Why the intent cannot be carried out as written, if it cannot."""
        if not precondition.given:
            return failed("a git.update_ref intent needs precondition.old (a sha, or null for "
                          "'the ref must not exist'); a blind ref update is never made")
        new, old = (payload.new or "").lower(), precondition.old
        if not _SHA.match(new) or (old is not None and not _SHA.match(old.lower())):
            return failed(f"payload.new and precondition.old must be full commit ids "
                          f"(new={payload.new!r}, old={old!r})")
        if not payload.repository:
            return failed("payload.repository is missing")
        if claim.purpose != "promotion":
            # The kernel judged the ref against the worker's authority profile,
            # but the repository is the worker's choice: it must be the class's.
            allowed = await self._class_repository(campaign)
            if payload.repository != allowed:
                return failed(f"repository {payload.repository} is not the repository of class "
                              f"{campaign.class_} ({allowed or 'none configured'})")
        return None

    async def _read_target(self, repo: Repository, ref: str, candidate_ref: str | None) -> str | None:
        """The target as the remote has it now -- the truth -- with the
        candidate (and the target's commit, a landing's parent) fetched here."""
        current = await asyncio.to_thread(repo.remote_ref, ref)
        await asyncio.to_thread(repo.fetch, *[r for r in (ref if current else None, candidate_ref) if r])
        return current

    async def _moved(self, claim: SideEffectClaim, campaign: Campaign, repo: Repository,
                     payload: GitPayload, old: str | None, current: str | None,
                     go_ahead: GoAhead) -> Verdict:
        """The target is not where the intent expects it: a promotion goes
        through its target's merge queue, or is rebased alone; anything else
        is a conflict."""
        promotion = claim.purpose == "promotion" and current is not None
        if promotion and payload.landing is not None:
            assert current is not None
            # in the merge queue: stacked with the candidates behind it, or landed with them
            queued = await self.queue.moved(claim, payload.landing, repo, current, go_ahead)
            if queued is not None:
                return queued
        if promotion and old is not None:
            assert current is not None
            # the candidate itself, not the commit that would have landed
            return await self._rebase(claim, campaign, repo, old, current,
                                      (payload.new or "").lower(), go_ahead)
        return Verdict("conflict", {"read_back": current, "expected": old},
                       f"{claim.target} is at {current or 'nothing'}, not the expected {old or 'nothing'}")

    async def _update_ref(self, repo: Repository, ref: str, new: str, old: str | None,
                          go_ahead: GoAhead, landed: dict[str, Any]) -> Verdict:
        """The compare-and-swap itself, then the read-back that decides."""
        await go_ahead(1.0)
        try:
            await asyncio.to_thread(repo.update_ref, ref, new, old)
        except RefMoved as exc:
            if exc.actual != new:
                return Verdict("conflict", {"read_back": exc.actual, "expected": old}, str(exc))
            # else: someone made the very same move meanwhile; the read-back decides
        except WorktreeDirty as exc:
            # Someone's work in progress on the checked-out branch: not ours to
            # overwrite, and no fault of the candidate's. The promotion waits
            # (and is retried) until the checkout is clean; nothing is
            # re-attempted.
            return waiting(exc.message, on="target", read_back=old, **landed)
        except SystemFault as exc:
            return waiting(exc.message, read_back=old)
        except GitError as exc:
            # The ref is still at the expected commit (else RefMoved): another
            # writer held its lock. Transient.
            return Verdict("retry", {"read_back": old},
                           f"git update-ref failed although {ref} is still at {old} "
                           f"(another writer holds its lock): {exc.message}")
        else:
            await self.pause(FAULT_AFTER_ACTION)

        try:
            after = await asyncio.to_thread(repo.remote_ref, ref)
        except GitError as exc:
            # The update is in; the next claim's read-back will see it.
            return waiting(f"read-back failed: {exc.message}")
        if after != new:
            return Verdict("conflict", {"read_back": after, "expected": new},
                           f"{ref} moved to {after or 'nothing'} right after the update")
        return done(read_back=after, previous=old, **landed)

    async def _rebase(self, claim: SideEffectClaim, campaign: Campaign, repo: Repository,
                      base: str, onto: str, candidate: str, go_ahead: GoAhead) -> Verdict:
        """The promotion's target moved from ``base`` to ``onto``: replay the
        candidate onto it in the object database (``Repository.replay``),
        publish the result and send it back for verification -- or, when it
        does not apply cleanly, a conflict (a new attempt is needed)."""
        moved = {"read_back": onto, "expected": base}
        attempts = await self.reads.attempts_of(campaign.id)
        accepted = next((a for a in attempts if a.generation == claim.generation), None)
        if accepted is None or accepted.bundle is None:
            return Verdict("conflict", moved, f"{claim.target} moved to {onto}; the accepted "
                                              "attempt has no bundle to rebase")
        attempt_no = max(a.attempt_no for a in attempts) + 1
        try:
            rebased = await asyncio.to_thread(repo.replay, base, onto, candidate)
        except GitError as exc:
            return waiting(f"cannot replay the candidate onto {onto}: {exc.message}")
        if rebased is None:
            return Verdict("conflict", moved, f"{claim.target} moved to {onto} and the candidate "
                                              "does not apply onto it cleanly")
        ref = f"refs/heads/ledger/{campaign.id}/{attempt_no}"
        try:
            await asyncio.to_thread(repo.publish, ref, rebased)
        except GitError as exc:
            return waiting(f"cannot publish the rebased candidate: {exc.message}")
        frozen = bundles.Bundle.model_validate({
            **accepted.bundle, "attempt_no": attempt_no,
            "generation": claim.generation + 1, "worker": self.identity, "base_sha": onto,
            "candidate_sha": rebased, "created_at": datetime.now(timezone.utc)})
        try:
            diff = await asyncio.to_thread(repositories.diff, repo.path, onto, rebased)
        except GitError as exc:
            return waiting(f"cannot take the rebased candidate's diff: {exc.message}")
        await go_ahead(1.0)
        await self.kernel.rebase_promotion(
            claim.side_effect_id, claim.claim_token, base_sha=onto, candidate_sha=rebased,
            bundle=frozen.model_dump(mode="json", by_alias=True),
            bundle_digest=bundles.digest_of(frozen, diff), diff=diff, candidate_ref=ref)
        return Verdict("rebased", {"onto": onto, "candidate": rebased, "attempt_no": attempt_no})

    async def _class_repository(self, campaign: Campaign) -> str | None:
        promotion = (await self.reads.campaign_class(campaign.class_)).promotion
        return PromotionTarget.load(promotion, what="promotion").repository

    # --- http.request ------------------------------------------------------------

    async def _http(self, claim: SideEffectClaim, campaign: Campaign, go_ahead: GoAhead) -> Verdict:
        if not isinstance(claim.payload.get("read_back"), (dict, type(None))):
            return failed("payload.read_back must be an object {url, expect_status}")
        payload = HttpPayload.load(claim.payload, what="payload")
        precondition = HttpPrecondition.load(claim.precondition, what="precondition")
        method = payload.method.upper()
        if method not in _METHODS:
            return failed(f"payload.method must be one of {', '.join(sorted(_METHODS))}")
        url = payload.url or claim.target
        read_back = payload.read_back
        check_url = (read_back.url if read_back else None) or url
        expect_status = read_back.expect_status if read_back else 200
        # The kernel judged `target` against the authority profile; whatever we
        # contact must be on the same origin, or a worker could point the
        # payload anywhere.
        origin = _origin(claim.target)
        for candidate in (url, check_url):
            if origin is None or _origin(candidate) != origin:
                return failed(f"{candidate} is not on the origin of the authorised target "
                              f"{claim.target} (http or https only)")
        headers = httpx.Headers(payload.headers)
        headers["Idempotency-Key"] = claim.idempotency_key  # never the payload's own
        for value, header in ((precondition.if_match, "If-Match"),
                              (precondition.if_none_match, "If-None-Match")):
            if value is not None:
                headers[header] = str(value)
        body = payload.body
        content = body.encode() if isinstance(body, str) else None
        json_body = body if body is not None and not isinstance(body, str) else None

        async with self._client() as client:
            if read_back is not None:
                # Read back FIRST: a dispatcher that died after acting left the effect.
                try:
                    seen = (await client.get(check_url)).status_code
                except httpx.HTTPError as exc:
                    return Verdict("retry", error=f"read-back GET {check_url}: {_describe(exc)}")
                if seen == expect_status:
                    return done(read_back={"url": check_url, "status": seen}, already_applied=True)
            if campaign.state == "abandoned":
                return failed("campaign abandoned before the intent was carried out")
            if (gave_up := self._gave_up(claim)) is not None:
                return gave_up
            await go_ahead(2 * self.http_timeout_s)
            try:
                response = await client.request(method, url, headers=headers, content=content,
                                                json=json_body)
            except httpx.HTTPError as exc:
                return Verdict("retry", error=f"{method} {url}: {_describe(exc)}")
            await self.pause(FAULT_AFTER_ACTION)

            status = response.status_code
            result: dict[str, Any] = {"status": status}
            if status in _TRANSIENT_STATUSES or status >= 500:
                return Verdict("retry", result, f"{method} {url} answered {status}",
                               retry_after_s=_retry_after(response))
            if status == 412:
                return Verdict("conflict", result, f"{method} {url}: precondition failed (412)")
            if not 200 <= status < 300:
                return failed(f"{method} {url} answered {status}: {response.text[:300]}", **result)
            if read_back is None:
                return done(**result)  # no read-back configured: the answer is all we see
            try:
                seen = (await client.get(check_url)).status_code
            except httpx.HTTPError as exc:
                return Verdict("retry", result, f"read-back GET {check_url}: {_describe(exc)}")
            result["read_back"] = {"url": check_url, "status": seen}
            if seen != expect_status:
                # Accepted but not (yet) visible: the next try reads back first
                # and resends with the same key only if it still does not show.
                return Verdict("retry", result, f"read-back GET {check_url} answered {seen}, "
                                                f"not {expect_status}")
            return done(**result)

    def _client(self) -> httpx.AsyncClient | _Borrowed:
        if self._http_client is not None:
            return _Borrowed(self._http_client)
        # Redirects are not followed: they could leave the authorised origin.
        return httpx.AsyncClient(timeout=self.http_timeout_s, follow_redirects=False)


class _Borrowed:
    """An injected client, used without closing it."""

    def __init__(self, client: httpx.AsyncClient):
        self.client = client

    async def __aenter__(self) -> httpx.AsyncClient:
        return self.client

    async def __aexit__(self, *exc_info: object) -> None:
        return None


def _origin(url: str) -> tuple[str, str, int | None] | None:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return None
    return parsed.scheme, parsed.host.lower(), parsed.port or (443 if parsed.scheme == "https" else 80)


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None  # an HTTP date, or nothing: our own backoff decides


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
