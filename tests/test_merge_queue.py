"""The merge queue: verified candidates for one target wait in order; when the
target moved, the next ones are stacked onto it and only the stack's top is
verified; a passing stack lands whole (one commit per candidate, each with its
own trailers), a failing one is bisected, and its culprit is rejected by an
ordinary verification of its own change on the target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_dispatcher import MAIN, git, rev
from test_rebase import commit

from conftest import Actors, Admin
from drive import Driver, record_candidate
from ledger.roles.dispatcher import Dispatcher

pytestmark = pytest.mark.anyio
CLASS = "queued"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo.git"
    git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(path))
    seed = tmp_path / "seed"
    git(tmp_path, "init", "--quiet", "--initial-branch=main", str(seed))
    (seed / "README").write_text("base\n")
    git(seed, "add", ".")
    git(seed, "commit", "--quiet", "-m", "base")
    git(seed, "push", "--quiet", str(path), "main")
    return path


async def fleet(actors: Any, repo: Path, files: list[dict[str, str]], *, batch_size: int = 8,
                max_attempts: int = 3) -> list[int]:
    """One verified campaign per entry of ``files``, each a candidate on the
    same base writing those files, accepted in order."""
    await (await actors("operator")).register_class(
        CLASS, max_attempts=max_attempts, lease_seconds=30, backoff_base_s=0, backoff_jitter=0,
        promotion={"ref": MAIN, "repository": str(repo),
                   "merge_queue": {"batch_size": batch_size, "max_wait_s": 0}})
    base = rev(repo)
    d = Driver(actors, CLASS)
    worker, verifier = await actors("worker"), await actors("verifier")
    cids = []
    for n, change in enumerate(files):
        cid = await d.open()
        claim = await worker.claim_campaign("worker-1", [CLASS])
        assert claim is not None and claim.campaign_id == cid
        await record_candidate(worker, claim, repo=repo, base=base,
                               sha_=commit(repo, base, change, f"change {n}"),
                               acceptance={"commands": [["true"]]})
        check = await verifier.claim_verification("verifier-0", classes=[CLASS])
        assert check is not None and check.campaign_id == cid
        await verifier.accept(check.verification_id, {"summary": f"own check {n}"})
        cids.append(cid)
    return cids


async def settle(actors: Any, repo: Path, dispatcher: Dispatcher, judge: Any) -> list[dict[str, Any]]:
    """Dispatch and verify until nothing is left to do; ``judge(tree files)``
    says whether a candidate passes. Returns each verification made here."""
    verifier = await actors("verifier")
    made = []
    for _ in range(200):
        await dispatcher.run_once()
        check = await verifier.claim_verification("verifier-1", classes=[CLASS])
        if check is None:
            if await dispatcher.run_once() == 0:
                break
            continue
        files = set(git(repo, "ls-tree", "--name-only", check.candidate_sha).split())
        ok = judge(files)
        made.append({"campaign": check.campaign_id, "ok": ok, "files": files})
        if ok:
            await verifier.accept(check.verification_id, {"summary": "the stack passes"})
        else:
            await verifier.reject(check.verification_id, "the tests fail on the stack")
    else:
        raise AssertionError("the queue never settled")
    return made


def trailers(repo: Path, sha: str) -> dict[str, str]:
    body = git(repo, "show", "-s", "--format=%(trailers:only,unfold)", sha)
    return dict(line.split(": ", 1) for line in body.splitlines() if ": " in line)


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_moved_target_is_caught_up_by_one_verified_batch(
        actors: Actors, admin: Admin, repo: Path, tmp_path: Path) -> None:
    base = rev(repo)
    cids = await fleet(actors, repo, [{f"f{n}.txt": f"{n}\n"} for n in range(6)], batch_size=8)
    dispatcher = Dispatcher(await actors("dispatcher"), data_dir=tmp_path / "dispatcher")
    made = await settle(actors, repo, dispatcher, judge=lambda files: True)

    # the first landed as ever; the five behind it were verified once, together
    assert [m["campaign"] for m in made] == [cids[-1]], made
    assert made[0]["files"] >= {f"f{n}.txt" for n in range(6)}
    history = git(repo, "rev-list", "--reverse", f"{base}..{MAIN}").split()
    assert len(history) == 6
    reader = await actors.reads("reader")
    for n, (cid, sha) in enumerate(zip(cids, history)):
        # each candidate its own commit, in queue order, with its own trailers
        assert trailers(repo, sha)["Ledger-Campaign"] == str(cid)
        assert f"own check {n}" in trailers(repo, sha)["Ledger-Verdict"] or n == len(cids) - 1
        assert git(repo, "show", f"{sha}:f{n}.txt") == str(n)
        campaign = await reader.campaign(cid)
        assert (campaign.state, campaign.promoted_sha) == ("verified", sha)
        assert campaign.attempt_count == 1, "no attempt charged by the queue"
    # exactly once: one done promotion per campaign, and the queue is empty
    rows = admin.execute("SELECT campaign_id, count(*) AS n FROM ledger.side_effect "
                         "WHERE purpose = 'promotion' AND state = 'done' GROUP BY campaign_id").fetchall()
    assert sorted((r["campaign_id"], r["n"]) for r in rows) == [(c, 1) for c in cids]
    assert admin.execute("SELECT count(*) AS n FROM ledger.merge_queue").fetchone()["n"] == 0
    (batch,) = admin.execute("SELECT * FROM ledger.merge_batch").fetchall()
    assert (batch["state"], batch["members"], batch["landed"]) == ("landed", cids[1:], history[1:])


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_failing_batch_is_bisected_and_its_culprit_rejected_alone(
        actors: Actors, admin: Admin, repo: Path, tmp_path: Path) -> None:
    """Candidate 5 breaks candidate 2's tests only in combination: every
    other candidate lands, candidate 5 is rejected by an ordinary verdict on
    its own change (charged, its approach refused), nobody else is charged."""
    files = [{f"f{n}.txt": f"{n}\n"} for n in range(9)]
    cids = await fleet(actors, repo, files, batch_size=8)
    dispatcher = Dispatcher(await actors("dispatcher"), data_dir=tmp_path / "dispatcher")
    made = await settle(actors, repo, dispatcher,
                        judge=lambda files: not {"f2.txt", "f5.txt"} <= files)

    reader = await actors.reads("reader")
    culprit = await reader.campaign(cids[5])
    assert culprit.state == "ready" and culprit.attempt_count == 1
    assert "rejected" in (culprit.last_failure_reason or "")
    landed = git(repo, "rev-list", "--reverse", MAIN).split()[1:]
    assert [trailers(repo, s)["Ledger-Campaign"] for s in landed] == [str(c) for c in cids if c != cids[5]]
    for cid in cids:
        if cid != cids[5]:
            c = await reader.campaign(cid)
            assert c.promoted_sha in landed and c.attempt_count == 1, (cid, c)
    # the culprit was judged alone on the target last of all
    assert made[-2:][0]["campaign"] == cids[5] or any(
        m["campaign"] == cids[5] and not m["ok"] and {"f2.txt", "f5.txt"} <= m["files"] for m in made)
    transitions = [e.payload["transition"] for e in await reader.events(cids[8]) if e.type == "transition"]
    assert "requeue" in transitions, "the top of the failed stack went back to the queue uncharged"
    assert len(made) < len(cids), f"{len(made)} verifications for {len(cids) - 1} landings"
    assert admin.execute("SELECT count(*) AS n FROM ledger.merge_queue").fetchone()["n"] == 0


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_campaign_abandoned_while_queued_leaves_the_queue(
        actors: Actors, admin: Admin, repo: Path, tmp_path: Path) -> None:
    cids = await fleet(actors, repo, [{f"f{n}.txt": f"{n}\n"} for n in range(4)], batch_size=8)
    dispatcher = Dispatcher(await actors("dispatcher"), data_dir=tmp_path / "dispatcher")
    await dispatcher.run_once()  # the head lands, the rest is stacked, the probe is cids[3]
    (batch,) = admin.execute("SELECT * FROM ledger.merge_batch").fetchall()
    assert batch["members"] == cids[1:] and batch["state"] == "verifying"
    await (await actors("operator")).abandon(cids[2], "changed my mind")
    assert admin.execute("SELECT state FROM ledger.merge_batch").fetchone()["state"] == "dissolved"
    queued = [r["campaign_id"] for r in admin.execute(
        "SELECT campaign_id FROM ledger.merge_queue ORDER BY position").fetchall()]
    assert queued == [cids[1], cids[3]]
    await settle(actors, repo, dispatcher, judge=lambda files: True)
    landed = git(repo, "rev-list", "--reverse", MAIN).split()[1:]
    assert [trailers(repo, s)["Ledger-Campaign"] for s in landed] == [str(c) for c in (cids[0], cids[1], cids[3])]
    assert "f2.txt" not in git(repo, "ls-tree", "--name-only", MAIN).split()


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_the_queue_knobs_are_range_checked(actors: Actors) -> None:
    from ledger.errors import LedgerError
    operator = await actors("operator")
    for bad in ({"batch_size": 0}, {"batch_size": 65}, {"max_wait_s": -1}, {"max_wait_s": "soon"}):
        with pytest.raises(LedgerError, match="batch_size|max_wait_s|merge_queue"):
            await operator.register_class("knobs", promotion={"ref": MAIN, "repository": "/r",
                                                              "merge_queue": bad})


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_probe_rejected_on_a_dissolved_stack_is_not_charged(
        actors: Actors, admin: Admin, repo: Path, tmp_path: Path) -> None:
    """The probe was being verified on a stack that lost a member (abandoned):
    its rejection judged a combination that will never land, so it is no
    verdict on the probe -- requeued, uncharged, and landed on a fresh stack."""
    cids = await fleet(actors, repo, [{f"f{n}.txt": f"{n}\n"} for n in range(4)], batch_size=8)
    dispatcher = Dispatcher(await actors("dispatcher"), data_dir=tmp_path / "dispatcher")
    await dispatcher.run_once()
    await (await actors("operator")).abandon(cids[2], "changed my mind")
    made = await settle(actors, repo, dispatcher, judge=lambda files: "f2.txt" not in files)
    assert made[0] == {"campaign": cids[3], "ok": False, "files": made[0]["files"]}
    assert "f2.txt" in made[0]["files"], "the first verdict judged the dissolved stack"
    reader = await actors.reads("reader")
    probe = await reader.campaign(cids[3])
    assert probe.promoted_sha == rev(repo) and probe.attempt_count == 1, probe
    transitions = [e.payload["transition"] for e in await reader.events(cids[3]) if e.type == "transition"]
    assert "requeue" in transitions and "reject" not in transitions, transitions
