"""The merge queue, the dispatcher's side of it (the rules are in the schema:
``sql/merge_queue.sql``; the prose in docs/merge-queue.md).

A promotion whose target moved is no longer rebased alone and sent back to
be verified while every other pending candidate is: the candidates waiting
for that target are *stacked* onto it, in queue order -- each one's own
change (its verified candidate against the base it was made on) replayed
onto the one below it, in the object database (``Repository.replay``) -- and
only the top of the stack, the batch's *probe*, is verified, through the
ordinary path of a rebased candidate: its campaign goes back to attempted
with the stack's top as its candidate, and any verifier judges it. When it
passes, the whole batch lands in one compare-and-swap: one commit per member
(``dispatcher._land``: that member's tree, with its own trailers), the
branch moved from the target the stack was built on to the last of them,
read back, and every member's intent recorded done once. When it fails with
others below it, the queue bisects (the next batch is half as long), and a
candidate that fails alone on the target is an ordinary rejection.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ledger.git import bundle as bundles
from ledger.git import repository as repositories
from ledger.db.models import Campaign, SideEffectClaim
from ledger.git.repository import GitError, RefMoved, Repository, SystemFault, WorktreeDirty

if TYPE_CHECKING:
    from ledger.roles.dispatcher import Dispatcher, Verdict

#: How soon a promotion that waits its turn in the queue is looked at again
#: (its turn comes with a verdict or a landing, which wake the outbox anyway).
TURN_WAIT_S = 2.0


@dataclass(frozen=True)
class Member:
    """A verified candidate waiting in its target's queue."""

    campaign_id: int
    generation: int
    side_effect_id: int
    queued_at: datetime
    #: its own change and verdict: {old, new, candidate_ref, landing}
    change: dict[str, Any]

    @classmethod
    def of(cls, row: dict[str, Any]) -> Member:
        queued = row["queued_at"]
        return cls(int(row["campaign_id"]), int(row["generation"]), int(row["side_effect_id"]),
                   queued if isinstance(queued, datetime) else datetime.fromisoformat(str(queued)),
                   dict(row["change"]))


