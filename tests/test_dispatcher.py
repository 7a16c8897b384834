"""The outbox dispatcher on a real PostgreSQL, real git repositories and a real
HTTP server: intent before action, compare-and-swap, read-back before record,
exactly-once across a crash, and the authority checks around intents."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_PREFIX, Actors, Admin
from drive import Driver, fingerprint, now
from ledger import Forbidden, Kernel, StaleLease
from ledger.ops import faults
from ledger.roles.dispatcher import FAULT_AFTER_ACTION, Dispatcher

pytestmark = pytest.mark.anyio

MAIN = "refs/heads/main"
PROMOTION_MESSAGE = "ledger promotion"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}


# --- git -------------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], env={**os.environ, **GIT_ENV},
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def child(repo: Path, parent: str, message: str) -> str:
    """A new commit on top of ``parent`` (no ref moves)."""
    return git(repo, "commit-tree", f"{parent}^{{tree}}", "-p", parent, "-m", message)


def edited(repo: Path, parent: str, files: dict[str, str], message: str = "candidate") -> str:
    """A new commit on ``parent`` writing ``files`` (no ref moves, no checkout touched)."""
    tree = repo.parent / f"edit-{len(list(repo.parent.glob('edit-*')))}"
    git(repo, "worktree", "add", "--quiet", "--detach", str(tree), parent)
    for path, text in files.items():
        (tree / path).write_text(text)
    git(tree, "add", "-A")
    git(tree, "commit", "--quiet", "-m", message)
    sha = git(tree, "rev-parse", "HEAD")
    git(repo, "worktree", "remove", "--force", str(tree))
    return sha


def rev(repo: Path, ref: str = MAIN) -> str:
    return git(repo, "rev-parse", ref)


def landed(repo: Path, candidate: str, base: str) -> str:
    """Main, checked to be what a promotion lands for ``candidate``: its tree
    byte for byte, on ``base``, with Ledger's trailers."""
    main = rev(repo)
    assert main != candidate
    assert git(repo, "rev-parse", f"{main}^{{tree}}") == git(repo, "rev-parse", f"{candidate}^{{tree}}")
    assert git(repo, "rev-list", "--parents", "-n1", main).split()[1:] == [base]
    trailers = git(repo, "log", "-1", "--format=%(trailers:only,unfold)", main).splitlines()
    assert trailers[1:] == ["Ledger-Attempt: 1", "Ledger-Verdict: accepted by verifier-1"], trailers
    assert trailers[0].startswith("Ledger-Campaign: ")
    return main


def promotions_in_reflog(repo: Path) -> int:
    return git(repo, "reflog", "show", "--format=%gs", MAIN).splitlines().count(PROMOTION_MESSAGE)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose main has one commit; every ref update is logged."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "--quiet", "--initial-branch=main")
    git(path, "config", "core.logAllRefUpdates", "always")
    (path / "README").write_text("hello\n")
    git(path, "add", "README")
    git(path, "commit", "--quiet", "-m", "base")
    return path


# --- campaigns ---------------------------------------------------------------------


async def promoting_class(actors: Any, repo: Path, name: str = "promo", **promotion: Any) -> str:
    await (await actors("operator")).register_class(
        name, max_attempts=3, lease_seconds=30, backoff_base_s=0, backoff_jitter=0,
        promotion={"ref": MAIN, "repository": str(repo), **promotion})
    return name


async def accepted(actors: Any, repo: Path, candidate: str, base: str | None = None,
                   **promotion: Any) -> tuple[int, int]:
    """A campaign whose candidate (on top of main's ``base``) was accepted: its
    promotion intent is committed. Returns (campaign id, side effect id)."""
    d = Driver(actors, await promoting_class(actors, repo, **promotion))
    cid, gen = await d.leased()
    await (await actors("worker")).record_attempt(
        cid, gen, base_sha=base or rev(repo), candidate_sha=candidate, fingerprint=fingerprint(1))
    verifier = await actors("verifier")
    claim = await verifier.claim_verification("verifier-1", classes=[d.class_])
    assert claim is not None and claim.campaign_id == cid
    effect = await verifier.accept(claim.verification_id, {"ok": True})
    assert effect is not None
    return cid, effect


async def side_effect(actors: Any, cid: int, effect: int) -> Any:
    detail = await (await actors.reads("reader")).campaign_detail(cid)
    return next(s for s in detail.side_effects if s.id == effect)


