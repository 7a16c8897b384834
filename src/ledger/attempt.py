"""One attempt (mechanisms 3, 4, 8, 12): a fresh git worktree, the class's
attempt command run there as a subprocess, a lease kept alive by heartbeats,
and exactly one ending written -- or nothing at all when the lease was lost.

The lease keeper heartbeats every ``heartbeat_s`` and at once when the hub says
the campaign was cancelled; a stale answer (reaped, abandoned) means *stand
down*: the command's whole process group is killed, the worktree discarded, and
nothing more is written for this attempt. The worktree is always removed.

The holder also fences itself by its own clock (``ledger.lease``): every call
it makes is bounded by the lease's remaining time, a heartbeat that fails
(the database restarting, a silent network) is retried until then, and if no
renewal is confirmed before the local deadline it stands down exactly as if
the database had said so. So a restart shorter than the lease costs nothing,
and a partition longer than it stops the command before another worker can
legitimately claim the campaign. An ending whose reply was lost is retried
(endings are idempotent) and, failing that, read back.

The command gets an allow-listed environment (``ledger.processes``) plus the
class's ``attempt_environment``; it may leave a commit message in
``$LEDGER_COMMIT_MESSAGE_FILE``. A candidate that changes a protected path
(``ledger.protection``) is refused before it is recorded: the refusal is the
attempt's failure reason and a ``security_event``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import bundle as bundles
from . import protection, repository
from .config import CampaignClassConfig
from .errors import LedgerError, RepeatedApproach, StaleLease, Unavailable
from .hub import NullHub, WakeSource
from .journal import JournalWriter
from .kernel import Kernel
from .lease import LeaseClock
from .logs import get_logger
from .models import Claim
from .processes import CommandResult, child_environment, run_command
from .protocol import AttemptContext
from .reads import Reads
from .repository import Repository

_LOG_TAIL = 16 * 1024
OWNER_FILE = "owner.json"
MESSAGE_FILE = "commit-message.txt"
_MESSAGE_LIMIT = 64 * 1024


def make_workdir(data_dir: Path, claim: Claim, repository_location: str) -> Path:
    """A private directory for one attempt, with an owner record so that a
    worker killed mid-attempt has its worktree swept by the next one."""
    root = data_dir / "attempts"
    root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{claim.campaign_id}-{claim.attempt_no}-", dir=root))
    (workdir / OWNER_FILE).write_text(json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(), "repository": repository_location}))
    return workdir


def worktree_path(workdir: Path) -> Path:
    """The attempt's worktree inside its workdir. Named after the (unique)
    workdir because git names a worktree's admin directory after its last path
    component: with one fixed name, two attempts adding worktrees to one
    repository at once raced for ``.git/worktrees/worktree``."""
    return workdir / f"worktree-{workdir.name}"


def sweep_orphans(data_dir: Path) -> int:
    """Remove the workdirs (and worktrees) of dead workers on this host."""
    removed = 0
    for workdir in sorted((data_dir / "attempts").glob("*")):
        try:
            owner = json.loads((workdir / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if owner.get("host") != socket.gethostname() or _alive(int(owner.get("pid", 0))):
            continue
        Repository(owner["repository"], cache_dir=data_dir / "repos").remove_worktree(worktree_path(workdir))
        shutil.rmtree(workdir, ignore_errors=True)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


class StoodDown(Exception):
    """The lease is gone (or could not be confirmed in time); this attempt
    writes nothing more."""


#: How soon a failed heartbeat is tried again (the lease's own deadline bounds it).
HEARTBEAT_RETRY_S = 0.5


class AttemptRun:
    """Runs one claimed attempt to its single ending."""

    def __init__(self, kernel: Kernel, claim: Claim, cls: CampaignClassConfig, *, identity: str,
                 data_dir: Path, hub: WakeSource | None = None, lease: LeaseClock | None = None):
        self.kernel = kernel
        self.reads = Reads(kernel.executor)
        self.claim = claim
        self.cls = cls
        self.identity = identity
        self.data_dir = data_dir
        self.hub = hub or NullHub()
        if lease is None:  # granted just now, as far as this caller knows
            lease = LeaseClock()
            lease.confirm(LeaseClock.now(), claim.lease_remaining_s)
        self.lease = lease
        self.log = get_logger("attempt", campaign=claim.campaign_id, attempt=claim.attempt_no,
                              generation=claim.generation, worker=identity)
        self.journal = JournalWriter(kernel, claim.campaign_id, claim.generation,
                                     limit_bytes=cls.log_limit_bytes, budget=self.lease.remaining)
        self.stood_down = asyncio.Event()
        self.self_fenced = False
        self._command: asyncio.Task[CommandResult] | None = None
        self.outcome = "running"
        self.ending = False  # the single ending is being written: a stale heartbeat is expected
        self.drained = False
        self.workdir: Path | None = None
        self.log_tail = ""

    # -- lease --------------------------------------------------------------

    async def _keep_lease(self) -> None:
        """Heartbeat every heartbeat_s, and at once on a cancel signal; retry a
        failed heartbeat until the lease's local deadline, then stand down."""
        loop = asyncio.get_running_loop()
        c = self.claim
        with self.hub.subscribe("ledger_cancel", key=str(c.campaign_id)) as cancel:
            next_beat = loop.time() + self.cls.heartbeat_s
            while not self.stood_down.is_set():
                until = min(next_beat - loop.time(), self.lease.remaining())
                await cancel.wait(max(until, 0.0))
                if self.stood_down.is_set():
                    return
                if self.lease.lapsed:
                    self._fence_self()
                    return
                sent = LeaseClock.now()
                try:
                    renewed = await self.kernel.heartbeat(c.campaign_id, c.generation,
                                                          timeout_s=self.lease.remaining())
                except StaleLease:
                    if self.ending:
                        return
                    self.log.warning("lease lost (reaped, abandoned or expired): standing down")
                    self._stand_down()
                    return
                except LedgerError as exc:  # unreachable, or no reply in time: keep trying
                    self.log.warning("heartbeat failed; retrying until the lease's local deadline",
                                     error=exc.message, error_type=type(exc).__name__,
                                     deadline_in_s=round(self.lease.remaining(), 1))
                    next_beat = loop.time() + min(HEARTBEAT_RETRY_S, self.cls.heartbeat_s)
                    continue
                self.lease.confirm(sent, renewed.lease_remaining_s)
                next_beat = loop.time() + self.cls.heartbeat_s

    def _fence_self(self) -> None:
        """No renewal was confirmed before the lease's local deadline: stop as
        if the database had said the lease is gone (it may be, by now)."""
        if self.stood_down.is_set() or self.ending:
            return
        self.self_fenced = True
        self.log.warning("lease not confirmed before its local deadline: stopping the attempt "
                         "and writing nothing more (self-fenced)")
        self.journal.fenced = True
        self._stand_down()

    def _stand_down(self) -> None:
        self.stood_down.set()
        self._kill()

    def _kill(self) -> None:
        # Cancelling the command kills its whole process group (ledger.processes).
        if self._command is not None and not self._command.done():
            self._command.cancel()

    def _budget(self) -> float:
        """The time left for a call of this lease's holder; none left: stand down."""
        remaining = self.lease.remaining()
        if remaining <= 0:
            self._fence_self()
            raise StoodDown
        return remaining

    # -- the attempt --------------------------------------------------------

    async def run(self) -> str:
        """Run the attempt; returns its outcome (attempted, failed, stood_down, drained)."""
        keeper = asyncio.create_task(self._keep_lease(), name=f"lease-{self.claim.campaign_id}")
        self.workdir = make_workdir(self.data_dir, self.claim, self.cls.repository)
        worktree = worktree_path(self.workdir)
        repo = Repository(self.cls.repository, cache_dir=self.data_dir / "repos")
        try:
            self.outcome = await self._attempt(repo, worktree)
        except (StoodDown, StaleLease):
            self.outcome = "drained" if self.drained else "stood_down"
        except Unavailable as exc:
            # Every call is bounded by the lease's remaining time: the
            # database stayed out of reach until the lease's local deadline.
            self.log.warning("the database stayed unreachable for the rest of the lease",
                             error=exc.message)
            self._fence_self()
            self.outcome = "stood_down"
        except asyncio.CancelledError:
            self._kill()
            raise
        finally:
            keeper.cancel()
            self._kill()
            await asyncio.to_thread(repo.remove_worktree, worktree)
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.log.info("attempt ended", outcome=self.outcome)
        return self.outcome

    def _check(self) -> None:
        if self.stood_down.is_set() or self.journal.fenced:
            raise StoodDown

    async def _attempt(self, repo: Repository, worktree: Path) -> str:
        c = self.claim
        branch = f"ledger/{c.campaign_id}/{c.attempt_no}"
        try:
            base = await asyncio.to_thread(repo.add_worktree, worktree, self.cls.base_ref, branch)
        except repository.GitError as exc:
            self._check()
            return await self._fail(f"could not prepare the worktree: {exc.message}", None)
        await self.journal.event("attempt.started", {"attempt_no": c.attempt_no, "worker": self.identity,
                                                     "base_sha": base, "branch": branch})
        context = await self._context(base, worktree)
        context_file = self.workdir / "campaign.json"  # type: ignore[operator]
        context_file.write_text(json.dumps(context, indent=2, default=str))

        exit_code, reason = await self._run_command(worktree, context_file, context)
        self._check()
        changed = await asyncio.to_thread(self._commit, worktree)
        candidate = await asyncio.to_thread(repository.head, worktree)
        diff = b"" if candidate == base else await asyncio.to_thread(repository.diff, worktree, base, candidate)
        fingerprint = bundles.fingerprint_of(diff) if diff else None
        if candidate != base:
            await self.journal.event("commit.made", {"candidate_sha": candidate, "fingerprint": fingerprint,
                                                     "diff_bytes": len(diff), "committed_changes": changed})
        self._check()
        if reason is None and not diff:
            reason = "the attempt command succeeded but changed nothing"
        if reason is not None:
            return await self._fail(reason, fingerprint)
        if not self.acceptance.get("allow_protected_changes"):
            touched = await asyncio.to_thread(
                protection.Protection.of(self.acceptance).changes, worktree, base, candidate)
            if touched:
                return await self._refuse(touched, fingerprint)  # type: ignore[arg-type]
        return await self._record(base, candidate, diff, fingerprint)  # type: ignore[arg-type]

    @property
    def acceptance(self) -> dict[str, Any]:
        """What the candidate will be judged by: the campaign's acceptance
        criteria (as the verifier reads them), else the class's."""
        criteria = self.claim.acceptance_criteria
        return dict(criteria) if criteria.get("commands") else self.cls.acceptance.effective()

    def _commit(self, worktree: Path) -> bool:
        """Commit what the command left, with its message (if it wrote one) and
        the campaign and attempt as trailers."""
        c = self.claim
        message = f"ledger: campaign {c.campaign_id} attempt {c.attempt_no}\n\n{c.objective_key}"
        written = self.workdir / MESSAGE_FILE  # type: ignore[operator]
        if written.is_file():
            text = written.read_bytes()[:_MESSAGE_LIMIT].decode("utf-8", errors="replace").strip()
            message = text or message
        message = repository.with_trailers(worktree, message, [
            ("Ledger-Campaign", str(c.campaign_id)), ("Ledger-Attempt", str(c.attempt_no))])
        return repository.commit_all(worktree, message,
                                     author=repository.Identity.parse(self.cls.author),
                                     committer=repository.Identity.parse(self.cls.committer))

    async def _refuse(self, touched: list[protection.Change], fingerprint: str) -> str:
        reason = (f"refused before verification: the candidate changes protected paths "
                  f"({protection.describe(touched)}); the tests and what configures them judge the "
                  f"candidate, so change the code under test instead")
        self.log.warning("candidate refused: protected paths changed", paths=[str(t) for t in touched])
        await self.journal.close()
        self._check()
        self.ending = True
        try:
            await self.kernel.refuse_candidate(self.claim.campaign_id, self.claim.generation, reason,
                                               fingerprint=fingerprint, paths=[str(t) for t in touched],
                                               timeout_s=self._budget())
        except Unavailable as exc:
            return await self._resolve(exc)
        return "failed"

    async def _context(self, base: str, worktree: Path) -> dict[str, Any]:
        """What the attempt command is told: the campaign and what failed before."""
        c = self.claim
        try:
            async with asyncio.timeout(self._budget()):
                detail = await self.reads.campaign_detail(c.campaign_id)
        except TimeoutError:
            raise Unavailable("could not read the campaign within the lease") from None
        reasons = {v.attempt_id: v.reason for v in detail.verifications if v.status == "rejected"}
        previous = [{"attempt_no": a.attempt_no, "outcome": a.outcome, "verdict": a.verdict,
                     "failure_reason": a.failure_reason or reasons.get(a.id),
                     "fingerprint": a.fingerprint}
                    for a in detail.attempts if a.attempt_no != c.attempt_no]
        return AttemptContext(  # the attempt protocol (ledger.protocol)
            campaign_id=c.campaign_id, attempt_no=c.attempt_no, generation=c.generation,
            class_=c.class_, objective_key=c.objective_key, target=c.target,
            desired_state=c.desired_state, opening_observation=c.opening_observation,
            acceptance=self.acceptance, protected=protection.patterns_of(self.acceptance),
            allow_protected_changes=bool(self.acceptance.get("allow_protected_changes")),
            commit_message_file=str(self.workdir / MESSAGE_FILE),  # type: ignore[operator]
            base_ref=self.cls.base_ref,
            base_sha=base, worktree=str(worktree), previous_attempts=previous,
            refused_fingerprints=sorted({a["fingerprint"] for a in previous if a["fingerprint"]
                                         and (a["outcome"] == "failed" or a["verdict"] == "rejected")}),
        ).model_dump(mode="json", by_alias=True)

    async def _run_command(self, worktree: Path, context_file: Path,
                           context: dict[str, Any]) -> tuple[int | None, str | None]:
        """Run the attempt command; returns (exit code, failure reason or None)."""
        c = self.claim
        values = {"campaign_file": str(context_file), "worktree": str(worktree),
                  "campaign_id": str(c.campaign_id), "attempt_no": str(c.attempt_no)}
        argv = [arg.format(**values) for arg in self.cls.attempt_command]
        env = child_environment(self.cls.attempt_environment)
        env.update(LEDGER_CAMPAIGN_FILE=str(context_file), LEDGER_CAMPAIGN_ID=str(c.campaign_id),
                   LEDGER_ATTEMPT_NO=str(c.attempt_no), LEDGER_WORKTREE=str(worktree),
                   LEDGER_OBJECTIVE=c.objective_key,
                   LEDGER_COMMIT_MESSAGE_FILE=str(self.workdir / MESSAGE_FILE))  # type: ignore[operator]
        await self.journal.event("command.started", {"argv": argv})
        self._command = asyncio.create_task(run_command(
            argv, worktree, timeout_s=self.cls.attempt_timeout_s, env=env, tail_bytes=_LOG_TAIL,
            stdin=json.dumps(context, default=str).encode(), on_output=self.journal.output))
        try:
            result = await self._command
        except asyncio.CancelledError:
            if self.stood_down.is_set():
                raise StoodDown from None
            raise
        self.log_tail = result.output
        self._check()
        await self.journal.event("command.exited", {
            "exit_code": result.exit_code, "duration_s": round(result.duration_s, 3),
            "timed_out": result.timed_out, "output_bytes": result.output_bytes})
        if result.error:
            return None, f"could not start the attempt command {argv[0]!r}: {result.error}"
        if result.timed_out:
            return result.exit_code, f"the attempt command timed out after {self.cls.attempt_timeout_s:g}s"
        if result.exit_code != 0:
            tail = result.output.strip().splitlines()[-3:]
            return result.exit_code, (f"the attempt command exited with {result.exit_code}"
                                      + (f": {' | '.join(tail)}" if tail else ""))
        return result.exit_code, None

    # -- endings ------------------------------------------------------------

    async def _fail(self, reason: str, fingerprint: str | None) -> str:
        self.log.info("attempt failed", reason=reason)
        await self.journal.close()
        self._check()
        self.ending = True
        try:
            await self.kernel.fail_attempt(self.claim.campaign_id, self.claim.generation, reason,
                                           fingerprint=fingerprint, timeout_s=self._budget())
        except Unavailable as exc:
            return await self._resolve(exc)
        return "failed"

    async def _record(self, base: str, candidate: str, diff: bytes, fingerprint: str) -> str:
        c = self.claim
        frozen = bundles.Bundle(
            campaign_id=c.campaign_id, attempt_no=c.attempt_no, generation=c.generation,
            worker=self.identity, **{"class": c.class_}, objective_key=c.objective_key,
            target=c.target, repository=str(self.cls.repository), base_ref=self.cls.base_ref,
            base_sha=base, candidate_sha=candidate, fingerprint=fingerprint,
            acceptance=self.acceptance, verifier=self.cls.verifier,
            created_at=datetime.now(timezone.utc))
        campaign_dir = bundles.evidence_dir(self.data_dir, c.campaign_id)
        _, digest = bundles.freeze(frozen, diff, campaign_dir)
        await self.journal.close()
        self._check()
        self.ending = True
        try:
            await self.kernel.record_attempt(
                c.campaign_id, c.generation, base_sha=base, candidate_sha=candidate,
                fingerprint=fingerprint, bundle=frozen.model_dump(mode="json", by_alias=True),
                bundle_digest=digest, evidence_location=str(campaign_dir),
                log_tail=self.log_tail, timeout_s=self._budget())
        except RepeatedApproach as exc:
            self.ending = False
            return await self._fail(exc.message, fingerprint)
        except Unavailable as exc:
            return await self._resolve(exc)
        self.log.info("attempt recorded", candidate=candidate, fingerprint=fingerprint)
        return "attempted"

    async def _resolve(self, exc: Unavailable) -> str:
        """The ending's reply never came, even retried within the lease: read
        the attempt back to learn whether it is in. (Nothing more is written
        either way: the lease's time is up.)"""
        self.log.warning("the ending's reply was lost; reading the attempt back",
                         error=exc.message, error_type=type(exc).__name__)
        try:
            attempt = await self.reads.attempt_of(self.claim.campaign_id, self.claim.generation)
        except LedgerError as read_error:
            self.log.error("could not read the attempt back; its ending is unknown here "
                           "(the database has it, or the reaper will record it as lost)",
                           error=read_error.message)
            return "unknown"
        outcome = attempt.outcome if attempt is not None else "running"
        self.log.info("attempt read back", outcome=outcome)
        return {"running": "stood_down"}.get(outcome, outcome)

    async def drain(self) -> None:
        """Stop now (shutdown past the drain budget): kill the command and hand
        the campaign back as ready, fenced, without using up an attempt."""
        self._kill()
        if self.stood_down.is_set() or self.ending:
            return
        self.drained = True
        self.stood_down.set()
        try:
            await self.kernel.fail_attempt(self.claim.campaign_id, self.claim.generation,
                                           "drained: the worker shut down", drained=True,
                                           timeout_s=max(self.lease.remaining(), 0.001))
            self.outcome = "drained"
        except StaleLease:
            self.outcome = "stood_down"
        except Unavailable as exc:
            self.outcome = await self._resolve(exc)
