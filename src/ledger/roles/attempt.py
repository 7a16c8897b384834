"""One attempt (README "What a lease guarantees", "The attempt cell"): a workspace of its own, the
class's attempt command run there in a cell (``ledger.sandbox.cell``), a lease kept
alive by heartbeats, the candidate taken out, checked and published by the
trusted worker, and exactly one ending written -- or nothing at all when the
lease was lost.

The design at length: docs/internals.md (``ledger.roles.attempt``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ledger.backoff import backoff
from ledger.config import ATTEMPT_PLACEHOLDERS, CampaignClassConfig
from ledger.db.documents import InvalidDocument, Observation
from ledger.db.hub import NullHub, WakeSource
from ledger.db.kernel import Kernel
from ledger.db.models import Claim
from ledger.db.reads import Reads
from ledger.errors import ConfigError, LedgerError, RepeatedApproach, StaleLease, Unavailable
from ledger.git import bundle as bundles
from ledger.git import protection, repository
from ledger.git.repository import GitError, Identity, Repository
from ledger.logs import get_logger
from ledger.protocol import AttemptContext, PreviousAttempt
from ledger.roles.journal import JournalWriter
from ledger.roles.lease import LeaseClock
from ledger.roles.sensors import Reobservation
from ledger.roles.usage import UsageReporter
from ledger.sandbox import cell as cells
from ledger.sandbox.processes import (
    CommandResult,
    cell_environment,
    child_environment,
    run_command,
)
from ledger.sandbox.redaction import redactor
from ledger.settings import inherited_environment
from ledger.verifiers.spec import AcceptanceSpec

_LOG_TAIL = 16 * 1024
#: Refused destinations recorded one security event each (the rest with the last).
_REFUSALS_KEPT = 20
OWNER_FILE = "owner.json"
MESSAGE_FILE = "commit-message.txt"
BUNDLE_FILE = "candidate.bundle"
_MESSAGE_LIMIT = 64 * 1024
#: How long the step that commits what the command left and bundles it may take.
FINISH_TIMEOUT_S = 120.0

# Run in the attempt's cell after its command: commit what it left (hooks
# off: an agent's pre-commit hook has had its turn) and write its commits
# since the base as a bundle, the only thing the worker takes out.
_FINISH = """set -eu
cd /cell/work
git -c core.hooksPath=/dev/null -c core.fsmonitor=false add --all
if ! git -c core.hooksPath=/dev/null diff --cached --quiet; then
  git -c core.hooksPath=/dev/null -c commit.gpgSign=false commit --quiet --no-verify \
      -m "ledger: what the attempt left uncommitted"
fi
if [ "$(git rev-parse HEAD)" != "$LEDGER_BASE_SHA" ]; then
  git bundle create --quiet /cell/out/candidate.bundle "$LEDGER_BASE_SHA..HEAD" 2>&1
fi
"""


@dataclass(frozen=True)
class Workspace:
    """One attempt's directory on the worker's disk: ``work/`` (the clone),
    ``out/`` (what the command hands back) and the campaign file, with an
    owner record so that a worker killed mid-attempt has it swept by the
    next one on this host."""

    root: Path

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def campaign_file(self) -> Path:
        return self.root / "campaign.json"

    def bindings(self) -> tuple[cells.Binding, ...]:
        """What of it a cell sees, and where."""
        return (cells.Binding(self.work, cells.INSIDE_WORK, writable=True),
                cells.Binding(self.out, cells.INSIDE_OUT, writable=True),
                cells.Binding(self.campaign_file, f"{cells.INSIDE_ROOT}/campaign.json"))

    def seen(self, sandboxed: bool) -> Seen:
        """The paths as the attempt command sees them."""
        if sandboxed:
            return Seen(cells.INSIDE_WORK, cells.INSIDE_OUT, f"{cells.INSIDE_ROOT}/campaign.json")
        return Seen(str(self.work), str(self.out), str(self.campaign_file))


@dataclass(frozen=True)
class Seen:
    """An attempt's paths as its command sees them (in its cell, or not)."""

    worktree: str
    out: str
    campaign_file: str