async def event_types(actors: Any, cid: int) -> list[str]:
    return [e.type for e in await (await actors.reads("reader")).events(cid)]


async def after_lease(actors: Any, *, later: int = 0, **options: Any) -> int:
    """One pass of a fresh dispatcher with the database clock pinned past any
    claim lease taken until now (a crashed dispatcher's claim has lapsed);
    ``later``: that many more quarter hours on (past a waiting retry's pause)."""
    await actors("dispatcher")
    async with actors.session("dispatcher").transaction(
            now=now() + timedelta(minutes=11 + 15 * later)) as tx:
        return await Dispatcher(Kernel(tx), **options).run_once()


# --- processes and conditions --------------------------------------------------------


def dispatcher_process(db_url: str, tmp_path: Path, *args: str,
                       fault: bool = True) -> tuple[subprocess.Popen[bytes], Path]:
    """``python -m ledger dispatcher ARGS`` as its own process; stderr to a file."""
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_FAULT_DIR": str(tmp_path / "faults")}
    env.pop("LEDGER_FAULT_POINTS", None)
    if fault:
        env["LEDGER_FAULT_POINTS"] = FAULT_AFTER_ACTION
    stderr = tmp_path / f"dispatcher-{len(list(tmp_path.glob('dispatcher-*.log')))}.log"
    with stderr.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "dispatcher", *args], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    return proc, stderr


