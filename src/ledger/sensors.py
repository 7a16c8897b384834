"""Sensors: scheduled observations of targets (``ledger sensor run``).

APScheduler's triggers do the calendar arithmetic (interval or cron); ticks
are the trigger's fire times, aligned to the epoch, so every process on the
same schedule computes the same ticks. Before running a check, a process claims
its tick in the database (``claim_sensor_tick``): two sensor processes never
both observe one tick. At start a sensor looks back: if the latest due tick was
missed (nobody was running), it observes it once -- missed runs are coalesced,
never replayed in a burst. Each observation is one kernel call
(``record_observation``) that opens, regresses, confirms or dismisses.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from .config import LedgerConfig, SensorConfig
from .errors import ConfigError, LedgerError
from .kernel import Kernel
from .logs import get_logger
from .models import ObservationRecorded

EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
_OUTPUT_LIMIT = 8 * 1024


def trigger_for(sensor: SensorConfig) -> BaseTrigger:
    """The APScheduler trigger of a sensor's schedule (UTC, epoch-aligned)."""
    if sensor.every_s is not None:
        return IntervalTrigger(seconds=sensor.every_s, start_date=EPOCH, timezone=timezone.utc)
    try:
        return CronTrigger.from_crontab(sensor.cron, timezone=timezone.utc)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(f"sensor {sensor.name}: bad cron {sensor.cron!r}: {exc}") from exc


def next_tick(trigger: BaseTrigger, after: datetime) -> datetime:
    """The first fire time strictly after ``after``."""
    fire = trigger.get_next_fire_time(None, after + timedelta(microseconds=1))
    assert fire is not None
    return fire  # type: ignore[no-any-return]


def latest_due_tick(trigger: BaseTrigger, now: datetime, horizon: timedelta = timedelta(days=8)) -> datetime | None:
    """The last fire time at or before ``now`` (within ``horizon``), if any."""
    if isinstance(trigger, IntervalTrigger):
        step = trigger.interval.total_seconds()
        return EPOCH + timedelta(seconds=((now - EPOCH).total_seconds() // step) * step)
    fire, last = next_tick(trigger, now - horizon), None
    while fire <= now:
        last, fire = fire, next_tick(trigger, fire)
    return last


@dataclass(frozen=True)
class Reading:
    """What a check saw."""

    status: str  # green or red
    started_at: datetime
    finished_at: datetime
    details: dict[str, Any]


async def check(sensor: SensorConfig) -> Reading:
    """Run the sensor's check once: a command (exit 0 is green) or an HTTP probe."""
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    if sensor.command is not None:
        details = await _run_command(sensor)
        green = details.get("exit_code") == 0
    else:
        details = await _probe(sensor)
        green = details.get("status_code") == sensor.expect_status
    details["duration_s"] = round(time.monotonic() - t0, 3)
    return Reading("green" if green else "red", started, datetime.now(timezone.utc), details)


async def _run_command(sensor: SensorConfig) -> dict[str, Any]:
    assert sensor.command is not None
    try:
        proc = await asyncio.create_subprocess_exec(
            *sensor.command, cwd=sensor.cwd, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True)
    except OSError as exc:
        return {"command": sensor.command, "error": f"cannot start: {exc.strerror}"}
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), sensor.timeout_s)
    except TimeoutError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()
        return {"command": sensor.command, "error": f"timed out after {sensor.timeout_s:g}s"}
    return {"command": sensor.command, "exit_code": proc.returncode,
            "output": out.decode(errors="replace")[-_OUTPUT_LIMIT:]}


async def _probe(sensor: SensorConfig) -> dict[str, Any]:
    try:
        async with httpx.AsyncClient(timeout=sensor.timeout_s) as client:
            response = await client.get(sensor.url)  # type: ignore[arg-type]
        return {"url": sensor.url, "status_code": response.status_code,
                "body": response.text[:_OUTPUT_LIMIT]}
    except httpx.HTTPError as exc:
        return {"url": sensor.url, "error": str(exc) or type(exc).__name__}


class Sensor:
    """One sensor's schedule, tick claims and observations."""

    def __init__(self, kernel: Kernel, config: SensorConfig, identity: str):
        self.kernel = kernel
        self.config = config
        self.identity = identity
        self.trigger = trigger_for(config)
        self.log = get_logger("sensor", sensor=config.name, target=config.target)
        self.observed = 0

    async def observe(self, tick: datetime | None) -> ObservationRecorded | None:
        """Claim ``tick`` (if given), check, and record; ``None`` if another
        process owns the tick."""
        if tick is not None and not await self.kernel.claim_sensor_tick(self.config.name, tick, self.identity):
            self.log.info("tick owned by another sensor process", tick=tick.isoformat())
            return None
        reading = await check(self.config)
        result = await self.kernel.record_observation(
            self.config.name, self.config.objective_key(), self.config.target, reading.status,
            reading.started_at, finished_at=reading.finished_at, details=reading.details,
            class_=self.config.campaign_class, tick=tick)
        self.observed += 1
        self.log.info("observed", status=reading.status, effect=result.effect,
                      campaign=result.campaign_id, tick=tick.isoformat() if tick else None)
        return result

    async def run(self, stop: asyncio.Event) -> None:
        """Observe every tick until ``stop``; first the latest missed tick, once."""
        now = datetime.now(timezone.utc)
        due = latest_due_tick(self.trigger, now)
        upcoming = next_tick(self.trigger, now)
        if due is not None:
            await self._safely(due)
        while not stop.is_set():
            delay = (upcoming - datetime.now(timezone.utc)).total_seconds()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    return
                except TimeoutError:
                    pass
            # Running late (a slow check, a suspended process)? Observe the
            # latest due tick once and skip the rest: coalesced, not replayed.
            now = datetime.now(timezone.utc)
            tick = latest_due_tick(self.trigger, now) or upcoming
            await self._safely(tick)
            upcoming = next_tick(self.trigger, max(tick, now))

    async def _safely(self, tick: datetime) -> None:
        try:
            await self.observe(tick)
        except LedgerError as exc:
            self.log.warning("observation failed", tick=tick.isoformat(), error=exc.message)


async def run_sensors(kernel: Kernel, config: LedgerConfig, names: list[str], identity: str,
                      stop: asyncio.Event, *, once: bool = False) -> int:
    """Run the named sensors (all when empty) until ``stop``; ``once``: observe
    each once now, outside the schedule, and return. Returns the number of
    observations."""
    chosen = names or sorted(config.sensors)
    unknown = [n for n in chosen if n not in config.sensors]
    if unknown:
        raise ConfigError(f"unknown sensor(s): {', '.join(unknown)}")
    if not chosen:
        raise ConfigError("the config declares no sensors")
    sensors = [Sensor(kernel, config.sensors[n], identity) for n in chosen]
    if once:
        for sensor in sensors:
            await sensor.observe(None)  # a manual observation, outside the schedule
    else:
        await asyncio.gather(*(sensor.run(stop) for sensor in sensors))
    return sum(s.observed for s in sensors)
