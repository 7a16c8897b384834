"""A verified candidate whose promotion target moved is rebased and verified
again before anything is re-attempted; only a change that does not apply
cleanly returns the campaign to ready, and then without spending an attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_dispatcher import MAIN, git, rev

from conftest import Actors, Admin
from drive import Driver, record_candidate
from ledger.git import bundle as bundles
from ledger.roles.dispatcher import Dispatcher

pytestmark = pytest.mark.anyio


def commit(repo: Path, parent: str, files: dict[str, str], message: str) -> str:
    """A commit on ``parent`` that writes ``files`` (no ref moves)."""
    work = repo.parent / f"work-{message.replace(' ', '-')}"
    git(repo, "worktree", "add", "--quiet", "--detach", str(work), parent)
    for name, text in files.items():
        (work / name).write_text(text)
    git(work, "add", ".")
    git(work, "commit", "--quiet", "-m", message)
    sha = git(work, "rev-parse", "HEAD")
    git(repo, "worktree", "remove", "--force", str(work))
    return sha


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo.git"
    git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(path))
    seed = tmp_path / "seed"
    git(tmp_path, "init", "--quiet", "--initial-branch=main", str(seed))
    (seed / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (seed / "notes.txt").write_text("notes\n")
    git(seed, "add", ".")
    git(seed, "commit", "--quiet", "-m", "base")
    git(seed, "push", "--quiet", str(path), "main")
    return path


async def verified(actors: Any, repo: Path, tmp_path: Path, candidate: str, max_attempts: int = 3) -> int:
    """A campaign whose candidate, frozen in a real bundle, was accepted."""
    await (await actors("operator")).register_class(
        "rebasing", max_attempts=max_attempts, lease_seconds=30, backoff_base_s=0, backoff_jitter=0,
        promotion={"ref": MAIN, "repository": str(repo)})
    d = Driver(actors, "rebasing")
    cid = await d.open()
    worker = await actors("worker")
    claim = await worker.claim_campaign("worker-1", ["rebasing"])
    assert claim is not None
    await record_candidate(worker, claim, repo=repo, base=rev(repo), sha_=candidate,
                           acceptance={"commands": [["true"]]})
    verifier = await actors("verifier")
    claim = await verifier.claim_verification("verifier-1", classes=["rebasing"])
    assert claim is not None
    await verifier.accept(claim.verification_id, {"ok": True})
    return cid


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_moved_target_gets_the_candidate_rebased_and_verified_again(actors: Actors, admin: Admin, repo: Path, tmp_path: Path) -> None:
    base = rev(repo)
    candidate = commit(repo, base, {"app.py": "def add(a, b):\n    return a + b\n"}, "fix add")
    cid = await verified(actors, repo, tmp_path, candidate)
    moved = commit(repo, base, {"notes.txt": "someone else's notes\n"}, "unrelated change")
    git(repo, "update-ref", MAIN, moved)

    dispatcher = Dispatcher(await actors("dispatcher"), data_dir=tmp_path / "dispatcher-data")
    claim = await dispatcher.kernel.claim_side_effect(dispatcher.identity)
    assert claim is not None
    assert await dispatcher.dispatch(claim) == "rebased"
    assert rev(repo) == moved, "nothing is promoted before the rebased candidate is verified"

    campaign = await (await actors.reads("reader")).campaign(cid)
    assert campaign.state == "attempted" and campaign.generation == claim.generation + 1
    assert (campaign.attempt_count, campaign.max_attempts) == (1, 3), "the rebase spent no attempt"
    attempts = await (await actors.reads("reader")).attempts_of(cid)
    rebased = attempts[-1]
    assert (rebased.attempt_no, rebased.outcome, rebased.worker) == (2, "attempted", dispatcher.identity)
    assert rebased.base_sha == moved and rebased.fingerprint == attempts[0].fingerprint
    assert git(repo, "rev-parse", f"{rebased.candidate_sha}^") == moved
    assert git(repo, "show", f"{rebased.candidate_sha}:app.py").endswith("return a + b")
    assert git(repo, "show", f"{rebased.candidate_sha}:notes.txt") == "someone else's notes"
    # its bundle and diff are recorded in the database, and check against its
    # digest, for a verifier on any machine; the candidate is published
    assert rebased.bundle_digest is not None and rebased.candidate_ref == f"refs/heads/ledger/{cid}/2"
    (row,) = admin.execute("SELECT diff FROM ledger.attempt WHERE campaign_id = %s AND attempt_no = 2",
                           (cid,)).fetchall()
    frozen = bundles.verify(rebased.bundle, row["diff"], rebased.bundle_digest)
    assert (frozen.attempt_no, frozen.candidate_sha, frozen.base_sha) == (2, rebased.candidate_sha, moved)
    assert rev(repo, rebased.candidate_ref) == rebased.candidate_sha
    transitions = [e.payload["transition"] for e in await (await actors.reads("reader")).events(cid)
                   if e.type == "transition"]
    assert transitions[-2:] == ["accept", "rebase"]

    # verified again, then promoted onto the moved target
    verifier = await actors("verifier")
    check = await verifier.claim_verification("verifier-2", classes=["rebasing"])
    assert check is not None and check.candidate_sha == rebased.candidate_sha
    await verifier.accept(check.verification_id, {"ok": True})
    assert await dispatcher.run_once() == 1
    # what lands is the rebased candidate's very tree, on the moved target
    landed = rev(repo)
    assert git(repo, "rev-parse", f"{landed}^{{tree}}") == git(repo, "rev-parse", f"{rebased.candidate_sha}^{{tree}}")
    assert git(repo, "rev-parse", f"{landed}^") == moved
    assert (await (await actors.reads("reader")).campaign(cid)).promoted_sha == landed


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_candidate_that_does_not_rebase_cleanly_returns_to_ready_without_spending_an_attempt(
        actors: Actors, admin: Admin, repo: Path, tmp_path: Path) -> None:
    base = rev(repo)
    candidate = commit(repo, base, {"app.py": "def add(a, b):\n    return a + b\n"}, "fix add")
    cid = await verified(actors, repo, tmp_path, candidate, max_attempts=1)
    moved = commit(repo, base, {"app.py": "def add(a, b):\n    return b + a\n"}, "a rival fix")
    git(repo, "update-ref", MAIN, moved)

    dispatcher = Dispatcher(await actors("dispatcher"), data_dir=tmp_path / "dispatcher-data")
    assert await dispatcher.run_once() == 1
    assert rev(repo) == moved
    campaign = await (await actors.reads("reader")).campaign(cid)
    # its one attempt was accepted: losing the race does not exhaust it
    assert campaign.state == "ready", campaign.state
    assert (campaign.attempt_count, campaign.max_attempts) == (0, 1), "the spent attempt was given back"
    events = await (await actors.reads("reader")).events(cid)
    last = [e for e in events if e.type == "transition"][-1]
    assert last.payload["transition"] == "promote_failed" and last.payload["attempt_given_back"] is True
    assert "does not apply" in (campaign.last_failure_reason or "")


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_remote_target_that_moved_twice_is_rebased_from_the_dispatchers_cache(
        actors: Actors, admin: Admin, repo: Path, tmp_path: Path) -> None:
    """Through a URL the dispatcher works in its own cache: the rebase is made
    there from objects it fetched (the target, the candidate and its base) and
    published; a second dispatcher with an empty cache, and the same one after
    the target moved again, never find an object missing."""
    url = f"file://{repo}"
    base = rev(repo)
    candidate = commit(repo, base, {"app.py": "def add(a, b):\n    return a + b\n"}, "fix add")
    await (await actors("operator")).register_class(
        "remote-rebasing", max_attempts=3, lease_seconds=30, backoff_base_s=0, backoff_jitter=0,
        promotion={"ref": MAIN, "repository": url})
    d = Driver(actors, "remote-rebasing")
    cid = await d.open()
    worker = await actors("worker")
    claim = await worker.claim_campaign("worker-1", ["remote-rebasing"])
    assert claim is not None
    await record_candidate(worker, claim, repo=repo, base=base, sha_=candidate,
                           acceptance={"commands": [["true"]]}, repository=url)
    verifier = await actors("verifier")
    for n in (1, 2):
        check = await verifier.claim_verification(f"verifier-{n}", classes=["remote-rebasing"])
        assert check is not None
        await verifier.accept(check.verification_id, {"ok": True})
        moved = commit(repo, rev(repo), {f"other-{n}.txt": f"{n}\n"}, f"unrelated change {n}")
        git(repo, "update-ref", MAIN, moved)
        # a fresh cache each time: nothing of the earlier rebase is there
        dispatcher = Dispatcher(await actors("dispatcher"), data_dir=tmp_path / f"dispatcher-{n}")
        claim_ = await dispatcher.kernel.claim_side_effect(dispatcher.identity)
        assert claim_ is not None
        assert await dispatcher.dispatch(claim_) == "rebased"
        rebased = (await (await actors.reads("reader")).attempts_of(cid))[-1]
        assert rev(repo, str(rebased.candidate_ref)) == rebased.candidate_sha
        assert git(repo, "rev-parse", f"{rebased.candidate_sha}^") == moved
    check = await verifier.claim_verification("verifier-3", classes=["remote-rebasing"])
    assert check is not None
    await verifier.accept(check.verification_id, {"ok": True})
    assert await Dispatcher(await actors("dispatcher"), data_dir=tmp_path / "dispatcher-1").run_once() == 1
    assert (await (await actors.reads("reader")).campaign(cid)).promoted_sha == rev(repo)


def test_replay_names_a_missing_object_and_refuses_a_rewritten_target(repo: Path) -> None:
    """The combination is made in the object database from what is there: an
    object that is not there is a system fault naming it (never a crash, never
    a verdict); a target rewritten so that the candidate's base is not behind
    it is "does not apply" (a new attempt), not an error."""
    from ledger.git.repository import Repository, SystemFault
    base = rev(repo)
    candidate = commit(repo, base, {"app.py": "def add(a, b):\n    return a + b\n"}, "fix add")
    rewritten = git(repo, "commit-tree", f"{base}^{{tree}}", "-m", "history rewritten")
    r = Repository(str(repo))
    assert r.replay(base, rewritten, candidate) is None
    assert r.replay("1" * 40, base, candidate) is None
    with pytest.raises(SystemFault, match="candidate " + "2" * 40):
        r.replay(base, base, "2" * 40)
    assert r.replay(base, base, candidate) is not None