async def until(condition: Callable[[], Any], what: str, *, proc: subprocess.Popen[bytes] | None = None,
                log: Path | None = None, timeout_s: float = 30.0) -> None:
    """Wait for a condition (polled; not a sleep standing in for one)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await _holds(condition):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}:\n"
                                 + (log.read_text() if log else ""))
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)  # polling interval of the condition


async def _holds(condition: Callable[[], Any]) -> bool:
    value = condition()
    if asyncio.iscoroutine(value):
        value = await value
    return bool(value)


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


# --- an HTTP service that honours Idempotency-Key ---------------------------------------


class OrderService:
    """``POST /orders`` applies an order once per Idempotency-Key (a replay gets the
    first answer, a request without a key is refused); ``GET /orders/<key>`` is 200
    once applied; ``/flaky`` always answers 503; ``/lossy`` answers 202 and applies
    nothing. Every request is recorded."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, key
        self.effects: list[tuple[str, Any]] = []  # (key, order) per effect applied
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any] | None = None) -> None:
                data = json.dumps(body or {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                with service._lock:
                    service.requests.append(("GET", self.path, self.headers.get("Idempotency-Key")))
                    applied = {key for key, _ in service.effects}
                key = self.path.removeprefix("/orders/")
                self._answer(200 if key in applied else 404)

            def do_POST(self) -> None:
                key = self.headers.get("Idempotency-Key")
                order = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                with service._lock:
                    service.requests.append(("POST", self.path, key))
                    if self.path == "/flaky":
                        return self._answer(503)
                    if self.path == "/lossy":  # says yes, applies nothing
                        return self._answer(202)
                    if not key:
                        return self._answer(400, {"error": "Idempotency-Key required"})
                    if key not in {k for k, _ in service.effects}:
                        service.effects.append((key, order))
                self._answer(201, {"order": key})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def posts(self) -> list[tuple[str, str, str | None]]:
        with self._lock:
            return [r for r in self.requests if r[0] == "POST"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def service() -> Iterator[OrderService]:
    s = OrderService()
    yield s
    s.close()


async def http_intent(actors: Any, service: OrderService, *, path: str = "/orders",
                      read_back: bool = False, url: str | None = None) -> tuple[int, int, str]:
    """A worker of a class allowed to call 127.0.0.1 records an HTTP intent.
    Returns (campaign id, side effect id, idempotency key)."""
    await (await actors("operator")).register_class(
        "remote", authority={"worker": {"hosts": ["127.0.0.1"]}})
    cid, gen = await Driver(actors, "remote").leased()
    key = f"order-{cid}"
    payload: dict[str, Any] = {"method": "POST", "url": url or service.base + path,
                               "body": {"item": "widget", "campaign": cid}}
    if read_back:
        payload["read_back"] = {"url": f"{service.base}/orders/{key}", "expect_status": 200}
    requested = await (await actors("worker")).request_side_effect(
        cid, gen, kind="http.request", target=service.base + path, precondition={},
        idempotency_key=key, payload=payload)
    assert requested.status == "requested"
    return cid, requested.side_effect_id, key


# =====================================================================================
# git.update_ref: promotions
# =====================================================================================


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_promotion_moves_the_ref_reads_it_back_and_marks_the_campaign(actors: Actors, repo: Path) -> None:
    base = rev(repo)
    candidate = child(repo, base, "candidate")
    cid, effect = await accepted(actors, repo, candidate)
    assert rev(repo) == base, "accept only records the intent; nothing acts yet"

    dispatcher = Dispatcher(await actors("dispatcher"))
    assert await dispatcher.run_once() == 1

    main = landed(repo, candidate, base)
    assert promotions_in_reflog(repo) == 1
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries, se.error) == ("done", 1, None)
    assert se.result is not None and se.result["read_back"] == main == se.result["landed"]
    assert se.result["candidate"] == candidate
    assert se.result["previous"] == base and "already_applied" not in se.result
    assert se.result["dispatcher"] == dispatcher.identity
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.state == "verified"
    assert campaign.promoted_at is not None and campaign.promoted_sha == main
    events = await (await actors.reads("reader")).events(cid)
    done = [e for e in events if e.type == "side_effect.done"]
    assert len(done) == 1 and done[0].payload["result"]["read_back"] == main
    assert await dispatcher.run_once() == 0, "nothing is due any more"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_target_moved_meanwhile_is_a_conflict_and_the_campaign_is_ready_again(actors: Actors, repo: Path) -> None:
    base = rev(repo)
    candidate = child(repo, base, "candidate")
    cid, effect = await accepted(actors, repo, candidate)
    moved = child(repo, base, "someone else's commit")
    git(repo, "update-ref", MAIN, moved)

    assert await Dispatcher(await actors("dispatcher")).run_once() == 1

    assert rev(repo) == moved, "the ref is untouched"
    assert promotions_in_reflog(repo) == 0
    se = await side_effect(actors, cid, effect)
    assert se.state == "conflict" and se.result is not None
    assert (se.result["read_back"], se.result["expected"]) == (moved, base)
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.state == "ready" and campaign.promoted_at is None
    assert campaign.last_failure_reason is not None
    assert campaign.last_failure_reason.startswith("promotion failed")
    events = await (await actors.reads("reader")).events(cid)
    assert [e.payload["transition"] for e in events if e.type == "transition"][-1] == "promote_failed"
    # a conflict is final: no later pass touches it
    assert await after_lease(actors) == 0
    assert rev(repo) == moved


async def test_crash_after_the_update_is_recorded_once_by_the_next_dispatcher(
        actors: Actors, repo: Path, db_url: str, tmp_path: Path) -> None:
    """SIGKILL between the git update and its record; the next dispatcher reads
    back first, sees the ref at the candidate and records done without a second
    update (one 'ledger promotion' entry in the reflog)."""
    base = rev(repo)
    candidate = child(repo, base, "candidate")
    cid, effect = await accepted(actors, repo, candidate)

    proc, log = dispatcher_process(db_url, tmp_path, "--once", "--lease", "60")
    reached = tmp_path / "faults" / f"{FAULT_AFTER_ACTION}.reached"
    try:
        await until(reached.exists, "the fault point", proc=proc, log=log)
    finally:
        kill(proc)
    main = landed(repo, candidate, base)  # the first dispatcher did act
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries) == ("claimed", 1), "...but died before recording"
    assert (await (await actors.reads("reader")).campaign(cid)).promoted_at is None

    # While the dead dispatcher's lease runs, nobody else may take the intent.
    assert await Dispatcher(await actors("dispatcher")).run_once() == 0
    assert await after_lease(actors) == 1

    assert promotions_in_reflog(repo) == 1, "exactly one update"
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries) == ("done", 2)
    assert se.result is not None and se.result["already_applied"] is True
    assert se.result["read_back"] == main, "it built the very same commit to read back"
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.promoted_sha == main and campaign.promoted_at is not None


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_lock_contention_is_retried_with_backoff_then_done(actors: Actors, repo: Path) -> None:
    base = rev(repo)
    candidate = child(repo, base, "candidate")
    cid, effect = await accepted(actors, repo, candidate)
    lock = repo / ".git" / "refs" / "heads" / "main.lock"  # another writer holds main
    lock.write_text("")

    before = now()
    assert await Dispatcher(await actors("dispatcher"), backoff_base_s=30).run_once() == 1
    assert rev(repo) == base
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries) == ("pending", 1)
    assert se.error is not None and "lock" in se.error
    # jittered backoff (+/-20 %) around 30 s, not an immediate hot retry
    assert timedelta(seconds=23) < se.next_try_at - before < timedelta(seconds=37)
    assert (await (await actors.reads("reader")).campaign(cid)).state == "verified"
    assert await Dispatcher(await actors("dispatcher")).run_once() == 0, "not due yet"

    lock.unlink()
    assert await after_lease(actors) == 1
    landed(repo, candidate, base)
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries) == ("done", 2)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_candidate_missing_from_the_repository_waits_and_is_not_charged(actors: Actors, repo: Path) -> None:
    """A candidate that is not in the repository (its ref gone, the remote
    behind) is a fault of the system, not of the candidate: the promotion
    waits and is retried, the campaign stays verified and says why, and
    nothing is re-attempted (README "Faults that are not the attempt's own": no objective burnt by a fault that is
    not the attempt's own)."""
    base = rev(repo)
    cid, effect = await accepted(actors, repo, "f" * 40)
    before = await (await actors.reads("reader")).campaign(cid)
    for n in range(6):  # more than max_tries: waiting never turns into giving up
        assert await after_lease(actors, later=n, max_tries=3) == 1
    assert rev(repo) == base
    se = await side_effect(actors, cid, effect)
    assert se.state == "pending" and se.error is not None and "not in" in se.error
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.state == "verified" and campaign.attempt_count == before.attempt_count
    assert campaign.waiting_on == "system_fault" and "not in" in (campaign.waiting_reason or "")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_an_intent_claimed_when_its_campaign_was_abandoned_is_not_carried_out(actors: Actors, repo: Path) -> None:
    """Abandon cancels pending intents; one a dispatcher had already claimed (and
    then lost) must not be carried out by its successor either: its
    generation is dead, so the next claim cancels it instead."""
    base = rev(repo)
    candidate = child(repo, base, "candidate")
    cid, effect = await accepted(actors, repo, candidate)
    claim = await (await actors("dispatcher")).claim_side_effect("dispatcher-that-dies")
    assert claim is not None and claim.side_effect_id == effect
    await (await actors("operator")).abandon(cid, "not needed")

    assert await after_lease(actors) == 0, "nothing left to dispatch"
    assert rev(repo) == base, "the ref was not moved"
    se = await side_effect(actors, cid, effect)
    assert se.state == "cancelled" and se.error is not None and "generation" in se.error


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_worker_intent_must_use_the_class_repository(actors: Actors, repo: Path, tmp_path: Path) -> None:
    """The kernel judges the ref; the repository in the payload is the worker's
    choice, so the dispatcher holds it to the class's own."""
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "--quiet", "--initial-branch=main")
    (other / "f").write_text("x")
    git(other, "add", "f")
    git(other, "commit", "--quiet", "-m", "other")
    target = "refs/heads/ledger/fix"
    await (await actors("operator")).register_class(
        "branching", authority={"worker": {"refs": ["refs/heads/ledger/*"]}},
        promotion={"ref": MAIN, "repository": str(repo)})
    cid, gen = await Driver(actors, "branching").leased()
    worker = await actors("worker")
    wrong = await worker.request_side_effect(
        cid, gen, kind="git.update_ref", target=target, precondition={"old": None},
        idempotency_key="branch-other", payload={"repository": str(other), "new": rev(other)})
    right = await worker.request_side_effect(
        cid, gen, kind="git.update_ref", target=target, precondition={"old": None},
        idempotency_key="branch-own", payload={"repository": str(repo), "new": rev(repo)})

    assert await Dispatcher(await actors("dispatcher")).run_once() == 2
    assert git(other, "for-each-ref", "--format=%(refname)", target) == ""
    assert rev(repo, target) == rev(repo)
    assert (await side_effect(actors, cid, wrong.side_effect_id)).state == "failed"
    assert (await side_effect(actors, cid, right.side_effect_id)).state == "done"


