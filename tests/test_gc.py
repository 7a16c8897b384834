"""Retention of attempt branches and worktrees (``ledger gc``, ``Collector``)
on a real repository and a real database."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_PREFIX
from ledger.config import parse_config
from ledger.roles.gc import Collector, collect

pytestmark = pytest.mark.anyio


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/ledger/").split()


@pytest.fixture
async def shelf(actors: Any, tmp_path: Path) -> dict[str, Any]:
    """A repository with attempt branches of: a campaign closed long enough ago
    (class `quick`, no retention), one closed within its retention (`slow`),
    one still open, and one this database never had."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README").write_text("x\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "start")
    body = {"repository": str(repo), "attempt_command": ["true"]}
    config = parse_config({"classes": {"quick": {**body, "branch_retention_s": 0},
                                       "slow": {**body, "branch_retention_s": 3600}}})
    operator, sensor = await actors("operator"), await actors("sensor")
    for name, cls in config.classes.items():
        await operator.register_class(name, **cls.registration())
    closed = (await sensor.open_campaign("quick", "a", "repo")).campaign_id
    recent = (await sensor.open_campaign("slow", "b", "repo")).campaign_id
    still_open = (await sensor.open_campaign("quick", "c", "repo")).campaign_id
    for cid in (closed, recent):
        await operator.abandon(cid, "done with it")
    for cid, attempt in ((closed, 1), (closed, 2), (recent, 1), (still_open, 1), (999999, 1)):
        git(repo, "branch", f"ledger/{cid}/{attempt}", "main")
    git(repo, "branch", "ledger/not-an-attempt", "main")
    (tmp_path / "ledger.toml").write_text(
        "".join(f'[classes.{n}]\nrepository = "{repo}"\nattempt_command = ["true"]\n'
                f"branch_retention_s = {r}\n" for n, r in (("quick", 0), ("slow", 3600))))
    return {"repo": repo, "config": config, "closed": closed, "recent": recent, "open": still_open,
            "data": tmp_path / "data"}


async def test_branches_of_long_closed_campaigns_go_the_rest_stay(actors: Any, shelf: dict[str, Any]) -> None:
    repo, closed = shelf["repo"], shelf["closed"]
    reader = await actors.reads()
    dry = await collect(reader, shelf["config"], shelf["data"], dry_run=True)
    assert sorted(dry.deleted) == [f"{repo} refs/heads/ledger/{closed}/1", f"{repo} refs/heads/ledger/{closed}/2"]
    assert len(branches(repo)) == 6, "a dry run deletes nothing"

    done = await collect(reader, shelf["config"], shelf["data"])
    assert sorted(done.deleted) == sorted(dry.deleted)
    assert (done.kept_open, done.kept_recent, done.kept_unknown, done.errors) == (1, 1, 1, [])
    assert sorted(branches(repo)) == sorted([f"ledger/{shelf['recent']}/1", f"ledger/{shelf['open']}/1",
                                             "ledger/999999/1", "ledger/not-an-attempt"])
    again = await collect(reader, shelf["config"], shelf["data"])
    assert again.deleted == []


async def test_a_checked_out_or_moved_branch_is_kept_and_stale_worktrees_are_pruned(
        actors: Any, shelf: dict[str, Any], tmp_path: Path) -> None:
    repo, closed = shelf["repo"], shelf["closed"]
    git(repo, "worktree", "add", "-q", str(tmp_path / "looking"), f"ledger/{closed}/1")
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "gone"), "main")
    shutil.rmtree(tmp_path / "gone")
    collector = Collector(await actors.reads(), shelf["config"], shelf["data"], interval_s=60)
    assert await collector.run_once() == 2  # one branch, one stale worktree
    assert collector.last is not None
    assert collector.last.deleted == [f"{repo} refs/heads/ledger/{closed}/2"]
    assert collector.last.kept_moved == 1 and collector.last.pruned_worktrees == 1
    assert f"ledger/{closed}/1" in branches(repo)


async def test_ledger_gc_command(db_url: str, shelf: dict[str, Any], tmp_path: Path) -> None:
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(shelf["data"]), "LEDGER_CONFIG": str(tmp_path / "ledger.toml")}
    dry = subprocess.run([sys.executable, "-m", "ledger", "gc", "--dry-run", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dry_run"] is True and len(report["deleted"]) == 2
    done = subprocess.run([sys.executable, "-m", "ledger", "gc", "--class", "quick"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "gc: deleted 2 branch(es)" in done.stderr
    assert len(branches(shelf["repo"])) == 4
    unknown = subprocess.run([sys.executable, "-m", "ledger", "gc", "--class", "nope"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert unknown.returncode != 0 and "nope" in unknown.stderr and "Traceback" not in unknown.stderr