def next_batch(batch_size: int, last: dict[str, Any] | None) -> tuple[int, int | None]:
    """How many candidates the next batch stacks, and how many at the head
    of the queue are suspected (the culprit of a failed batch lies among
    them), from the last batch the target closed: a bisection."""
    if last is None or last.get("suspect") is None and last["state"] != "failed":
        return batch_size, None
    size = len(last["members"])
    suspect = last.get("suspect")
    if last["state"] == "failed":
        # alone on the target: its culprit was rejected, nothing is suspected
        return (batch_size, None) if size == 1 else (max(1, size // 2), size)
    assert suspect is not None
    if last["state"] == "landed":
        left = suspect - size  # the culprit is after the prefix that landed
        if left <= 0:
            return batch_size, None
        return (1 if left == 1 else left // 2), left
    return min(size, batch_size), suspect  # dissolved: the same again


def _queue_wait(reason: str, wait_s: float = TURN_WAIT_S, **result: Any) -> Verdict:
    from ledger.roles.dispatcher import Verdict
    return Verdict("retry", {**result, "waiting_on": "target", "queue_wait_s": wait_s}, reason)


class MergeQueue:
    """What the dispatcher does with a queued promotion whose target moved."""

    def __init__(self, dispatcher: Dispatcher):
        self.d = dispatcher

    async def moved(self, claim: SideEffectClaim, campaign: Campaign, repo: Repository,
                    current: str) -> Verdict | None:
        """The target is at ``current``, not where the claimed promotion
        expects it: land the open batch (this claim is its probe's), or stack
        a new one from the head (this claim); ``None`` if not queued."""
        view = await self.d.kernel.merge_queue_view(claim.side_effect_id, claim.claim_token)
        if view is None:
            return None
        if view.get("batch") is not None:
            landed = await self._land(claim, repo, current, view["batch"])
            if landed is not None:
                return landed
            # the batch ended without landing: this promotion waits its turn anew
            view = await self.d.kernel.merge_queue_view(claim.side_effect_id, claim.claim_token)
            if view is None:
                return None
        return await self._stack(claim, campaign, repo, current, view)

    # --- a new batch ---------------------------------------------------------

    async def _stack(self, claim: SideEffectClaim, campaign: Campaign, repo: Repository,
                     current: str, view: dict[str, Any]) -> Verdict:
        from ledger.roles.dispatcher import Verdict, _waiting
        queue = [Member.of(row) for row in view["queue"]]
        if not queue or queue[0].side_effect_id != claim.side_effect_id:
            return _queue_wait("waiting in the merge queue for the candidates ahead of it")
        policy = view["policy"]
        size, suspect = next_batch(int(policy["batch_size"]), view.get("last"))
        members = queue[:size]
        now = datetime.fromisoformat(str(view["now"])) if not isinstance(view["now"], datetime) else view["now"]
        waited = (now - members[0].queued_at).total_seconds()
        if len(members) < size and waited < float(policy["max_wait_s"]):
            return _queue_wait(f"the merge queue holds {len(members)} of {size}: waiting for more",
                               float(policy["max_wait_s"]) - waited)
        refs = [r for m in members if isinstance(r := m.change.get("candidate_ref"), str)]
        try:
            await asyncio.to_thread(repo.fetch, claim.target, *refs)
        except GitError:
            members = members[:1]  # one of them is out of reach: the head alone
            try:
                head_ref = members[0].change.get("candidate_ref")
                await asyncio.to_thread(repo.fetch, claim.target, *([head_ref] if head_ref else []))
            except GitError as exc:
                return _waiting(f"cannot fetch the candidate to stack: {exc.message}")
        stack: list[str] = []
        below = current
        for member in members:
            old, new = member.change.get("old"), member.change.get("new")
            try:
                stacked = (await asyncio.to_thread(repo.replay, str(old), below, str(new))
                           if old and new else None)
            except GitError as exc:
                if not stack:
                    return _waiting(f"cannot stack the candidate onto {current}: {exc.message}")
                break  # the batch ends below it; it is stacked in a later one
            if stacked is None:
                if not stack:
                    return Verdict("conflict", {"read_back": current, "expected": old},
                                   f"{claim.target} moved to {current} and the candidate does not "
                                   "apply onto it cleanly")
                break
            stack.append(stacked)
            below = stacked
        members = members[:len(stack)]
        while True:
            # the probe is re-verified from its frozen bundle: one without is
            # left for a later batch (alone, it cannot be rebased: a conflict)
            probe = members[-1]
            attempts = await self.d.reads.attempts_of(probe.campaign_id)
            accepted = next((a for a in attempts if a.generation == probe.generation), None)
            if accepted is not None and accepted.bundle is not None:
                break
            if len(members) == 1:
                return Verdict("conflict", {"read_back": current, "expected": members[0].change.get("old")},
                               f"{claim.target} moved to {current}; the accepted attempt has no "
                               "bundle to rebase")
            members, stack = members[:-1], stack[:-1]
        onto = stack[-2] if len(stack) > 1 else current
        attempt_no = max(a.attempt_no for a in attempts) + 1
        ref = f"refs/heads/ledger/{probe.campaign_id}/{attempt_no}"
        try:
            await asyncio.to_thread(repo.publish, ref, stack[-1])
            diff = await asyncio.to_thread(repositories.diff, repo.path, onto, stack[-1])
        except GitError as exc:
            return _waiting(f"cannot publish the stacked candidate: {exc.message}")
        frozen = bundles.Bundle.model_validate({
            **accepted.bundle, "attempt_no": attempt_no, "generation": probe.generation + 1,
            "worker": self.d.identity, "base_sha": onto, "candidate_sha": stack[-1],
            "created_at": datetime.now(timezone.utc)})
        await self.d._go_ahead(claim, needed_s=1.0)
        batch = await self.d.kernel.merge_queue_stack(
            claim.side_effect_id, claim.claim_token, base_sha=current,
            members=[m.campaign_id for m in members], generations=[m.generation for m in members],
            stack=stack, changes=[m.change for m in members], suspect=suspect,
            bundle=frozen.model_dump(mode="json", by_alias=True),
            bundle_digest=bundles.digest_of(frozen, diff), diff=diff, candidate_ref=ref)
        # a batch of one is the plain rebase of a candidate onto its moved target
        return Verdict("rebased" if len(members) == 1 else "batched",
                       {"merge_batch": batch, "onto": current, "size": len(members),
                                   "probe": probe.campaign_id, "suspect": suspect})

    # --- a batch whose probe passed -----------------------------------------------

    async def _land(self, claim: SideEffectClaim, repo: Repository, current: str,
                    batch: dict[str, Any]) -> Verdict | None:
        """Land the batch whose probe's promotion is ``claim``; ``None`` when
        the batch ended instead (the target moved outside the queue, or a
        member left it): nothing was carried out."""
        from ledger.roles.dispatcher import Verdict, _land, _waiting
        batch_id = int(batch["id"])
        members: list[int] = [int(m) for m in batch["members"]]
        if claim.campaign_id != members[-1] or claim.generation != int(batch["probe_generation"]):
            return _queue_wait(f"merge batch {batch_id} is being verified")
        base: str = batch["base_sha"]
        stack: list[str] = list(batch["stack"])
        landings = [c.get("landing") or {} for c in batch["changes"][:-1]] + [claim.payload["landing"]]
        ref = claim.target
        try:
            landed: list[str] = []
            below = base
            for stacked, landing in zip(stack, landings):
                below = await asyncio.to_thread(_land, repo, stacked, below, landing)
                landed.append(below)
        except (GitError, ValueError, TypeError, KeyError) as exc:
            return _waiting(f"cannot build the commits of merge batch {batch_id}: {exc}")
        if batch["state"] == "landing" and batch.get("landed"):
            landed = list(batch["landed"])  # frozen by whoever froze it first
        top = landed[-1]
        result = {"merge_batch": batch_id, "size": len(members), "previous": base}
        if current != top:
            if current != base:
                await self.d.kernel.merge_queue_dissolve(
                    batch_id, claim.side_effect_id, claim.claim_token,
                    f"{ref} moved to {current} outside the queue")
                return None
            if batch["state"] == "verifying" and not await self.d.kernel.merge_queue_freeze(
                    batch_id, claim.side_effect_id, claim.claim_token, landed):
                return None  # a member left the queue
            await self.d._go_ahead(claim, needed_s=1.0)
            try:
                await asyncio.to_thread(repo.update_ref, ref, top, base)
            except RefMoved as exc:
                if exc.actual != top:
                    await self.d.kernel.merge_queue_dissolve(
                        batch_id, claim.side_effect_id, claim.claim_token, str(exc))
                    return _queue_wait(str(exc), 0.0, read_back=exc.actual)
            except WorktreeDirty as exc:
                return _waiting(exc.message, on="target", read_back=current)
            except SystemFault as exc:
                return _waiting(exc.message, read_back=current)
            except GitError as exc:
                return Verdict("retry", {"read_back": base}, f"git update-ref failed: {exc.message}")
            try:
                after = await asyncio.to_thread(repo.remote_ref, ref)
            except GitError as exc:
                return _waiting(f"read-back failed: {exc.message}")
            if after != top:
                return _waiting(f"{ref} is at {after}, not the batch's top {top}, right after the update")
        else:
            result["already_applied"] = True
        count = await self.d.kernel.merge_queue_landed(batch_id, claim.side_effect_id,
                                                       claim.claim_token, top, self.d.identity)
        return Verdict("batched", {**result, "landed": top, "members_landed": count})