# git.update_ref: a branch checked out in the user's repository
# =====================================================================================


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_promotion_into_a_checked_out_branch_moves_its_files_and_index(actors: Actors, repo: Path) -> None:
    """The finding's reproduction: update-ref alone moved main under the user's
    checkout, whose index then held the old code, staged to go back in."""
    base = rev(repo)
    candidate = edited(repo, base, {"README": "fixed\n", "NEW": "added\n"})
    cid, effect = await accepted(actors, repo, candidate)

    assert await Dispatcher(await actors("dispatcher")).run_once() == 1

    main = landed(repo, candidate, base)
    assert (await side_effect(actors, cid, effect)).state == "done"
    assert git(repo, "status", "--porcelain") == "", "nothing staged or changed behind the moved ref"
    assert (repo / "README").read_text() == "fixed\n" and (repo / "NEW").read_text() == "added\n"
    assert git(repo, "rev-parse", "HEAD") == main
    # The user's next `commit -am` builds on the promotion, not against it.
    (repo / "README").write_text("fixed, then more\n")
    git(repo, "commit", "--quiet", "-am", "more")
    assert git(repo, "diff", "--stat", main, "HEAD") == "README | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize("mess", ["unstaged", "staged", "untracked in the way"])
async def test_a_dirty_checkout_is_left_alone_and_the_promotion_waits(actors: Actors, repo: Path, mess) -> None:
    """The user's uncommitted work on the checked-out target is not ours to
    overwrite, and no fault of the candidate's: the promotion waits (retried
    with backoff, never re-attempted or charged, the campaign saying why) and
    lands once the checkout is clean (tests/test_accounting.py: it used to send
    the candidate back to be attempted again, without end)."""
    base = rev(repo)
    candidate = edited(repo, base, {"README": "fixed\n", "NEW": "added\n"})
    cid, effect = await accepted(actors, repo, candidate)
    if mess == "untracked in the way":
        (repo / "NEW").write_text("the user's own file\n")
    else:
        (repo / "README").write_text("the user's work in progress\n")
        if mess == "staged":
            git(repo, "add", "README")
    before = git(repo, "status", "--porcelain")

    for n in range(3):
        assert await after_lease(actors, later=n) == 1

    assert rev(repo) == base, "the ref was not moved"
    assert promotions_in_reflog(repo) == 0
    assert git(repo, "status", "--porcelain") == before, "the user's changes are untouched"
    se = await side_effect(actors, cid, effect)
    assert se.state == "pending" and se.error is not None
    assert "checked out in" in se.error and "the ref was not moved" in se.error
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.state == "verified" and campaign.promoted_at is None and campaign.attempt_count == 1
    assert campaign.waiting_on == "target" and "checked out in" in (campaign.waiting_reason or "")
    transitions = [e.payload["transition"] for e in await (await actors.reads("reader")).events(cid)
                   if e.type == "transition"]
    assert "promote_failed" not in transitions
    assert not (repo / ".git" / "refs" / "heads" / "main.lock").exists()
    assert not (repo / ".git" / "index.lock").exists()

    # The user commits or stashes their work: the waiting promotion lands.
    git(repo, "checkout", "--", ".") if mess != "untracked in the way" else (repo / "NEW").unlink()
    git(repo, "reset", "-q", "--hard")
    assert await after_lease(actors, later=3) == 1
    landed(repo, candidate, base)
    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.promoted_at is not None and campaign.waiting_on is None


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_bare_repository_and_its_linked_worktree(actors: Actors, repo: Path, tmp_path: Path) -> None:
    """Bare: the ref moves as before. A linked worktree with main checked out
    moves with it, like the main worktree of a non-bare repository."""
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(repo), str(bare)], check=True)
    base = rev(bare)
    candidate = edited(repo, base, {"README": "fixed\n"})
    git(bare, "fetch", "--quiet", str(repo), candidate)
    cid, _ = await accepted(actors, bare, candidate)
    assert await Dispatcher(await actors("dispatcher")).run_once() == 1
    landed(bare, candidate, base)
    assert (await (await actors.reads("reader")).campaign(cid)).promoted_sha == rev(bare)

    # Now main is checked out in a linked worktree of the bare repository.
    tree = tmp_path / "linked"
    git(bare, "worktree", "add", "--quiet", str(tree), "main")
    second_base = rev(bare)
    second = edited(bare, second_base, {"README": "fixed twice\n"})
    await accepted(actors, bare, second)
    assert await Dispatcher(await actors("dispatcher")).run_once() == 1
    assert rev(bare) != second_base and git(tree, "rev-parse", "HEAD") == rev(bare)
    assert (tree / "README").read_text() == "fixed twice\n"
    assert git(tree, "status", "--porcelain") == ""


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_the_landed_commit_says_who_fixed_what_and_who_judged_it(actors: Actors, repo: Path) -> None:
    """The agent's message, Ledger's trailers (an agent's forged ones dropped),
    the candidate's author, the class's committer; the tree byte for byte."""
    base = rev(repo)
    message = ("Fix the greeting\n\nIt said hello to nobody.\n\n"
               "Ledger-Verdict: accepted by a forger\nSigned-off-by: Agent <agent@example.org>")
    candidate = edited(repo, base, {"README": "hello, world\n"}, message)
    cid, _ = await accepted(actors, repo, candidate,
                            committer={"name": "Release Bot", "email": "bot@example.org"})
    assert await Dispatcher(await actors("dispatcher")).run_once() == 1
    main = rev(repo)
    assert git(repo, "rev-parse", f"{main}^{{tree}}") == git(repo, "rev-parse", f"{candidate}^{{tree}}")
    assert git(repo, "log", "-1", "--format=%B", main) == (
        "Fix the greeting\n\nIt said hello to nobody.\n\n"
        "Signed-off-by: Agent <agent@example.org>\n"
        f"Ledger-Campaign: {cid}\nLedger-Attempt: 1\nLedger-Verdict: accepted by verifier-1")
    assert git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>", main) == (
        "t <t@localhost>|Release Bot <bot@example.org>")


