"""The independent verifier (README "What a candidate is judged by"): claims attempted campaigns, checks
each candidate on a fresh export of its tree, records a verdict.

The design at length: docs/internals.md (``ledger.roles.verifier``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from ledger import tracing, verifiers
from ledger.db.documents import ApprovalPolicy, InvalidDocument, Observation
from ledger.db.hub import WakeSource
from ledger.db.kernel import Kernel
from ledger.db.models import VerificationClaim
from ledger.db.reads import Reads
from ledger.errors import LedgerError, StaleLease, Unavailable
from ledger.git import bundle as bundles
from ledger.git import protection
from ledger.git.repository import GitError, Repository, changed_paths, diff_lines, file_at
from ledger.git.repository import diff as repository_diff
from ledger.git.screen import Screen
from ledger.git.screen import describe as describe_findings
from ledger.identity import process_identity
from ledger.logs import get_logger
from ledger.roles.lease import LeaseClock
from ledger.runtime import seams
from ledger.runtime.registry import Registration, held, utcnow
from ledger.runtime.service import Loop, Stopped
from ledger.sandbox import cell as cells
from ledger.sandbox import guise as guises
from ledger.settings import default
from ledger.verifiers.judge import CONFIG_FILES
from ledger.verifiers.pytest_report import pytest_command
from ledger.verifiers.spec import AcceptanceSpec, HeldOut

T = TypeVar("T")

#: The seam before a verdict is recorded (a drill stops a verifier there).
BEFORE_VERDICT = "verifier.before_verdict"

Outcome = Literal["accepted", "rejected", "stale", "released"]
#: How much of the diff a reviewer is shown.
REVIEW_DIFF_LIMIT = 512 * 1024


def _config_files(repo: Path, base: str) -> dict[str, bytes]:
    """The base commit's root pytest configuration files (what the judge reads)."""
    found = {}
    for name in CONFIG_FILES:
        content = file_at(repo, base, name)
        if content is not None:
            found[name] = content[:1 << 20]
    return found


#: How many changed paths a verdict lists (the approval's paths condition
#: asks a person when there were more, and none listed matched).
CHANGE_PATHS_LIMIT = 500


def _measured(repo: Path, base: str, candidate: str, diff: bytes,
              protected: Sequence[protection.Change]) -> dict[str, Any]:
    """The candidate's change as an approval policy judges it (the verdict's
    ``evidence.change``): the paths it touches, the lines its diff adds and
    removes, and the protected paths it changes."""
    paths = changed_paths(repo, base, candidate)
    added, removed = diff_lines(diff)
    return {"files": len(paths), "lines": added + removed, "added": added, "removed": removed,
            "paths": paths[:CHANGE_PATHS_LIMIT], "paths_truncated": len(paths) > CHANGE_PATHS_LIMIT,
            "protected": [str(c) for c in protected][:CHANGE_PATHS_LIMIT]}


class CheckFailed(LedgerError):
    """A check could not be completed for reasons outside the candidate; no
    verdict is recorded and the verification is left to lapse."""

    slug = "check-failed"
    http_status = 502
    exit_code = 13


@dataclass(frozen=True)
class _Judgement:
    accepted: bool
    reason: str | None
    evidence: dict[str, Any]


def _rejected(evidence: dict[str, Any], reason: str, **more: Any) -> _Judgement:
    return _Judgement(False, reason, {**evidence, **more})


@dataclass(frozen=True)
class _Plan:
    """What judges a candidate, read from its spec before anything runs."""

    spec: AcceptanceSpec
    acceptance: verifiers.Acceptance
    screen: Screen
    implementation: verifiers.Implementation
    verifier_name: str
    runs_commands: bool


async def _blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking ``fn`` in a thread. If we are cancelled meanwhile, wait for
    the thread before re-raising: the caller's cleanup (removing the checkout)
    must not race a clone still writing into it."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