def make_workdir(data_dir: Path, claim: Claim, repository_location: str) -> Workspace:
    """A private directory for one attempt (see ``Workspace``)."""
    root = data_dir / "attempts"
    root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{claim.campaign_id}-{claim.attempt_no}-", dir=root))
    (workdir / OWNER_FILE).write_text(json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(), "repository": repository_location}))
    workspace = Workspace(workdir)
    workspace.out.mkdir()
    return workspace


def remove_tree(path: Path) -> None:
    """Remove a workspace whatever the attempt did to its modes (a directory
    it made unreadable is opened up first); links are removed, never
    followed."""
    def opened_up(function: Any, name: str, _exc: Any) -> None:
        try:
            parent = os.path.dirname(name)
            os.chmod(parent, 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
                shutil.rmtree(name, ignore_errors=True)
            else:
                os.unlink(name)
        except OSError:
            pass
    shutil.rmtree(path, onerror=opened_up)  # onerror: deprecated in 3.12 for onexc, but 3.11 is supported


def sweep_orphans(data_dir: Path) -> int:
    """Remove the workspaces of dead workers on this host."""
    removed = 0
    for workdir in sorted((data_dir / "attempts").glob("*")):
        try:
            owner = json.loads((workdir / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if owner.get("host") != socket.gethostname() or _alive(int(owner.get("pid", 0))):
            continue
        remove_tree(workdir)
        removed += 1
    return removed


def read_handed_back(path: Path, limit: int) -> bytes | None:
    """A file an attempt left for the worker, read safely: only a regular
    file, never through a link (a link to the worker's secrets would carry
    them into the candidate), at most ``limit`` bytes; ``None`` if there is
    no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit)
    finally:
        os.close(fd)


def surfaces_digest(repository_location: str, config_file: Path | None) -> dict[str, str]:
    """What an attempt must never change, as digests: the local repository's
    configuration and hooks, and Ledger's configuration file. Compared at the
    claim and at the ending."""
    found: dict[str, str] = {}
    candidates: list[Path] = []
    if "://" not in repository_location and not repository_location.startswith("git@"):
        repo = Path(repository_location)
        git_dir = repo / ".git" if (repo / ".git").is_dir() else repo
        candidates += [git_dir / "config", git_dir / "info" / "attributes"]
        hooks = git_dir / "hooks"
        if hooks.is_dir():
            candidates += sorted(p for p in hooks.iterdir() if p.is_file())
    if config_file is not None:
        candidates.append(config_file)
    for path in candidates:
        try:
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            found[str(path)] = "absent"
    return found


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
#: How long past its lease's local deadline a lease's one ending (or its hand
#: back) is still tried while the database does not answer: the database's
#: own fence decides whether it counts, and a database that restarted gives
#: every lease in flight its length again (ledger.restart_grace).
ENDING_PATIENCE_S = 300.0
#: How long one try of an ending may wait for its reply once the lease's own
#: time is up.
ENDING_TRY_S = 5.0


class AttemptRun:
    """Runs one claimed attempt to its single ending."""

    def __init__(self, kernel: Kernel, claim: Claim, cls: CampaignClassConfig, *, identity: str,
                 data_dir: Path, hub: WakeSource | None = None, lease: LeaseClock | None = None,
                 config_file: Path | None = None, reobservation: Reobservation | None = None):
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
        #: the usage the command reports (LEDGER_USAGE lines: ledger.protocol.UsageReport)
        self.usage = UsageReporter(kernel, claim.campaign_id, claim.generation, self.journal.event)
        self.stood_down = asyncio.Event()
        self.self_fenced = False
        self._command: asyncio.Task[CommandResult] | None = None
        self.outcome = "running"
        self.ending = False  # the single ending is being written: a stale heartbeat is expected
        self.drained = False
        self.workspace: Workspace | None = None
        self.config_file = config_file
        #: the class's sensor, to look at the target again (None: no sensor watches it)
        self.reobservation = reobservation
        self.log_tail = ""
        self.sandboxed = cls.cell.sandbox
        #: what the attempt was seen to try outside its cell: (action, reason, details)
        self.security: list[tuple[str, str, dict[str, Any]]] = []
        # Ledger's secrets, and the values the class passes on to the command
        # from Ledger's environment (an agent's key), kept out of its output.
        inherited = inherited_environment()
        passed = [inherited[e] for e in cls.attempt_environment if "=" not in e and e in inherited]
        self.redactor = redactor(extra=passed)

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
        # Cancelling the command kills its whole process group (ledger.sandbox.processes).
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
        """Run the attempt; returns its outcome (attempted, failed, released,
        stood_down, drained)."""
        keeper = asyncio.create_task(self._keep_lease(), name=f"lease-{self.claim.campaign_id}")
        workspace: Workspace | None = None
        try:
            # inside the try: a claim whose attempt cannot even get a
            # directory is handed back below, never held by heartbeats alone
            workspace = self.workspace = make_workdir(self.data_dir, self.claim, self.cls.repository)
            repo = Repository(self.cls.repository, cache_dir=self.data_dir / "repos")
            self.outcome = await self._attempt(repo, workspace)
        except (StoodDown, StaleLease):
            if self.self_fenced and not self.drained:
                # stopped by its own clock, the database out of reach: not the
                # attempt's fault -- handed back once the database answers
                self.outcome = await self._hand_back("the database was out of reach until the lease's "
                                                     "local deadline: the attempt was stopped")
            else:
                self.outcome = "drained" if self.drained else "stood_down"
        except Unavailable as exc:
            # Every call is bounded by the lease's remaining time: the
            # database stayed out of reach until the lease's local deadline
            # (a start, an event or a read that could not be written).
            self.log.warning("the database stayed unreachable for the rest of the lease",
                             error=exc.message)
            self._fence_self()
            self.outcome = await self._hand_back(f"the database was out of reach: {exc.message}")
        except asyncio.CancelledError:
            self._kill()
            raise
        except Exception as exc:  # noqa: BLE001 -- Ledger's own crash is no verdict on the attempt
            self.log.exception("the attempt crashed in Ledger's own code; releasing it")
            self.outcome = await self._release(f"Ledger's worker failed: {type(exc).__name__}: {exc}")
        finally:
            keeper.cancel()
            self._kill()
            if workspace is not None:
                await asyncio.to_thread(remove_tree, workspace.root)
        self.log.info("attempt ended", outcome=self.outcome)
        return self.outcome

    def _check(self) -> None:
        if self.stood_down.is_set() or self.journal.fenced:
            raise StoodDown

    async def _attempt(self, repo: Repository, workspace: Workspace) -> str:
        c = self.claim
        branch = f"ledger/{c.campaign_id}/{c.attempt_no}"
        ref = f"refs/heads/{branch}"
        author = Identity.parse(self.cls.author)
        if self.sandboxed:
            try:
                await asyncio.to_thread(cells.check_available)
            except cells.SandboxUnavailable as exc:
                return await self._release(f"{exc.message} ({exc.hint})")
        if self._opened_a_while_ago():
            # No agent paid to fix what is not broken: the target, observed
            # once more before anything starts.
            dismissed = await self._reobserve("before_start")
            if dismissed is not None:
                return dismissed
        before = await asyncio.to_thread(surfaces_digest, self.cls.repository, self.config_file)
        try:
            base = await asyncio.to_thread(repo.resolve, self.cls.base_ref)
            await asyncio.to_thread(repo.seed_workspace, workspace.work, base, branch, author)
        except GitError as exc:
            self._check()
            return await self._release(f"could not prepare the attempt's workspace: {exc.message}")
        await self.journal.event("attempt.started", {
            "attempt_no": c.attempt_no, "worker": self.identity, "base_sha": base, "branch": branch,
            "sandboxed": self.sandboxed, "network": self.cls.cell.network if self.sandboxed else "host"})
        context = await self._context(base, workspace)
        workspace.campaign_file.write_text(json.dumps(context, indent=2, default=str))
        try:
            exit_code, reason, result = await self._run_command(workspace, context)
        except ConfigError as exc:
            self._check()
            return await self._release(f"configuration error: {exc.message}")
        self._check()
        self._inspect(result)
        finished = await self._finish(workspace, base)
        self._check()
        if isinstance(finished, str):
            return await self._fail(reason or finished, None)
        try:
            candidate = await asyncio.to_thread(self._candidate, repo, workspace, base)
        except ValueError as exc:
            return await self._fail(reason or str(exc), None)
        diff = b"" if candidate == base else await asyncio.to_thread(repository.diff, repo.path, base, candidate)
        fingerprint = bundles.fingerprint_of(diff) if diff else None
        if candidate != base:
            await self.journal.event("commit.made", {"candidate_sha": candidate, "fingerprint": fingerprint,
                                                     "diff_bytes": len(diff)})
        after = await asyncio.to_thread(surfaces_digest, self.cls.repository, self.config_file)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if changed:
            self.security.append(("repository.changed", "the user's repository configuration or "
                                  "Ledger's configuration changed while the attempt ran: "
                                  + ", ".join(changed[:10]), {"paths": changed[:100]}))
        self._check()
        if self.security:
            return await self._refuse_insecure(fingerprint)
        if reason is None and not diff:
            # Nothing changed: perhaps because nothing is broken. Look before
            # charging the attempt for it.
            dismissed = await self._reobserve("changed_nothing")
            if dismissed is not None:
                return dismissed
            reason = "the attempt command succeeded but changed nothing"
        if reason is not None:
            return await self._fail(reason, fingerprint)
        if len(diff) > self.cls.max_candidate_mb << 20:
            return await self._fail(f"the candidate's diff is {len(diff)} bytes, over the class's "
                                    f"max_candidate_mb ({self.cls.max_candidate_mb})", fingerprint)
        if not self.spec.allow_protected_changes:
            touched = await asyncio.to_thread(
                protection.Protection.of(self.acceptance).changes, repo.path, base, candidate)
            if touched:
                return await self._refuse(touched, fingerprint)  # type: ignore[arg-type]
        assert fingerprint is not None
        try:
            await asyncio.to_thread(repo.publish, ref, candidate)
        except GitError as exc:
            self._check()
            return await self._release(f"could not publish the candidate: {exc.message}")
        return await self._record(base, candidate, diff, fingerprint, ref)

    def _opened_a_while_ago(self) -> bool:
        """Whether the campaign's opening observation started longer ago than
        the class's ``reobserve_after_s`` (a campaign opened without an
        observation has no age to judge: it is not re-observed before the
        start)."""
        after = self.cls.reobserve_after_s
        if self.reobservation is None or not self.cls.reobserve_before_start:
            return False
        try:
            opened = Observation.load(self.claim.opening_observation).started_at
        except InvalidDocument:
            return False
        if opened is None:
            return False
        if opened.tzinfo is None:
            opened = opened.replace(tzinfo=timezone.utc)
        return (datetime.now(timezone.utc) - opened).total_seconds() >= after

    async def _reobserve(self, moment: str) -> str | None:
        """Run the class's sensor once (in its cell) and record what it saw
        (``reobserve``): ``"dismissed"`` when the target is green -- the
        campaign is closed, nothing charged, the agent not (or no longer)
        paid for -- else ``None`` and the attempt goes on as before (red, or
        an error: the check could not tell). Standing down meanwhile kills
        the check."""
        r = self.reobservation
        if r is None:
            return None
        self._check()
        c = self.claim
        reading_task = asyncio.create_task(r.read(), name=f"reobserve-{c.campaign_id}")
        stood_down = asyncio.create_task(self.stood_down.wait())
        try:
            await asyncio.wait({reading_task, stood_down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stood_down.cancel()
            if not reading_task.done():
                reading_task.cancel()  # its command's process group is killed with it
                await asyncio.gather(reading_task, return_exceptions=True)
        self._check()
        try:
            reading = reading_task.result()
        except (LedgerError, OSError) as exc:
            self.log.warning("could not re-observe the target; the attempt goes on as before",
                             moment=moment, error=str(exc))
            return None
        if reading.status == "green":
            # the lease ends with this call: a heartbeat refused meanwhile is expected
            await self.journal.close()
            self._check()
            self.ending = True
        try:
            result = await self.kernel.reobserve(
                c.campaign_id, c.generation, r.sensor.name, reading.status, reading.started_at,
                finished_at=reading.finished_at, details=reading.details, moment=moment,
                timeout_s=self._budget())
        except StaleLease:
            raise StoodDown from None
        self.log.info("re-observed the target", moment=moment, status=reading.status,
                      effect=result.effect, observation=result.observation_id, reason=result.reason)
        return "dismissed" if result.effect == "dismissed" else None

    @functools.cached_property
    def _criteria(self) -> AcceptanceSpec | None:
        """The campaign's acceptance criteria, loaded once; ``None`` if it
        has none with commands (a class registered without them)."""
        try:
            spec = AcceptanceSpec.stored(self.claim.acceptance_criteria)
        except ValueError:
            return None  # not a spec this release reads: the verifier refuses it
        return spec if spec.commands else None

    @property
    def spec(self) -> AcceptanceSpec:
        """What the candidate will be judged by: the campaign's acceptance
        criteria (as the verifier reads them), else the class's."""
        return self._criteria if self._criteria is not None else self.cls.acceptance

    @property
    def acceptance(self) -> dict[str, Any]:
        """``spec`` as it is stored with the bundle (the criteria as the
        campaign has them, else the class's, resolved)."""
        return (dict(self.claim.acceptance_criteria) if self._criteria is not None
                else self.cls.acceptance.effective())

    def _inspect(self, result: CommandResult) -> None:
        """What the cell saw the command try, kept for its security events."""
        if result.leftovers:
            self.security.append(("cell.leftover_processes",
                                  f"{len(result.leftovers)} process(es) were still running when the "
                                  f"attempt command exited (killed with its cell): "
                                  + "; ".join(result.leftovers[:5]),
                                  {"processes": list(result.leftovers[:50])}))
        if result.monitor_lost:
            self.security.append(("cell.monitor_killed", "the cell's monitor was killed from inside "
                                  "the cell (the attempt command killed it)", {}))
        # one event per refusal (per destination it tried, the first 20; the
        # rest counted in the last)
        refused = list(dict.fromkeys(result.egress_refused))
        for n, destination in enumerate(refused[:_REFUSALS_KEPT]):
            rest = len(refused) - _REFUSALS_KEPT if n == _REFUSALS_KEPT - 1 else 0
            self.security.append(("network.refused", "the attempt tried to reach what its class does "
                                  f"not allow: {destination}" + (f" (and {rest} more)" if rest > 0 else ""),
                                  {"destination": destination, **({"more": refused[n + 1:100]} if rest > 0
                                                                  else {})}))
        if self.redactor.redacted:
            self.security.append(("output.secret", f"the attempt's output held {self.redactor.redacted} "
                                  "value(s) of Ledger's secrets (redacted before storage)", {}))

    async def _finish(self, workspace: Workspace, base: str) -> str | None:
        """Commit what the command left and bundle its commits, in a cell of
        its own over the same workspace; ``None`` on success, else why not
        (the attempt's own doing: it broke its clone)."""
        env = {"LEDGER_BASE_SHA": base, **Identity.parse(self.cls.author).env("AUTHOR"),
               **Identity.parse(self.cls.committer).env("COMMITTER"), "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": os.devnull}
        argv = ["/bin/sh", "-c", _FINISH]
        if self.sandboxed:
            policy = self.cls.cell.model_copy(update={"network": "none"})
            result = await run_command(argv, "/", timeout_s=FINISH_TIMEOUT_S, tail_bytes=4096,
                                       cell=cells.CellSpec(policy, workspace.bindings(),
                                                           env=cell_environment(base={}) | env))
        else:
            script = _FINISH.replace("/cell/work", str(workspace.work)).replace("/cell/out", str(workspace.out))
            result = await run_command(["/bin/sh", "-c", script], workspace.work, timeout_s=FINISH_TIMEOUT_S,
                                       tail_bytes=4096, env={**child_environment(), **env})
        if result.passed:
            return None
        tail = " | ".join(result.output.strip().splitlines()[-3:])
        return "the attempt's clone could not be committed and bundled" + (f": {tail}" if tail else "")

    def _candidate(self, repo: Repository, workspace: Workspace, base: str) -> str:
        """The candidate from what the cell handed back: ``base`` when the
        attempt made no commit, else one commit of its tree on the base.
        ``ValueError`` (the attempt's own failure) for a bad bundle or a
        history that does not descend from the base."""
        bundle = workspace.out / BUNDLE_FILE
        if not os.path.lexists(bundle):
            return base
        head = repo.import_bundle(bundle, self.cls.max_candidate_mb << 20)
        if not repo.is_ancestor(base, head):
            raise ValueError(f"the attempt's history ({head[:12]}) does not descend from its base "
                             f"{base[:12]}: rewritten history is not a candidate")
        c = self.claim
        message = f"ledger: campaign {c.campaign_id} attempt {c.attempt_no}\n\n{c.objective_key}"
        written = read_handed_back(workspace.out / MESSAGE_FILE, _MESSAGE_LIMIT)
        if written is not None:
            message = written.decode("utf-8", errors="replace").strip() or message
        message = repository.with_trailers(repo.path, message, [
            ("Ledger-Campaign", str(c.campaign_id)), ("Ledger-Attempt", str(c.attempt_no))])
        return repo.make_candidate(head, base, message, Identity.parse(self.cls.author),
                                   Identity.parse(self.cls.committer))

    async def _refuse(self, touched: list[protection.Change], fingerprint: str) -> str:
        reason = (f"refused before verification: the candidate changes protected paths "
                  f"({protection.describe(touched)}); the tests and what configures them judge the "
                  f"candidate, so change the code under test instead")
        self.log.warning("candidate refused: protected paths changed", paths=[str(t) for t in touched])
        await self.journal.close()
        self._check()
        self.ending = True
        c = self.claim
        return await self._ending("failed", lambda t: self.kernel.refuse_candidate(
            c.campaign_id, c.generation, reason, fingerprint=fingerprint, paths=[str(t) for t in touched],
            timeout_s=t))

    async def _refuse_insecure(self, fingerprint: str | None) -> str:
        """Record each thing the attempt was seen to try outside its cell, and
        refuse its candidate (the attempt's own failure)."""
        await self.journal.close()
        self._check()
        c = self.claim
        for action, reason, details in self.security:
            self.log.warning("security event", action=action, reason=reason)
            if fingerprint is not None:
                details = {**details, "fingerprint": fingerprint}

            async def report(timeout_s: float, a: str = action, r: str = reason,
                             d: dict[str, Any] = details) -> int:
                return await self.kernel.report_security_event(c.campaign_id, c.generation, a, r,
                                                               details=d, timeout_s=timeout_s)
            written = await self._ending("reported", report)
            if written != "reported":
                return written
        kinds = ", ".join(dict.fromkeys(a for a, _, _ in self.security))
        # The attempt is refused, not its fix: a candidate refused for what its
        # run did (a daemon, a secret printed) is no approach refused -- an
        # attempt that makes the same change without doing so is judged on it.
        # (The fingerprint stays in the journal and the security events.)
        return await self._fail(f"refused: the attempt tried what its cell does not allow ({kinds}); "
                                + self.security[0][1], None)

    async def _context(self, base: str, workspace: Workspace) -> dict[str, Any]:
        """What the attempt command is told: the campaign and what failed before."""
        c = self.claim
        try:
            async with asyncio.timeout(self._budget()):
                detail = await self.reads.campaign_detail(c.campaign_id)
        except TimeoutError:
            raise Unavailable("could not read the campaign within the lease") from None
        reasons = {v.attempt_id: v.reason for v in detail.verifications if v.status == "rejected"}
        previous = [PreviousAttempt(attempt_no=a.attempt_no, outcome=a.outcome, verdict=a.verdict,
                                    failure_reason=a.failure_reason or reasons.get(a.id),
                                    fingerprint=a.fingerprint)
                    for a in detail.attempts if a.attempt_no != c.attempt_no]
        seen = workspace.seen(self.sandboxed)
        return AttemptContext(  # the attempt protocol (ledger.protocol)
            campaign_id=c.campaign_id, attempt_no=c.attempt_no, generation=c.generation,
            class_=c.class_, objective_key=c.objective_key, target=c.target,
            desired_state=c.desired_state, opening_observation=c.opening_observation,
            # held-out tests are the verifier's alone: not even where they are
            acceptance={k: v for k, v in self.acceptance.items() if k != "held_out"},
            protected=protection.patterns_of(self.acceptance),
            allow_protected_changes=self.spec.allow_protected_changes,
            commit_message_file=f"{seen.out}/{MESSAGE_FILE}",
            base_ref=self.cls.base_ref,
            base_sha=base, worktree=seen.worktree, previous_attempts=previous,
            refused_fingerprints=sorted({a.fingerprint for a in previous if a.fingerprint
                                         and (a.outcome == "failed" or a.verdict == "rejected")}),
            sandboxed=self.sandboxed,
            network=self.cls.cell.network if self.sandboxed else "host",
        ).model_dump(mode="json", by_alias=True)

    def _output(self, data: bytes) -> None:
        """The command's output: to the journal, and its usage lines read."""
        self.journal.output(data)
        self.usage.feed(data)

    async def _run_command(self, workspace: Workspace, context: dict[str, Any]
                           ) -> tuple[int | None, str | None, CommandResult]:
        """Run the attempt command in its cell; returns (exit code, failure
        reason or None, the result). ``ConfigError`` for a command line the
        class's configuration cannot fill in."""
        c = self.claim
        seen = workspace.seen(self.sandboxed)
        values = {"campaign_file": seen.campaign_file, "worktree": seen.worktree,
                  "campaign_id": str(c.campaign_id), "attempt_no": str(c.attempt_no)}
        try:
            argv = [arg.format(**values) for arg in self.cls.attempt_command]
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"class {self.cls.name}: attempt_command cannot be filled in ({exc!r}; "
                              f"known placeholders: {', '.join(sorted(ATTEMPT_PLACEHOLDERS))})") from None
        protocol = dict(LEDGER_CAMPAIGN_FILE=seen.campaign_file, LEDGER_CAMPAIGN_ID=str(c.campaign_id),
                        LEDGER_ATTEMPT_NO=str(c.attempt_no), LEDGER_WORKTREE=seen.worktree,
                        LEDGER_OBJECTIVE=c.objective_key,
                        LEDGER_COMMIT_MESSAGE_FILE=f"{seen.out}/{MESSAGE_FILE}")
        await self.journal.event("command.started", {"argv": argv, "sandboxed": self.sandboxed})
        stdin = json.dumps(context, default=str).encode()
        if self.sandboxed:
            env = {**cell_environment(self.cls.attempt_environment), **protocol}
            self._command = asyncio.create_task(run_command(
                argv, "/", timeout_s=self.cls.attempt_timeout_s, tail_bytes=_LOG_TAIL, stdin=stdin,
                on_output=self._output, redact=self.redactor,
                cell=cells.CellSpec(self.cls.cell, workspace.bindings(), cwd=seen.worktree, env=env)))
        else:
            env = {**child_environment(self.cls.attempt_environment), **protocol}
            self._command = asyncio.create_task(run_command(
                argv, workspace.work, timeout_s=self.cls.attempt_timeout_s, env=env,
                tail_bytes=_LOG_TAIL, stdin=stdin, on_output=self._output,
                redact=self.redactor))
        try:
            result = await self._command
        except asyncio.CancelledError:
            if self.stood_down.is_set():
                raise StoodDown from None
            raise
        await self.usage.drain()  # every usage line it printed is in before its ending
        self.log_tail = result.output
        self._check()
        exited: dict[str, Any] = {
            "exit_code": result.exit_code, "duration_s": round(result.duration_s, 3),
            "timed_out": result.timed_out, "output_bytes": result.output_bytes,
            "sandboxed": result.sandboxed, "leftovers": len(result.leftovers)}
        if result.limits:  # how the cell was limited (cgroup2, cgroup1 or rlimits) and what it used
            exited["limits"] = result.limits
        await self.journal.event("command.exited", exited)
        if result.error:
            return None, f"could not start the attempt command {argv[0]!r}: {result.error}", result
        if result.timed_out:
            return (result.exit_code,
                    f"the attempt command timed out after {self.cls.attempt_timeout_s:g}s", result)
        stopped = result.stopped_by()
        if stopped:
            return result.exit_code, f"the attempt command was stopped: {stopped}", result
        if result.exit_code != 0:
            tail = result.output.strip().splitlines()[-3:]
            return result.exit_code, (f"the attempt command exited with {result.exit_code}"
                                      + (f": {' | '.join(tail)}" if tail else "")), result
        return result.exit_code, None, result

    # -- endings ------------------------------------------------------------

    async def _fail(self, reason: str, fingerprint: str | None) -> str:
        self.log.info("attempt failed", reason=reason)
        await self.journal.close()
        self._check()
        self.ending = True
        c = self.claim
        return await self._ending("failed", lambda t: self.kernel.fail_attempt(
            c.campaign_id, c.generation, reason, fingerprint=fingerprint, timeout_s=t))

    async def _release(self, reason: str) -> str:
        """A fault that is not the attempt's own: hand the campaign back,
        charging nothing; it waits, saying why, and is tried again."""
        self.log.warning("attempt released: a fault that is not the attempt's own", reason=reason)
        await self.journal.close()
        if self.stood_down.is_set() or self.journal.fenced:
            return "stood_down"
        return await self._release_now(reason)

    async def _release_now(self, reason: str) -> str:
        self.ending = True
        c = self.claim
        try:
            return await self._ending("released", lambda t: self.kernel.release_attempt(
                c.campaign_id, c.generation, reason[:4000], timeout_s=t))
        except StaleLease as exc:
            self.log.info("the lease is gone: nothing to hand back", error=exc.message)
            return "stood_down"

    async def _hand_back(self, reason: str) -> str:
        """The lease's holder was stopped by a fault of the system's (the
        database out of reach until the lease's local deadline): hand the
        campaign back, uncharged, once the database answers -- it gave the
        lease its length again if it restarted -- or stand down if it says the
        lease is gone (reaped, abandoned)."""
        self._kill()
        if self.ending:
            return "stood_down"  # an ending was under way: _ending has settled it
        self.log.warning("handing the lease back once the database answers", reason=reason)
        outcome = await self._release_now(reason)
        if outcome == "released":
            self.log.info("lease handed back, nothing charged")
        return outcome

    async def _record(self, base: str, candidate: str, diff: bytes, fingerprint: str, ref: str) -> str:
        c = self.claim
        frozen = bundles.Bundle(
            campaign_id=c.campaign_id, attempt_no=c.attempt_no, generation=c.generation,
            worker=self.identity, **{"class": c.class_}, objective_key=c.objective_key,
            target=c.target, repository=str(self.cls.repository), base_ref=self.cls.base_ref,
            base_sha=base, candidate_sha=candidate, fingerprint=fingerprint,
            acceptance=self.acceptance, verifier=self.cls.verifier,
            created_at=datetime.now(timezone.utc))
        digest = bundles.digest_of(frozen, diff)
        await self.journal.close()
        self._check()
        self.ending = True
        try:
            outcome = await self._ending("attempted", lambda t: self.kernel.record_attempt(
                c.campaign_id, c.generation, base_sha=base, candidate_sha=candidate,
                fingerprint=fingerprint, bundle=frozen.model_dump(mode="json", by_alias=True),
                bundle_digest=digest, log_tail=self.log_tail, diff=diff, candidate_ref=ref,
                timeout_s=t))
        except RepeatedApproach as exc:
            self.ending = False
            return await self._fail(exc.message, fingerprint)
        if outcome == "attempted":
            self.log.info("attempt recorded", candidate=candidate, fingerprint=fingerprint, ref=ref)
        return outcome

    async def _ending(self, outcome: str, write: Callable[[float], Awaitable[object]]) -> str:
        """Write this lease's one ending (``write(timeout_s)``, idempotent),
        tried again until the database answers: ``outcome`` once it is in.
        The database's fence (generation and liveness) decides whether it
        counts, so the tries go on past the lease's local deadline, for up to
        ``ENDING_PATIENCE_S`` -- a database that restarted meanwhile has given
        the lease its length again (ledger.restart_grace), and an ending
        written then costs nothing a lost lease would. ``StaleLease`` and the
        other refusals are raised; a database that never answers is read back
        (``_resolve``)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + max(self.lease.remaining(), 0.0) + ENDING_PATIENCE_S
        tries = 0
        while True:
            tries += 1
            try:
                await write(max(self.lease.remaining(), ENDING_TRY_S))
                return outcome
            except Unavailable as exc:
                if loop.time() >= give_up:
                    return await self._resolve(exc)
                if tries == 1 or tries % 20 == 0:
                    self.log.warning("the lease's ending could not be written; trying again until the "
                                     "database answers", ending=outcome, error=exc.message,
                                     error_type=type(exc).__name__, tries=tries)
                await asyncio.sleep(backoff(tries, base_s=0.25, cap_s=2.0))

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
        c = self.claim
        try:
            self.outcome = await self._ending("drained", lambda t: self.kernel.fail_attempt(
                c.campaign_id, c.generation, "drained: the worker shut down", drained=True, timeout_s=t))
        except StaleLease:
            self.outcome = "stood_down"