# =====================================================================================
# http.request
# =====================================================================================


async def test_http_intent_survives_a_crash_with_one_idempotency_key_and_one_effect(
        actors: Actors, service: OrderService, db_url: str, tmp_path: Path) -> None:
    """The first dispatcher is SIGKILLed after its POST; the second, with no
    read-back configured, sends again -- with the same Idempotency-Key, so the
    service applies the order once."""
    cid, effect, key = await http_intent(actors, service)

    proc, log = dispatcher_process(db_url, tmp_path, "--once")
    reached = tmp_path / "faults" / f"{FAULT_AFTER_ACTION}.reached"
    try:
        await until(reached.exists, "the fault point", proc=proc, log=log)
    finally:
        kill(proc)
    assert len(service.posts()) == 1 and len(service.effects) == 1
    assert (await side_effect(actors, cid, effect)).state == "claimed"

    assert await after_lease(actors) == 1

    posts = service.posts()
    assert len(posts) == 2, "the second dispatcher retried"
    assert {k for _, _, k in posts} == {key}, "every request carried the intent's key"
    assert service.effects == [(key, {"item": "widget", "campaign": cid})], "applied once"
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries) == ("done", 2)
    assert se.result is not None and se.result["status"] == 201


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_http_read_back_first_means_no_second_request(actors: Actors, service: OrderService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a read-back configured, a successor first GETs the target: the order
    is there, so it records done without sending anything."""
    cid, effect, key = await http_intent(actors, service, read_back=True)
    monkeypatch.setenv("LEDGER_FAULT_POINTS", FAULT_AFTER_ACTION)
    monkeypatch.setenv("LEDGER_FAULT_DIR", str(tmp_path / "faults"))
    first = asyncio.create_task(Dispatcher(await actors("dispatcher"), pause=faults.point).run_once())
    await until((tmp_path / "faults" / f"{FAULT_AFTER_ACTION}.reached").exists, "the fault point")
    first.cancel()  # dies holding the claim, action done, nothing recorded
    with pytest.raises(asyncio.CancelledError):
        await first
    monkeypatch.delenv("LEDGER_FAULT_POINTS")

    assert await after_lease(actors) == 1

    assert [(m, k) for m, _, k in service.posts()] == [("POST", key)], "sent exactly once"
    gets = [p for m, p, _ in service.requests if m == "GET"]
    assert gets == [f"/orders/{key}"] * 2, "each dispatcher read back before acting"
    se = await side_effect(actors, cid, effect)
    assert se.state == "done" and se.result is not None and se.result["already_applied"] is True
    assert se.result["read_back"] == {"url": f"{service.base}/orders/{key}", "status": 200}


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_http_success_is_what_the_read_back_shows(actors: Actors, service: OrderService) -> None:
    cid, effect, key = await http_intent(actors, service, read_back=True)
    assert await Dispatcher(await actors("dispatcher")).run_once() == 1
    assert [m for m, _, _ in service.requests] == ["GET", "POST", "GET"]
    se = await side_effect(actors, cid, effect)
    assert se.state == "done" and se.result is not None
    assert se.result["status"] == 201 and se.result["read_back"]["status"] == 200
    assert "already_applied" not in se.result


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_http_accepted_but_not_visible_is_not_done(actors: Actors, service: OrderService) -> None:
    """A 2xx is not success; what the read-back shows is."""
    cid, effect, key = await http_intent(actors, service, path="/lossy", read_back=True)
    assert await Dispatcher(await actors("dispatcher")).run_once() == 1
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries) == ("pending", 1)
    assert se.result is not None and se.result["status"] == 202
    assert se.result["read_back"]["status"] == 404
    assert se.error is not None and "answered 404, not 200" in se.error


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_http_5xx_is_retried_with_backoff_then_failed_after_max_tries(actors: Actors, service: OrderService) -> None:
    cid, effect, key = await http_intent(actors, service, path="/flaky")
    before = now()
    assert await Dispatcher(await actors("dispatcher"), max_tries=2).run_once() == 1
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries) == ("pending", 1)
    assert se.error is not None and "503" in se.error
    assert se.next_try_at - before > timedelta(seconds=1.5), "backed off"

    assert await after_lease(actors, max_tries=2) == 1
    se = await side_effect(actors, cid, effect)
    assert (se.state, se.tries) == ("failed", 2)
    assert se.error is not None and se.error.startswith("gave up after 2 tries")
    assert [k for _, _, k in service.posts()] == [key, key]
    assert await after_lease(actors, max_tries=2) == 0, "failed is final"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_http_payload_pointing_off_the_authorised_target_is_refused(actors: Actors, service: OrderService) -> None:
    """The kernel authorised the target's host; a payload URL on another origin
    (here: another port) is not contacted at all."""
    elsewhere = OrderService()
    try:
        cid, effect, _ = await http_intent(actors, service, url=elsewhere.base + "/orders")
        assert await Dispatcher(await actors("dispatcher")).run_once() == 1
        assert elsewhere.requests == [] and service.requests == []
    finally:
        elsewhere.close()
    se = await side_effect(actors, cid, effect)
    assert se.state == "failed" and se.error is not None and "origin" in se.error


# =====================================================================================
# Requests: authority and fencing
# =====================================================================================


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_ref_outside_the_worker_profile_is_forbidden_and_recorded(actors: Actors, admin: Admin) -> None:
    await (await actors("operator")).register_class(
        "guarded", authority={"worker": {"refs": ["refs/heads/ledger/*"]}})
    cid, gen = await Driver(actors, "guarded").leased()
    reader = await actors.reads()
    before = await reader.campaign(cid)
    events_before = await reader.events(cid)

    with pytest.raises(Forbidden):
        await (await actors("worker")).request_side_effect(
            cid, gen, kind="git.update_ref", target=MAIN, precondition={"old": "a" * 40},
            idempotency_key="sneaky", payload={"repository": "/tmp/x", "new": "b" * 40})

    refused = await reader.security_events(cid)
    assert [(s.actor_role, s.action, s.target) for s in refused] == [("worker", "git.update_ref", MAIN)]
    assert refused[0].details["idempotency_key"] == "sneaky"
    assert admin.execute("SELECT count(*) AS n FROM ledger.side_effect").fetchone()["n"] == 0
    after = await reader.campaign(cid)
    same = ("state", "generation", "lease_owner", "lease_expires_at", "attempt_count", "promoted_at")
    assert {f: getattr(after, f) for f in same} == {f: getattr(before, f) for f in same}
    new_events = (await reader.events(cid))[len(events_before):]
    assert [e.type for e in new_events] == ["security.refused"], "only the refusal is journalled"
    # the same worker may touch what its profile allows: the refusal was about the ref
    allowed = await (await actors("worker")).request_side_effect(
        cid, gen, kind="git.update_ref", target="refs/heads/ledger/fix", precondition={"old": None},
        idempotency_key="fine", payload={"repository": "/tmp/x", "new": "b" * 40})
    assert allowed.status == "requested"


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
@pytest.mark.parametrize("superseded_by", ["abandon", "reap"])
async def test_a_stale_worker_cannot_record_an_intent(actors: Actors, admin: Admin, test_class: str, superseded_by) -> None:
    await (await actors("operator")).register_class(
        test_class, authority={"worker": {"refs": ["refs/heads/ledger/*"]}})
    cid, gen = await Driver(actors, test_class).leased()
    if superseded_by == "abandon":
        await (await actors("operator")).abandon(cid, "stop")
    else:
        await actors("reaper")
        async with actors.session("reaper").transaction(now=now() + timedelta(minutes=5)) as tx:
            assert [r.campaign_id for r in await Kernel(tx).expire_leases()] == [cid]
    before = await (await actors.reads("reader")).campaign(cid)

    with pytest.raises(StaleLease):
        await (await actors("worker")).request_side_effect(
            cid, gen, kind="git.update_ref", target="refs/heads/ledger/fix",
            precondition={"old": None}, idempotency_key="late", payload={"new": "b" * 40})

    assert admin.execute("SELECT count(*) AS n FROM ledger.side_effect").fetchone()["n"] == 0
    assert await (await actors.reads("reader")).campaign(cid) == before
    assert await Dispatcher(await actors("dispatcher")).run_once() == 0


# =====================================================================================
# The loop and the command
# =====================================================================================


class _Wake:
    """A real in-process wake source (what a LISTEN hub delivers, minus LISTEN)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except TimeoutError:
            return False
        self.event.clear()
        return True

    def drain(self) -> list[str]:
        return []

    @contextmanager
    def subscribe(self, channel: str, key: str | None = None) -> Iterator[_Wake]:
        assert channel == "ledger_outbox"
        yield self


async def test_run_idles_on_the_outbox_channel_and_wakes_for_new_intents(actors: Actors, repo: Path) -> None:
    """With an hour-long poll tick, only the wake-up can get the intent done in time."""
    wake = _Wake()
    stop = asyncio.Event()
    dispatcher = Dispatcher(await actors("dispatcher"), hub=wake, poll_s=3600)
    task = asyncio.create_task(dispatcher.run(stop))
    try:
        await until(lambda: dispatcher.runs >= 1, "the first (empty) pass")
        base = rev(repo)
        candidate = child(repo, base, "candidate")
        cid, effect = await accepted(actors, repo, candidate)
        wake.event.set()  # the NOTIFY accept sent
        await until(lambda: rev(repo) != base, "the promotion", timeout_s=10)
        await until(lambda: dispatcher.recorded["done"] == 1, "the record", timeout_s=10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert (await side_effect(actors, cid, effect)).state == "done"
    landed(repo, candidate, base)


async def test_command_wakes_on_notify_and_runs_until_sigterm(actors: Actors, repo: Path, db_url: str, tmp_path: Path) -> None:
    """``ledger dispatcher`` with an hour-long poll: once its hub listens and it
    idles, only the NOTIFY that accept sends can get the promotion done. SIGTERM
    then ends it with exit code 0."""
    proc, log = dispatcher_process(db_url, tmp_path, "--poll", "3600", "--log-level", "debug",
                                   fault=False)

    def lines() -> list[dict[str, Any]]:
        return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]

    def idle_and_listening() -> bool:
        events = [line["event"] for line in lines()]
        return "hub listening" in events and "dispatcher idle" in events[events.index("hub listening"):]

    try:
        await until(idle_and_listening, "the dispatcher to listen and idle", proc=proc, log=log)
        base = rev(repo)
        candidate = child(repo, base, "candidate")
        cid, effect = await accepted(actors, repo, candidate)

        async def done() -> bool:
            return (await side_effect(actors, cid, effect)).state == "done"
        await until(done, "the promotion to be recorded", proc=proc, log=log, timeout_s=20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            kill(proc)
    landed(repo, candidate, base)
    events = lines()
    assert {"dispatcher started", "side effect done", "dispatcher stopped"} <= {e["event"] for e in events}
    done_line = next(e for e in events if e["event"] == "side effect done")
    assert (done_line["side_effect"], done_line["campaign"], done_line["kind"]) == (
        effect, cid, "git.update_ref")


async def test_command_once_with_nothing_due_exits_zero(db_url: str, tmp_path: Path) -> None:
    proc, log = dispatcher_process(db_url, tmp_path, "--once", fault=False)
    assert proc.wait(timeout=60) == 0, log.read_text()
    assert "0 side effect(s) dispatched" in log.read_text()
