"""What the dispatcher and the merge queue share: the verdict of one
dispatch (and its helpers), the go-ahead a claim needs just before acting,
and the commit a promotion lands.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ledger.db.documents import Landing
from ledger.git.repository import LEDGER, Identity, Repository

Outcome = Literal["done", "conflict", "retry", "failed"]
#: What one dispatch did: an outcome recorded, or a promotion rebased (and
#: sent back for verification instead of being recorded as a conflict).
Dispatched = Outcome | Literal["rebased", "batched"]

#: How soon a promotion that waits its turn in the queue is looked at again
#: (its turn comes with a verdict or a landing, which wake the outbox anyway).
TURN_WAIT_S = 2.0

#: Just before acting: confirm the claim (extending its lease) and that at
#: least this many seconds of it are left by the dispatcher's own clock; else
#: ``NotOurs``. Bound to one claim and its lease by the dispatcher.
GoAhead = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Verdict:
    """What one dispatch found; becomes one ``complete_side_effect`` call."""

    outcome: Dispatched
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    #: a lower bound on the retry delay the target asked for (Retry-After)
    retry_after_s: float | None = None
    #: what a retry waits on that is not the candidate's (``system_fault``,
    #: ``target``): retried for as long as it takes, never turned into a failure
    waiting_on: str | None = None
    #: a promotion waiting its turn in the merge queue: looked at again this soon
    queue_wait_s: float | None = None

    def stored(self) -> dict[str, Any]:
        """The result as the side effect records it (the waits said in it)."""
        said = {"waiting_on": self.waiting_on, "queue_wait_s": self.queue_wait_s}
        return {**self.result, **{k: v for k, v in said.items() if v is not None}}


class NotOurs(Exception):
    """Do not act and record nothing: the claim is no longer this dispatcher's,
    or the intent's generation died (and the kernel cancelled it)."""


def done(**result: Any) -> Verdict:
    """The target shows the effect."""
    return Verdict("done", result)


def failed(error: str, **result: Any) -> Verdict:
    """Permanent: retrying would not help."""
    return Verdict("failed", result, error)


def waiting(error: str, *, on: str = "system_fault", **result: Any) -> Verdict:
    """A retry for a reason that is not the candidate's (a remote that cannot
    be reached, a dirty checkout of the target): retried with backoff for as
    long as it takes, never turned into a failure, and the campaign says why."""
    return Verdict("retry", result, error, waiting_on=on)


def queue_wait(reason: str, wait_s: float = TURN_WAIT_S, **result: Any) -> Verdict:
    """A promotion that waits its turn in its target's merge queue."""
    return Verdict("retry", result, reason, waiting_on="target", queue_wait_s=wait_s)


def land(repo: Repository, candidate: str, old: str | None, landing: Landing) -> str:
    """The commit a promotion lands: ``candidate``'s tree on ``old`` with
    Ledger's trailers, committed as the class's committer at the verdict."""
    # One Ledger-Verdict per verifier of the class's quorum, in its order.
    verdicts = landing.all_verdicts()
    trailers = [("Ledger-Campaign", str(landing.campaign_id)),
                ("Ledger-Attempt", str(landing.attempt_no))]
    for each in verdicts:
        verdict = f"accepted by {each.verifier}"
        if len(verdicts) > 1 and each.kind:
            verdict += f" [{each.kind}]"
        if each.model_family not in (None, "", "none"):
            verdict += f" (model family {each.model_family})"
        if each.summary:
            verdict += f": {each.summary}"
        trailers.append(("Ledger-Verdict", verdict))
    committer = landing.committer
    return repo.land(
        candidate, old, trailers=trailers,
        committer=Identity(committer.name, committer.email) if committer else LEDGER,
        committed_at=landing.verified_at)
