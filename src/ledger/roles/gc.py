"""Retention of what attempts leave in the user's repositories (``ledger gc``).

Every attempt works on its own branch, ``ledger/<campaign>/<attempt>``, in the
class's repository. Once a campaign is closed (confirmed, dismissed or
abandoned) and its class's ``branch_retention_s`` has passed, its branches are
deleted -- with a compare-and-swap, so a branch someone moved or checked out
is left alone. Nothing is lost: each attempt's evidence bundle keeps its
candidate's SHA, diff and digest. A pass also prunes the administrative files
of worktrees whose directory is gone, and removes the work directories of
attempts whose worker died on this host.

Branches of campaigns that this database does not know, and of open or
exhausted campaigns, are kept. ``Collector`` is the same work as a
periodic service (``ledger.runtime.service.Loop``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ledger.config import CampaignClassConfig, LedgerConfig
from ledger.db.models import Campaign
from ledger.db.reads import Reads
from ledger.errors import NotFound
from ledger.git.repository import GitError, Repository
from ledger.roles.attempt import sweep_orphans
from ledger.runtime.service import Loop


@dataclass
class Collected:
    """What one pass found and did (``--json`` prints it)."""

    deleted: list[str] = field(default_factory=list)  # "<repository> <ref>"
    kept_open: int = 0  # branches of campaigns still open or exhausted
    kept_recent: int = 0  # closed, but within the class's retention
    kept_unknown: int = 0  # campaigns this database does not have
    kept_moved: int = 0  # moved or checked out since listed: not deleted
    pruned_worktrees: int = 0
    swept_workdirs: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def work(self) -> int:
        """How much was removed in all."""
        return len(self.deleted) + self.pruned_worktrees + self.swept_workdirs


async def collect(reads: Reads, config: LedgerConfig, data_dir: Path, *,
                  classes: Sequence[str] = (), dry_run: bool = False,
                  now: datetime | None = None) -> Collected:
    """One pass over the repositories of ``classes`` (default: every class of
    ``config``). ``dry_run``: count what would be deleted, delete nothing.
    ``reads`` only reads (any role will do)."""
    now = now or datetime.now(timezone.utc)
    chosen = [config.campaign_class(name) for name in classes] if classes else list(config.classes.values())
    result = Collected()
    seen: set[str] = set()
    campaigns: dict[int, Campaign | None] = {}
    for cls in chosen:
        if cls.repository in seen:
            continue
        seen.add(cls.repository)
        repo = Repository(cls.repository, cache_dir=data_dir / "repos")
        try:
            branches = await asyncio.to_thread(repo.attempt_branches)
        except GitError as exc:
            result.errors.append(f"{cls.repository}: {exc.message}")
            continue
        for ref, sha, campaign_id, _attempt in branches:
            if campaign_id not in campaigns:
                campaigns[campaign_id] = await _campaign(reads, campaign_id)
            campaign = campaigns[campaign_id]
            if campaign is None:
                result.kept_unknown += 1
            elif not campaign.is_terminal or campaign.closed_at is None:
                result.kept_open += 1
            elif campaign.closed_at > now - timedelta(seconds=_retention(config, campaign, cls)):
                result.kept_recent += 1
            elif dry_run or await asyncio.to_thread(repo.delete_ref, ref, sha):
                result.deleted.append(f"{cls.repository} {ref}")
            else:
                result.kept_moved += 1
        if not dry_run and not repo.is_remote:
            try:
                pruned = await asyncio.to_thread(repo.prune_worktrees)
            except GitError as exc:
                result.errors.append(f"{cls.repository}: {exc.message}")
            else:
                result.pruned_worktrees += pruned
    if not dry_run:
        result.swept_workdirs = await asyncio.to_thread(sweep_orphans, data_dir)
    return result


async def _campaign(reads: Reads, campaign_id: int) -> Campaign | None:
    try:
        return await reads.campaign(campaign_id)
    except NotFound:
        return None


def _retention(config: LedgerConfig, campaign: Campaign, listed_by: CampaignClassConfig) -> float:
    # The campaign's own class decides; a class since removed from the config
    # falls back to the class whose repository listed the branch.
    return config.classes.get(campaign.class_, listed_by).branch_retention_s


class Collector(Loop):
    """``collect`` every ``interval_s`` (the maintenance loop of ``ledger gc``)."""

    name = "gc"

    def __init__(self, reads: Reads, config: LedgerConfig, data_dir: Path, *,
                 interval_s: float = 3600.0, classes: Sequence[str] = ()):
        super().__init__(interval_s)
        for name in classes:
            config.campaign_class(name)  # unknown classes are a config error now, not later
        self.reads = reads
        self.config = config
        self.data_dir = data_dir
        self.classes = list(classes)
        self.last: Collected | None = None

    async def run_once(self) -> int:
        self.last = await collect(self.reads, self.config, self.data_dir, classes=self.classes)
        for error in self.last.errors:
            self.log.warning("gc could not read a repository", error=error)
        return self.last.work
