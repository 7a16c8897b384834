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
(``promotion.land``: that member's tree, with its own trailers), the
branch moved from the target the stack was built on to the last of them,
read back, and every member's intent recorded done once. When it fails with
others below it, the queue bisects (the next batch is half as long), and a
candidate that fails alone on the target is an ordinary rejection.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from ledger.db.documents import Landing, MergeBatch, QueueView
from ledger.db.kernel import Kernel
from ledger.db.models import SideEffectClaim
from ledger.db.reads import Reads
from ledger.git import bundle as bundles
from ledger.git import repository as repositories
from ledger.git.repository import GitError, RefMoved, Repository, SystemFault, WorktreeDirty
from ledger.roles.promotion import GoAhead, Verdict, land, queue_wait, waiting


def next_batch(batch_size: int, last: MergeBatch | None) -> tuple[int, int | None]:
    """How many candidates the next batch stacks, and how many at the head
    of the queue are suspected (the culprit of a failed batch lies among
    them), from the last batch the target closed: a bisection."""
    if last is None or last.suspect is None and last.batch_state != "failed":
        return batch_size, None
    size = len(last.members)
    suspect = last.suspect
    if last.batch_state == "failed":
        # alone on the target: its culprit was rejected, nothing is suspected
        return (batch_size, None) if size == 1 else (max(1, size // 2), size)
    assert suspect is not None
    if last.batch_state == "landed":
        left = suspect - size  # the culprit is after the prefix that landed
        if left <= 0:
            return batch_size, None
        return (1 if left == 1 else left // 2), left
    return min(size, batch_size), suspect  # dissolved: the same again


class MergeQueue:
    """What a dispatcher does with a queued promotion whose target moved:
    it acts through ``kernel`` and reads through ``reads`` as the dispatcher
    ``identity``; each call gets the claim's go-ahead (``GoAhead``)."""

    def __init__(self, kernel: Kernel, reads: Reads, identity: str):
        self.kernel = kernel
        self.reads = reads
        self.identity = identity

    async def view(self, claim: SideEffectClaim) -> QueueView | None:
        """The claimed promotion's queue (loaded once, here); ``None`` if not queued."""
        raw = await self.kernel.merge_queue_view(claim.side_effect_id, claim.claim_token)
        return QueueView.load(raw, what="merge_queue_view") if raw is not None else None

    async def moved(self, claim: SideEffectClaim, landing: Landing, repo: Repository,
                    current: str, go_ahead: GoAhead) -> Verdict | None:
        """The target is at ``current``, not where the claimed promotion
        (whose commit would say ``landing``) expects it: land the open batch
        (this claim is its probe's), or stack a new one from the head (this
        claim); ``None`` if not queued."""
        view = await self.view(claim)
        if view is None:
            return None
        if view.batch is not None:
            landed = await self._land(claim, landing, repo, current, view.batch, go_ahead)
            if landed is not None:
                return landed
            # the batch ended without landing: this promotion waits its turn anew
            view = await self.view(claim)
            if view is None:
                return None
        return await self._stack(claim, repo, current, view, go_ahead)

    # --- a new batch ---------------------------------------------------------

    async def _stack(self, claim: SideEffectClaim, repo: Repository, current: str,
                     view: QueueView, go_ahead: GoAhead) -> Verdict:
        queue = view.queue
        if not queue or queue[0].side_effect_id != claim.side_effect_id:
            return queue_wait("waiting in the merge queue for the candidates ahead of it")
        policy = view.policy
        size, suspect = next_batch(policy.batch_size, view.last)
        members = queue[:size]
        waited = (view.now - members[0].queued_at).total_seconds()
        if len(members) < size and waited < policy.max_wait_s:
            return queue_wait(f"the merge queue holds {len(members)} of {size}: waiting for more",
                              policy.max_wait_s - waited)
        refs = [r for m in members if (r := m.change.candidate_ref)]
        try:
            await asyncio.to_thread(repo.fetch, claim.target, *refs)
        except GitError:
            members = members[:1]  # one of them is out of reach: the head alone
            try:
                head_ref = members[0].change.candidate_ref
                await asyncio.to_thread(repo.fetch, claim.target, *([head_ref] if head_ref else []))
            except GitError as exc:
                return waiting(f"cannot fetch the candidate to stack: {exc.message}")
        stack: list[str] = []
        below = current
        for member in members:
            old, new = member.change.old, member.change.new
            try:
                stacked = (await asyncio.to_thread(repo.replay, old, below, new)
                           if old and new else None)
            except GitError as exc:
                if not stack:
                    return waiting(f"cannot stack the candidate onto {current}: {exc.message}")
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
            attempts = await self.reads.attempts_of(probe.campaign_id)
            accepted = next((a for a in attempts if a.generation == probe.generation), None)
            if accepted is not None and accepted.bundle is not None:
                break
            if len(members) == 1:
                return Verdict("conflict", {"read_back": current, "expected": members[0].change.old},
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
            return waiting(f"cannot publish the stacked candidate: {exc.message}")
        frozen = bundles.Bundle.model_validate({
            **accepted.bundle, "attempt_no": attempt_no, "generation": probe.generation + 1,
            "worker": self.identity, "base_sha": onto, "candidate_sha": stack[-1],
            "created_at": datetime.now(timezone.utc)})
        await go_ahead(1.0)
        batch = await self.kernel.merge_queue_stack(
            claim.side_effect_id, claim.claim_token, base_sha=current,
            members=[m.campaign_id for m in members], generations=[m.generation for m in members],
            stack=stack, changes=[m.change.stored() for m in members], suspect=suspect,
            bundle=frozen.model_dump(mode="json", by_alias=True),
            bundle_digest=bundles.digest_of(frozen, diff), diff=diff, candidate_ref=ref)
        # a batch of one is the plain rebase of a candidate onto its moved target
        return Verdict("rebased" if len(members) == 1 else "batched",
                       {"merge_batch": batch, "onto": current, "size": len(members),
                        "probe": probe.campaign_id, "suspect": suspect})

    # --- a batch whose probe passed -----------------------------------------------

    async def _land(self, claim: SideEffectClaim, landing_of_probe: Landing, repo: Repository,
                    current: str, batch: MergeBatch, go_ahead: GoAhead) -> Verdict | None:
        """Land the batch whose probe's promotion is ``claim``; ``None`` when
        the batch ended instead (the target moved outside the queue, or a
        member left it): nothing was carried out."""
        members = batch.members
        if claim.campaign_id != members[-1] or claim.generation != batch.probe_generation:
            return queue_wait(f"merge batch {batch.id} is being verified")
        base = batch.base_sha
        # the probe's landing as its intent has it now (its verdict is the batch's)
        landings = [c.landing for c in batch.changes[:-1]] + [landing_of_probe]
        ref = claim.target
        try:
            landed: list[str] = []
            below = base
            for stacked, landing in zip(batch.stack, landings):
                if landing is None:
                    raise ValueError("a member of the batch has no landing")
                below = await asyncio.to_thread(land, repo, stacked, below, landing)
                landed.append(below)
        except (GitError, ValueError) as exc:
            return waiting(f"cannot build the commits of merge batch {batch.id}: {exc}")
        if batch.batch_state == "landing" and batch.landed:
            landed = list(batch.landed)  # frozen by whoever froze it first
        top = landed[-1]
        result = {"merge_batch": batch.id, "size": len(members), "previous": base}
        if current != top:
            if current != base:
                await self.kernel.merge_queue_dissolve(
                    batch.id, claim.side_effect_id, claim.claim_token,
                    f"{ref} moved to {current} outside the queue")
                return None
            if batch.batch_state == "verifying" and not await self.kernel.merge_queue_freeze(
                    batch.id, claim.side_effect_id, claim.claim_token, landed):
                return None  # a member left the queue
            await go_ahead(1.0)
            try:
                await asyncio.to_thread(repo.update_ref, ref, top, base)
            except RefMoved as exc:
                if exc.actual != top:
                    await self.kernel.merge_queue_dissolve(
                        batch.id, claim.side_effect_id, claim.claim_token, str(exc))
                    return queue_wait(str(exc), 0.0, read_back=exc.actual)
            except WorktreeDirty as exc:
                return waiting(exc.message, on="target", read_back=current)
            except SystemFault as exc:
                return waiting(exc.message, read_back=current)
            except GitError as exc:
                return Verdict("retry", {"read_back": base}, f"git update-ref failed: {exc.message}")
            try:
                after = await asyncio.to_thread(repo.remote_ref, ref)
            except GitError as exc:
                return waiting(f"read-back failed: {exc.message}")
            if after != top:
                return waiting(f"{ref} is at {after}, not the batch's top {top}, right after the update")
        else:
            result["already_applied"] = True
        count = await self.kernel.merge_queue_landed(batch.id, claim.side_effect_id,
                                                     claim.claim_token, top, self.identity)
        return Verdict("batched", {**result, "landed": top, "members_landed": count})
