"""What most drills set up: a repository, a campaign class whose attempt
command follows a plan, and the ``ledger`` processes to run against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledger.config import LedgerConfig
from ledger.drills.paths import scripted_attempt
from ledger.ops.drill import DrillContext, drill_python

CLASS = "work"
WORKER_ARGS = ("worker", "--poll", "0.3", "--grace", "0.5")


def _toml(value: Any) -> str:
    # JSON strings, numbers and arrays are valid TOML values.
    return json.dumps(value)


def content_check(path: str, expected: str) -> list[str]:
    """An acceptance command: passes when ``path`` holds ``expected``."""
    code = (f"import pathlib, sys; text = pathlib.Path({path!r}).read_text() "
            f"if pathlib.Path({path!r}).exists() else ''; "
            f"print('found', repr(text)); sys.exit(0 if text == {expected!r} else 1)")
    return [drill_python(), "-c", code]


async def setup(ctx: DrillContext, plan: dict[str, list[list[Any]]], *, lease_s: float = 3.0,
                heartbeat_s: float = 0.5, max_attempts: int = 3,
                acceptance: list[list[str]] | None = None, promote: bool = False,
                files: dict[str, str] | None = None, sensor: str = "") -> tuple[LedgerConfig, Path]:
    """Write and register a config with class ``work``; returns it and the repository."""
    repo = ctx.repository(files)
    plan_file = ctx.plan(plan)
    lines = [
        f"[classes.{CLASS}]",
        f"repository = {_toml(str(repo))}",
        f"attempt_command = {_toml([drill_python(), str(scripted_attempt()), str(plan_file)])}",
        "attempt_timeout_s = 60",
        f"max_attempts = {max_attempts}",
        f"lease_s = {lease_s}",
        f"heartbeat_s = {heartbeat_s}",
        "backoff = { base_s = 0, jitter = 0 }",
        f"acceptance = {{ commands = {_toml(acceptance or [])}, timeout_s = 30, "
        f"cell = {{ writable = {_toml([str(plan_file.parent)])} }} }}",
        'authority.worker = { refs = ["refs/heads/ledger/*"] }',
        # the scripted attempt's plan and markers: the one host directory its cell may write
        f"cell = {{ writable = {_toml([str(plan_file.parent)])} }}",
    ]
    if promote:
        lines.append('promote_to = "refs/heads/main"')
    config = ctx.write_config("\n".join(lines) + "\n" + sensor)
    await ctx.register(config)
    ctx.step(f"class {CLASS}: lease {lease_s:g}s, heartbeat {heartbeat_s:g}s, "
             f"{max_attempts} attempt(s); repository {repo}")
    return config, repo


async def open_campaigns(ctx: DrillContext, n: int = 1, prefix: str = "objective") -> list[int]:
    """Open ``n`` campaigns of class ``work`` (as the sensor role)."""
    sensor = await ctx.kernel("sensor")
    ids = [(await sensor.open_campaign(CLASS, f"{prefix}-{i}", "repo")).campaign_id for i in range(n)]
    ctx.step(f"opened campaign(s) {ids[0]}" + (f"..{ids[-1]}" if n > 1 else ""))
    return ids


def started(ctx: DrillContext, campaign: int, attempt: int) -> Path:
    return ctx.marker("started", campaign, attempt)


def one_ending_per_attempt(ctx: DrillContext) -> bool:
    """No attempt left running and none ended twice (the schema refuses a second
    ending; a running one after the dust settles would be a lost ending)."""
    rows = ctx.sql("SELECT count(*) AS n FROM ledger.attempt WHERE outcome = 'running' "
                   "AND campaign_id NOT IN (SELECT id FROM ledger.campaign WHERE state = 'leased')")
    return rows[0]["n"] == 0