class Verifier(Loop):
    """A verifier runtime acting through ``kernel`` (a session as the
    ``verifier`` role). ``run_once`` verifies one waiting candidate; ``run``
    keeps verifying until stopped, idling on ``ledger_attempted`` wake-ups
    with a poll tick of ``poll_s``."""

    name = "verifier"
    wake_channel = "ledger_attempted"
    #: a verifier implementation may raise anything; one bad pass must not
    #: end the verifier
    survives = (Exception,)

    def __init__(
        self,
        kernel: Kernel,
        *,
        identity: str | None = None,
        model_family: str = default("model_family"),
        classes: Sequence[str] | None = None,
        lease_s: float = default("verification_lease_s"),
        heartbeat_s: float | None = None,
        poll_s: float = default("poll_s"),
        hub: WakeSource | None = None,
        data_dir: Path | None = None,
        work_dir: Path | None = None,
        kinds: Sequence[str] | None = None,
        needs_cell: bool = True,
        pause: seams.Pause | None = None,
    ):
        super().__init__(poll_s, hub=hub)
        if lease_s <= 0:
            raise ValueError(f"verification lease must be positive, not {lease_s}")
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else lease_s / 3
        if not 0 < self.heartbeat_s < lease_s:
            raise ValueError(f"heartbeat ({self.heartbeat_s}s) must be positive and shorter than "
                             f"the lease ({lease_s}s), or every verification lapses mid-check")
        self.kernel = kernel
        self.reads = Reads(kernel.executor)
        #: awaited at the seams a drill may stop the process at (BEFORE_VERDICT)
        self.pause = pause if pause is not None else seams.installed()
        self.identity = identity or process_identity("verifier")
        self.model_family = model_family
        self.classes = list(classes) if classes else None
        #: the verdicts of a quorum this verifier gives (verifier kinds; None: any)
        self.kinds = list(kinds) if kinds else None
        self.lease_s = lease_s
        self.cache_dir = data_dir / "repos" if data_dir is not None else None
        self.work_dir = work_dir
        self.log = get_logger(self.name, verifier=self.identity, model_family=model_family)
        self.verdicts: dict[Outcome, int] = {"accepted": 0, "rejected": 0, "stale": 0, "released": 0}
        #: the verification being checked, for the registry of processes
        self.holding: dict[int, dict[str, Any]] = {}
        self.registration = Registration(kernel, "verifier", self.name, self.identity, poll_s,
                                         holds=lambda: list(self.holding.values()))
        #: whether its checks run in a cell (false only where every class it
        #: serves opted its acceptance out: ``ledger run`` knows its classes)
        self.needs_cell = needs_cell

    # --- one verification ----------------------------------------------------

    async def claim(self) -> VerificationClaim | None:
        """Claim the next candidate waiting for a verdict, or ``None``."""
        return await self.kernel.claim_verification(
            self.identity, model_family=self.model_family, lease_s=self.lease_s,
            classes=self.classes, kinds=self.kinds)

    async def run_once(self) -> int:
        """Claim and verify one candidate; 1 if there was one, else 0."""
        sent = LeaseClock.now()
        claim = await self.claim()
        if claim is None:
            return 0
        self.holding[claim.verification_id] = held(
            "verification", claim.verification_id, utcnow(), campaign=claim.campaign_id,
            attempt=claim.attempt_no)
        try:
            await self.verify(claim, sent_at=sent)
        finally:
            self.holding.pop(claim.verification_id, None)
        return 1

    async def drain(self) -> int:
        """Verify candidates until none is waiting; returns how many."""
        done = 0
        while await self.run_once():
            done += 1
        return done

    async def verify(self, claim: VerificationClaim, *, sent_at: float | None = None) -> Outcome:
        """Check a claimed candidate, keeping the claim alive meanwhile, and
        record the verdict. ``"stale"``: the claim was lost (or could not be
        confirmed before its local deadline: ``ledger.roles.lease``), nothing written.
        ``sent_at`` is the local time the claim was sent (default: now)."""
        return await tracing.traced(
            tracing.VERIFICATION_SPAN, self.kernel.executor, claim.campaign_id,
            {tracing.CAMPAIGN_CLASS: claim.class_, tracing.GENERATION: claim.generation,
             tracing.ATTEMPT_NO: claim.attempt_no, tracing.VERIFICATION_ID: claim.verification_id,
             tracing.VERIFICATION_KIND: claim.kind, tracing.VERIFIER: self.identity},
            self._verify(claim, sent_at=sent_at))

    async def _verify(self, claim: VerificationClaim, *, sent_at: float | None) -> Outcome:
        log = self.log.bind(campaign=claim.campaign_id, attempt=claim.attempt_no,
                            verification=claim.verification_id)
        log.info("verification started", candidate=claim.candidate_sha, worker=claim.worker)
        lease = LeaseClock()
        lease.confirm(LeaseClock.now() if sent_at is None else sent_at, claim.lease_remaining_s)
        check = asyncio.create_task(self._check(claim), name=f"check {claim.verification_id}")
        beat = asyncio.create_task(self._keep_alive(claim.verification_id, log, lease),
                                   name=f"heartbeat {claim.verification_id}")
        try:
            await asyncio.wait({check, beat}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (check, beat):
                if not task.done():
                    task.cancel()
            await asyncio.gather(check, beat, return_exceptions=True)
        if not check.done() or check.cancelled():
            # The heartbeat ended first: the verification is no longer ours.
            log.warning("verification went stale mid-check; stopped, nothing recorded")
            self.verdicts["stale"] += 1
            return "stale"
        try:
            judgement = check.result()
        except CheckFailed as exc:
            # No verdict, nothing charged: the verification is released, the
            # campaign says why it waits and is verified again after a pause.
            log.warning("check could not complete for a reason that is not the candidate's; "
                        "released, no verdict", error=exc.message)
            try:
                await self.kernel.release_verification(claim.verification_id, exc.message[:4000],
                                                       timeout_s=max(lease.remaining(), 0.001))
            except (StaleLease, Unavailable) as release_error:
                log.warning("could not release the verification; it lapses instead",
                            error=release_error.message)
            self.verdicts["released"] += 1
            return "released"
        await self.pause(BEFORE_VERDICT)
        try:
            if lease.lapsed:
                raise StaleLease("the verification lease lapsed by the verifier's own clock")
            if judgement.accepted:
                await self.kernel.accept(claim.verification_id, judgement.evidence,
                                         timeout_s=lease.remaining())
            else:
                assert judgement.reason is not None
                await self.kernel.reject(claim.verification_id, judgement.reason, judgement.evidence,
                                         timeout_s=lease.remaining())
        except StaleLease as exc:
            log.warning("verification went stale before its verdict; nothing recorded",
                        error=exc.message)
            self.verdicts["stale"] += 1
            return "stale"
        except Unavailable as exc:
            # Retried (verdicts are idempotent) until the lease's local
            # deadline: whether it is in, the campaign's row says; if not,
            # the verification lapses and the candidate is checked again.
            log.warning("the verdict could not be confirmed within the verification lease",
                        error=exc.message, error_type=type(exc).__name__)
            self.verdicts["stale"] += 1
            return "stale"
        outcome: Outcome = "accepted" if judgement.accepted else "rejected"
        self.verdicts[outcome] += 1
        log.info(f"candidate {outcome}", reason=judgement.reason)
        return outcome

    async def _keep_alive(self, verification_id: int, log: Any, lease: LeaseClock) -> None:
        """Extend the verification's lease until cancelled; return when it is
        stale, or when no renewal was confirmed before its local deadline."""
        wait = self.heartbeat_s
        while True:
            await asyncio.sleep(max(min(wait, lease.remaining()), 0.0))
            if lease.lapsed:
                log.warning("verification lease not confirmed before its local deadline: "
                            "stopping the check (self-fenced)")
                return
            sent = LeaseClock.now()
            try:
                renewed = await self.kernel.heartbeat_verification(
                    verification_id, self.lease_s, timeout_s=lease.remaining())
            except StaleLease:
                return
            except Exception as exc:  # a database hiccup: try again soon, until the deadline
                log.warning("verification heartbeat failed", error=str(exc))
                wait = min(0.5, self.heartbeat_s)
                continue
            lease.confirm(sent, renewed.lease_remaining_s)
            wait = self.heartbeat_s

    async def _check(self, claim: VerificationClaim) -> _Judgement:
        """Everything between the claim and the verdict: the bundle opened,
        the plan (spec, verifier, acceptance), the run on a fresh checkout,
        the verdict."""
        evidence: dict[str, Any] = {
            "verifier": self.identity, "model_family": self.model_family,
            "attempt_no": claim.attempt_no, "worker": claim.worker,
            "bundle_digest": claim.bundle_digest, "candidate_sha": claim.candidate_sha,
        }
        frozen = self._opened(claim, evidence)
        if isinstance(frozen, _Judgement):
            return frozen
        plan = await self._plan(claim, frozen, evidence)
        if isinstance(plan, _Judgement):
            return plan
        # (a name that says nothing: a cell's mounts show where they come from)
        scratch = Path(await _blocking(tempfile.mkdtemp, None, None, self.work_dir))
        try:
            ran = await self._judge_checkout(claim, frozen, plan, scratch, evidence)
        finally:
            await _blocking(shutil.rmtree, scratch, True)
        if isinstance(ran, _Judgement):
            return ran
        verdict, changed = ran
        return await self._verdict(claim, verdict, changed, evidence)

    def _opened(self, claim: VerificationClaim, evidence: dict[str, Any]
                ) -> bundles.Bundle | _Judgement:
        """The claim's bundle, verified against its digest and the claim;
        else a rejection (or ``CheckFailed``: nothing to judge at all)."""
        try:
            frozen = bundles.verify(claim.bundle, claim.diff, claim.bundle_digest)
        except bundles.BundleTampered as exc:
            if not claim.bundle or not claim.bundle_digest:
                # Nothing to judge is no verdict on the candidate: the
                # campaign waits, visibly, for someone to look.
                raise CheckFailed(exc.message) from exc
            return _rejected(evidence, f"bundle tampered: {exc.message}", bundle_error=exc.message)
        except ValueError as exc:  # the digest matched, but it is not a bundle
            return _rejected(evidence, f"bundle unreadable: {exc}")
        mismatch = [f"{name} {mine!r} != {theirs!r}" for name, mine, theirs in (
            ("campaign", frozen.campaign_id, claim.campaign_id),
            ("attempt", frozen.attempt_no, claim.attempt_no),
            ("candidate", frozen.candidate_sha, claim.candidate_sha),
            ("base", frozen.base_sha, claim.base_sha or frozen.base_sha),
        ) if mine != theirs]
        if mismatch:
            return _rejected(evidence, "bundle does not describe this attempt: " + "; ".join(mismatch))
        return frozen

    async def _plan(self, claim: VerificationClaim, frozen: bundles.Bundle,
                    evidence: dict[str, Any]) -> _Plan | _Judgement:
        """What judges the candidate: the spec (loaded once, here), the
        acceptance it makes, the screen and the verifier implementation."""
        try:
            spec, verifier_name, baseline = await self._judged_by(claim, frozen)
        except ValueError as exc:
            return _rejected(evidence, f"invalid acceptance spec: {exc}", kind=claim.kind,
                             repository=frozen.repository, base_sha=frozen.base_sha)
        evidence.update(implementation=verifier_name, kind=claim.kind, repository=frozen.repository,
                        base_sha=frozen.base_sha, candidate_ref=claim.candidate_ref)
        runs_commands = verifier_name != "review"
        try:
            acceptance = verifiers.Acceptance.from_spec(spec, baseline, require_commands=runs_commands)
            screen = Screen(spec.screen.model_dump())
        except (verifiers.InvalidAcceptance, ValueError) as exc:
            return _rejected(evidence, f"invalid acceptance spec: {exc}")
        try:
            implementation = verifiers.load(verifier_name)
        except verifiers.UnknownVerifier as exc:
            # A verifier that is not installed here is this host's fault,
            # not the candidate's: no verdict, the campaign waits, saying why.
            raise CheckFailed(str(exc)) from exc
        if acceptance.sandboxed:
            try:
                await _blocking(cells.check_available)
            except cells.SandboxUnavailable as exc:
                raise CheckFailed(f"{exc.message} ({exc.hint})") from exc
        return _Plan(spec, acceptance, screen, implementation, verifier_name, runs_commands)

    async def _judge_checkout(self, claim: VerificationClaim, frozen: bundles.Bundle, plan: _Plan,
                   scratch: Path, evidence: dict[str, Any]
                   ) -> tuple[verifiers.Verdict, list[protection.Change]] | _Judgement:
        """Fetch the candidate, screen its diff, check out its tree (the
        protected paths as the base has them) in ``scratch`` and run the
        verifier on it: its verdict and the protected paths it changed."""
        repo = await self._fetched(claim, frozen)
        # Before anything runs: the diff as the repository has it (not as
        # the worker recorded it), screened for reaching into the judge.
        diff = await _blocking(repository_diff, repo.path, frozen.base_sha, frozen.candidate_sha)
        screened = await self._screened(repo, frozen, plan, diff, evidence)
        if isinstance(screened, _Judgement):
            return screened
        changed = screened
        checkout, outputs = scratch / "checkout", scratch / "out"
        try:
            # The judge's tree: the candidate's, with the protected paths
            # as the base has them; no .git (nothing in it to run).
            await _blocking(lambda: repo.export_tree(
                frozen.candidate_sha, checkout, replace_from=frozen.base_sha,
                paths=sorted({c.path for c in changed})))
        except GitError as exc:
            raise CheckFailed(f"cannot check out the candidate: {exc.message}") from exc
        outputs.mkdir()
        evidence["checked_out_sha"] = frozen.candidate_sha
        # pytest's configuration is the base's, never the candidate's
        config_files = await _blocking(_config_files, repo.path, frozen.base_sha)
        acceptance = dataclasses.replace(plan.acceptance.with_outputs(outputs), config_files=config_files,
                                         project=guises.project_name(frozen.repository))
        if plan.spec.held_out is not None and plan.runs_commands:
            acceptance = await _blocking(self._held_out, plan.spec.held_out, checkout, acceptance,
                                         scratch)
            evidence["held_out"] = {"into": acceptance.held_out}
        if not plan.runs_commands:
            acceptance = dataclasses.replace(acceptance, context=await self._context(
                claim, diff, evidence))
        try:
            verdict = await plan.implementation.verify(checkout, acceptance)
        except Exception as exc:
            raise CheckFailed(f"verifier {plan.verifier_name!r} failed: {exc!r}") from exc
        return verdict, changed

    async def _fetched(self, claim: VerificationClaim, frozen: bundles.Bundle) -> Repository:
        """The bundle's repository with the candidate in it (``CheckFailed``:
        a fault of the repository, never the candidate's)."""
        repo = Repository(frozen.repository, cache_dir=self.cache_dir)
        try:
            await _blocking(repo.fetch, *[r for r in (claim.candidate_ref,) if r])
        except GitError as exc:
            raise CheckFailed(f"cannot fetch the candidate: {exc.message}") from exc
        if not await _blocking(repo.has_commit, frozen.candidate_sha):
            # It was published before it was recorded: gone now is a
            # fault of the repository (or of gc), never the candidate's.
            raise CheckFailed(f"candidate commit {frozen.candidate_sha} is not in "
                              f"{frozen.repository} ({claim.candidate_ref or 'no published ref'})")
        return repo

    async def _screened(self, repo: Repository, frozen: bundles.Bundle, plan: _Plan, diff: bytes,
                        evidence: dict[str, Any]) -> list[protection.Change] | _Judgement:
        """The screen's findings (a rejection if any) and the protected paths
        the candidate changed (restored from the base, unless the spec allows
        changing them), with the change measured for the approval policy."""
        findings = plan.screen.findings(diff) if plan.screen.enabled else []
        protected = protection.Protection.of(plan.spec.model_dump())
        touched = await _blocking(protected.changes, repo.path, frozen.base_sha, frozen.candidate_sha)
        # what a class's approval policy asks about (docs/approval.md), measured here
        # from the repository, never from what the worker recorded
        evidence["change"] = await _blocking(_measured, repo.path, frozen.base_sha,
                                             frozen.candidate_sha, diff, touched)
        changed: list[protection.Change] = []
        if not plan.spec.allow_protected_changes:
            changed = touched
            evidence["protected_restored"] = [str(c) for c in changed]
            # a protected path is restored and refused as such, below
            findings = [f for f in findings if not protected.covers(f.path)]
        evidence["screen"] = [f.evidence() for f in findings]
        if findings:
            return _rejected(evidence, describe_findings(findings))
        return changed

    async def _verdict(self, claim: VerificationClaim, verdict: verifiers.Verdict,
                       changed: list[protection.Change], evidence: dict[str, Any]) -> _Judgement:
        """The judgement the verifier's verdict makes, all things considered."""
        if verdict.accepted and verdict.evidence.get("needs_human") and not await self._asks_a_person(claim):
            # A verifier that cannot decide lets nothing through on its own:
            # only a class whose approval routes such a verdict to a person
            # (quorum_split, or always) takes it as an acceptance.
            return _rejected(evidence, f"the {claim.kind} verifier asks for a person "
                             f"({str(verdict.evidence['needs_human'])[:300]}), and class {claim.class_} "
                             "asks none for that (approval: always, or when quorum_split)",
                             **verdict.evidence)
        if changed:
            # Judged with the base's tests, but it would land its own: never
            # accepted, whatever the run said (which the next attempt is told).
            outcome = "passed" if verdict.accepted else f"failed: {verdict.reason}"
            return _rejected(evidence, f"the candidate changes protected paths: "
                             f"{protection.describe(changed)} (with them restored from the base, "
                             f"the acceptance {outcome})", **verdict.evidence)
        evidence.update(verdict.evidence)
        if verdict.accepted:  # the landed commit's Ledger-Verdict trailer quotes it
            evidence.setdefault("summary", "acceptance passed")
        return _Judgement(verdict.accepted, verdict.reason, evidence)

    async def _asks_a_person(self, claim: VerificationClaim) -> bool:
        """Whether the claim's class sends a verdict that asks for a person
        to one (its approval policy: always, or a quorum_split condition)."""
        policy = ApprovalPolicy.load((await self.reads.campaign_class(claim.class_)).approval)
        return policy.asks_on_quorum_split()

    def _held_out(self, spec: HeldOut, checkout: Path, acceptance: verifiers.Acceptance,
                  scratch: Path) -> verifiers.Acceptance:
        """Stage the class's held-out tests for their own commands (a copy of
        the verifier's, outside the checkout: put at ``into`` -- read-only,
        in a cell -- only while those commands run, never while the
        candidate's own tests do), remove whatever the candidate has at
        ``into``, and add the commands that run them. Where they come from
        is the verifier's to read: a directory of this host, or a repository
        fetched with this verifier's credentials. Not finding them is this
        host's fault, never the candidate's."""
        into = spec.into.strip("/")
        subdir = spec.subdir.strip("/")
        target = checkout / into
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        staged = scratch / "held"
        if spec.repository:
            source_repo = Repository(spec.repository, cache_dir=self.cache_dir)
            fetched = scratch / "fetched"
            try:
                sha = source_repo.resolve(spec.ref)
                source_repo.export_tree(sha, fetched)
            except GitError as exc:
                raise CheckFailed(f"cannot fetch the held-out acceptance: {exc.message}") from exc
            source = fetched / subdir if subdir else fetched
        else:
            source = Path(str(spec.path)) / subdir if subdir else Path(str(spec.path))
        if not source.is_dir():
            raise CheckFailed(f"the held-out acceptance {source} is not a directory on this verifier")
        shutil.copytree(source, staged, symlinks=False)
        staged.chmod(0o755)
        commands = [list(c) for c in spec.commands]
        if not commands:
            first = next((c for c in acceptance.commands if pytest_command(c) is not None), None)
            if first is None:
                raise CheckFailed("held-out acceptance without commands needs a pytest acceptance command")
            command = pytest_command(first)
            assert command is not None
            commands = [[*command[:3], "-q", "-p", "no:cacheprovider", into]]
        return acceptance.with_held_out(into, commands, staged)

    async def _context(self, claim: VerificationClaim, diff: bytes,
                       evidence: dict[str, Any]) -> dict[str, Any]:
        """What a reviewer is shown: the objective, the diff, the verdicts so far."""
        detail = await self.reads.campaign_detail(claim.campaign_id)
        earlier = [{"kind": v.kind, "verifier": v.verifier, "model_family": v.model_family,
                    "status": v.status, "reason": v.reason, "summary": v.evidence.get("summary"),
                    "evidence": v.evidence}
                   for v in detail.verifications
                   if v.attempt_id == claim.attempt_id and v.status == "accepted"]
        campaign = detail.campaign
        return {"campaign_id": claim.campaign_id, "attempt_no": claim.attempt_no,
                "objective_key": claim.objective_key, "target": claim.target,
                "desired_state": campaign.desired_state,
                "opening_observation": campaign.opening_observation,
                "diff": diff[:REVIEW_DIFF_LIMIT].decode("utf-8", errors="replace"),
                "diff_truncated": len(diff) > REVIEW_DIFF_LIMIT,
                "candidate_sha": claim.candidate_sha, "base_sha": claim.base_sha,
                "verdicts": earlier, "screen": evidence.get("screen", [])}

    async def _judged_by(self, claim: VerificationClaim, frozen: bundles.Bundle
                         ) -> tuple[AcceptanceSpec, str, verifiers.Baseline | None]:
        """The acceptance spec (loaded here, from the row), the verifier
        implementation and the baseline a candidate is judged by: the
        campaign's criteria and its class's verifier (what the operator
        registered), the bundle's only for a class registered without
        acceptance commands; the baseline from the observation that opened
        the campaign. ``ValueError`` for a stored spec that is not one."""
        campaign = await self.reads.campaign(claim.campaign_id)
        try:
            opening = Observation.load(campaign.opening_observation)
            baseline = verifiers.Baseline.from_tests(opening.details.tests)
        except InvalidDocument:  # an observation not as this release writes them: no baseline
            baseline = None
        criteria = AcceptanceSpec.stored(campaign.acceptance_criteria)
        if criteria.commands or claim.kind == "review":
            # the kind of the class's quorum this verification is for
            return criteria, claim.kind, baseline
        return AcceptanceSpec.stored(frozen.acceptance), frozen.verifier, baseline

    # --- the loop ------------------------------------------------------------

    async def one_pass(self, stop: asyncio.Event) -> int:
        """Verify every waiting candidate. Stopping mid-check kills the check
        and records nothing: the short verification lease lapses and another
        verifier takes over."""
        try:
            return await self.unless_stopped(asyncio.ensure_future(self.drain()), stop)
        except Stopped:
            self.log.info("stopped mid-check; the verification is left to lapse")
            raise

    async def prepare(self) -> None:
        """Its start-up check: acceptance runs in a cell, so a host that
        cannot build one says so now (``SandboxUnavailable``: the host waits
        until it can, ``ledger.runtime.startup``)."""
        if self.needs_cell:
            await asyncio.to_thread(cells.check_available)

    async def run(self, stop: asyncio.Event) -> None:
        """Verify until ``stop`` is set. Waiting candidates are drained, then the
        verifier idles until a ``ledger_attempted`` wake-up or its poll tick."""
        await self.prepare()
        self.log.info("verifier started", classes=self.classes, lease_s=self.lease_s)
        await super().run(stop)
        self.log.info("verifier stopped", **self.verdicts)
