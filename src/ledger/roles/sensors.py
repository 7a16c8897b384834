"""Sensors: scheduled observations of targets (``ledger sensor run``).

APScheduler's triggers do the calendar arithmetic (interval or cron); ticks
are the trigger's fire times, aligned to the epoch, so every process on the
same schedule computes the same ticks. Before running a check, a process claims
its tick in the database (``claim_sensor_tick``): two sensor processes never
both observe one tick. The first run of a sensor registers it
(``register_sensor``); at every start it looks back: if the latest due tick
since its registration was missed (nobody was running), it observes it once --
missed runs are coalesced, never replayed in a burst, and a new sensor's first
tick is the next one. Each observation is one kernel call
(``record_observation``) that opens, regresses, confirms or dismisses.

A command check runs like every command Ledger does not trust
(``ledger.sandbox.processes``): its own process group, killed at the timeout, and an
allow-listed environment (plus the sensor's ``environment`` extras), since
after a promotion it runs code an agent wrote. A pytest command runs by the
fixed judge, as the verifier's (``verifiers.judge``), and reports which tests
failed and which passed (``details["tests"]``): when the observation opens a
campaign, that is the baseline its candidates are held to (see
``verifiers.pytest_report``); after a promotion, a green observation confirms
only if the tests that failed at opening are among the passed ones
(``record_observation``). A wrapper that writes a JUnit report to
``$LEDGER_JUNIT_XML`` still reports failures (a baseline) but cannot confirm.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from verifiers.judge import INSIDE_JUDGE, Judge, JudgeSettings, files_of, read_stream, remove_bytecode
from verifiers.pytest_report import pytest_command, read_report

from ledger.sandbox import cell as cells
from ledger import tracing
from ledger.config import CampaignClassConfig, LedgerConfig, SensorConfig
from ledger.errors import ConfigError, LedgerError
from ledger.db.kernel import Kernel
from ledger.logs import get_logger
from ledger.db.models import ObservationRecorded
from ledger.sandbox.processes import cell_environment, child_environment, run_command
from ledger.roles.registry import Registration, held, utcnow
from ledger.git.repository import GitError, Repository

EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
_OUTPUT_LIMIT = 8 * 1024
#: Where a wrapper around pytest may write its JUnit report (``--junitxml``).
JUNIT_VARIABLE = "LEDGER_JUNIT_XML"


def trigger_for(sensor: SensorConfig) -> BaseTrigger:
    """The APScheduler trigger of a sensor's schedule (UTC, epoch-aligned)."""
    if sensor.every_s is not None:
        return IntervalTrigger(seconds=sensor.every_s, start_date=EPOCH, timezone=timezone.utc)
    try:
        return CronTrigger.from_crontab(sensor.cron, timezone=timezone.utc)
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


async def check(sensor: SensorConfig, *, repository: str | None = None, ref: str | None = None,
                cache_dir: Path | None = None, judge: JudgeSettings | None = None) -> Reading:
    """Run the sensor's check once: a command (exit 0 is green) or an HTTP
    probe. A command whose sensor observes a repository (``repository`` and
    ``ref``: its target names its class's repository) runs in a fresh export
    of that ref's tree, fetched from the remote for a URL. A pytest command
    runs by the fixed judge (``judge``: its class's ``acceptance.pytest``),
    as the verifier's do: green needs exit 0 *and* a complete, consistent
    report from the judge, and ``details["tests"]`` is what the judge saw."""
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    if sensor.command is not None:
        details = await _run_command(sensor, repository, ref, cache_dir, judge or JudgeSettings())
        tests = details.get("tests")
        judged = not isinstance(tests, dict) or "judged" not in tests or tests["judged"] is True
        green = details.get("exit_code") == 0 and judged
    else:
        details = await _probe(sensor)
        green = details.get("status_code") == sensor.expect_status
    details["duration_s"] = round(time.monotonic() - t0, 3)
    return Reading("green" if green else "red", started, datetime.now(timezone.utc), details)


async def _run_command(sensor: SensorConfig, repository: str | None, ref: str | None,
                       cache_dir: Path | None, settings: JudgeSettings) -> dict[str, Any]:
    assert sensor.command is not None
    details: dict[str, Any] = {"command": sensor.command}
    sandboxed = sensor.cell.sandbox
    with tempfile.TemporaryDirectory(prefix="ledger-sensor-") as scratch:
        work, out = Path(scratch) / "work", Path(scratch) / "out"
        out.mkdir()
        if repository is not None and ref is not None:
            repo = Repository(repository, cache_dir=cache_dir)
            try:
                sha = await asyncio.to_thread(repo.resolve, ref)
                await asyncio.to_thread(repo.export_tree, sha, work)
            except GitError as exc:
                details["error"] = f"cannot check out {ref} of {repository}: {exc.message}"
                details["system_fault"] = True
                return details
            details.update(ref=ref, sha=sha)
        else:
            work.mkdir()
        seen_out = cells.INSIDE_OUT if sandboxed else str(out)
        report = Path(seen_out) / "junit.xml"
        pytest = pytest_command(sensor.command)
        cwd = Path(sensor.cwd) if sensor.cwd and not sandboxed else work
        judge: Judge | None = None
        prepared = None
        extras = list(sensor.environment)
        argv = list(sensor.command)
        if pytest is not None:
            # the same fixed judge as the verifier's, on the observed tree's own
            # configuration (what landed there passed the judge)
            if cwd == work:
                remove_bytecode(work)  # only an export of ours, never a directory of the user's
            judge = Judge(settings, files_of(cwd), sandboxed=sandboxed)
            prepared = judge.prepare(judge.interpreter(pytest), pytest[3:],
                                     cells.INSIDE_WORK if sandboxed else str(cwd))
            argv = prepared.argv
            extras = Judge.environment(extras)
        try:
            if sandboxed:
                try:
                    await asyncio.to_thread(cells.check_available)
                except cells.SandboxUnavailable as exc:
                    details["error"] = f"{exc.message} ({exc.hint})"
                    details["system_fault"] = True
                    return details
                env = {**cell_environment(extras), JUNIT_VARIABLE: str(report)}
                bindings = [cells.Binding(work, cells.INSIDE_WORK, writable=True),
                            cells.Binding(out, cells.INSIDE_OUT, writable=True)]
                policy = sensor.cell
                if judge is not None:
                    bindings.append(cells.Binding(judge.root, INSIDE_JUDGE, writable=False))
                    if judge.read_only():
                        policy = policy.model_copy(update={"read_only": [*policy.read_only,
                                                                          *judge.read_only()]})
                spec = cells.CellSpec(policy, tuple(bindings), cwd=cells.INSIDE_WORK, env=env)
                result = await run_command(argv, "/", timeout_s=sensor.timeout_s, tail_bytes=_OUTPUT_LIMIT,
                                           cell=spec)
            else:
                env = {**child_environment(extras), JUNIT_VARIABLE: str(report)}
                result = await run_command(argv, cwd, timeout_s=sensor.timeout_s, env=env,
                                           tail_bytes=_OUTPUT_LIMIT)
            judged = None
            if prepared is not None:
                raw = prepared.channel.close()
                judged = read_stream(raw, connected=prepared.channel.connected,
                                     overflow=prepared.channel.overflow, exit_code=result.exit_code,
                                     wall_s=result.duration_s)
        finally:
            if prepared is not None:
                prepared.channel.close(0.1)
            if judge is not None:
                judge.close()
        # Only a wrapper's report is read from the outputs (it can open a
        # campaign, never confirm one: it has no judged passed ids).
        tests = read_report(out / "junit.xml") if pytest is None else None
    if result.error:
        details["error"] = f"cannot start: {result.error}"
    elif result.timed_out:
        details["error"] = f"timed out after {sensor.timeout_s:g}s"
    else:
        details.update(exit_code=result.exit_code, output=result.output)
    if result.leftovers:
        details["leftovers"] = list(result.leftovers)
    details["sandboxed"] = result.sandboxed
    if judged is not None:
        if judged.connected or result.exit_code == 0:
            details["tests"] = judged.summary()
        if not judged.connected and not result.timed_out and result.exit_code not in (None, 0):
            details["error"] = "the judge did not start: " + result.output[-300:]
            details["system_fault"] = True
    elif tests is not None:
        details["tests"] = tests.summary()
    return details


async def _probe(sensor: SensorConfig) -> dict[str, Any]:
    try:
        async with httpx.AsyncClient(timeout=sensor.timeout_s) as client:
            response = await client.get(sensor.url)  # type: ignore[arg-type]
        return {"url": sensor.url, "status_code": response.status_code,
                "body": response.text[:_OUTPUT_LIMIT]}
    except httpx.HTTPError as exc:
        return {"url": sensor.url, "error": str(exc) or type(exc).__name__}


def observed_ref(sensor: SensorConfig, cls: CampaignClassConfig | None) -> tuple[str, str] | None:
    """The repository and ref a sensor's check runs on: its target's ref
    (``REPOSITORY#REF``) or, for a target naming only the repository, the
    branch its class promotes to (else its base); ``None`` when the target
    is not its class's repository (the check then starts in an empty
    directory) or the sensor says ``checkout = false``."""
    if cls is None or sensor.command is None or sensor.checkout is False:
        return None
    if cls.target_problem(sensor.target) is not None:
        return None
    _, sep, ref = sensor.target.partition("#")
    if not sep:
        ref = cls.promote_to or cls.base_ref
    return cls.repository, ref


class Sensor:
    """One sensor's schedule, tick claims and observations."""

    def __init__(self, kernel: Kernel, config: SensorConfig, identity: str, *,
                 observes: tuple[str, str] | None = None, cache_dir: Path | None = None,
                 judge: JudgeSettings | None = None):
        self.kernel = kernel
        self.config = config
        self.judge = judge
        self.identity = identity
        self.observes = observes
        self.cache_dir = cache_dir
        self.trigger = trigger_for(config)
        self.log = get_logger("sensor", sensor=config.name, target=config.target)
        self.observed = 0
        #: the tick the run loop is waiting for (``None`` until it first waits)
        self.waiting_for: datetime | None = None

    async def observe(self, tick: datetime | None) -> ObservationRecorded | None:
        """Claim ``tick`` (if given), check, and record; ``None`` if another
        process owns the tick, or the check could not look at the target."""
        if tick is not None and not await self.kernel.claim_sensor_tick(self.config.name, tick, self.identity):
            self.log.info("tick owned by another sensor process", tick=tick.isoformat())
            return None
        repository, ref = self.observes or (None, None)
        reading = await check(self.config, repository=repository, ref=ref, cache_dir=self.cache_dir,
                              judge=self.judge)
        if reading.details.get("system_fault"):
            # The target was never looked at (its remote out of reach, no
            # sandbox here): no observation, so no red that would open a
            # campaign or send a promoted one back. The next tick looks again.
            self.log.warning("not observed: a fault that is not the target's",
                             error=reading.details.get("error"), tick=tick.isoformat() if tick else None)
            return None
        result = await tracing.observation(
            self.kernel.executor, self.config.objective_key(), reading.status,
            {tracing.CAMPAIGN_CLASS: self.config.campaign_class, "ledger.sensor": self.config.name},
            lambda context: self.kernel.record_observation(
                self.config.name, self.config.objective_key(), self.config.target, reading.status,
                reading.started_at, finished_at=reading.finished_at, details=reading.details,
                class_=self.config.campaign_class, tick=tick, trace_context=context),
            start_ns=int(reading.started_at.timestamp() * 1e9))
        self.observed += 1
        self.log.info("observed", status=reading.status, effect=result.effect,
                      campaign=result.campaign_id, tick=tick.isoformat() if tick else None)
        return result

    async def first_tick(self, now: datetime) -> datetime:
        """The first tick to observe when starting at ``now``: the latest due
        one if it was missed since the sensor's registration (registering it
        on its first run), else the next one."""
        registered = await self.kernel.register_sensor(self.config.name, self.identity)
        due = latest_due_tick(self.trigger, now)
        return due if due is not None and due >= registered else next_tick(self.trigger, now)

    async def run(self, stop: asyncio.Event) -> None:
        """Observe every tick until ``stop``; first the latest missed tick, once."""
        now = datetime.now(timezone.utc)
        upcoming = await self.first_tick(now)
        if upcoming <= now:
            await self._safely(upcoming)
            upcoming = next_tick(self.trigger, now)
        while not stop.is_set():
            delay = (upcoming - datetime.now(timezone.utc)).total_seconds()
            if delay > 0:
                self.waiting_for = upcoming
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


#: How often a sensors process tells the registry it is alive.
REPORT_INTERVAL_S = 5.0


class Sensors:
    """The chosen sensors of a config (all when ``names`` is empty) as one
    service: ``run(stop)`` observes every tick of each until stopped;
    ``run_once`` observes each once now, outside the schedule (``--once``).
    Unknown names are a ``ConfigError`` here, before anything connects."""

    name = "sensors"

    def __init__(self, kernel: Kernel, config: LedgerConfig, names: Sequence[str], identity: str,
                 *, data_dir: Path | None = None):
        chosen = list(names) or sorted(config.sensors)
        unknown = [n for n in chosen if n not in config.sensors]
        if unknown:
            raise ConfigError(f"unknown sensor(s): {', '.join(unknown)}")
        if not chosen:
            raise ConfigError("the config declares no sensors")
        cache = data_dir / "repos" if data_dir is not None else None
        self.sensors = []
        for n in chosen:
            sensor = config.sensors[n]
            observes = observed_ref(sensor, config.classes.get(sensor.campaign_class))
            if observes is not None and cache is None and ("://" in observes[0] or observes[0].startswith("git@")):
                raise ConfigError(f"sensor {n} observes the remote {observes[0]}: a data dir is needed "
                                  "for its cache")
            cls = config.classes.get(sensor.campaign_class)
            judge = JudgeSettings.from_spec(cls.acceptance.pytest.model_dump()) if cls else None
            self.sensors.append(Sensor(kernel, sensor, identity, observes=observes, cache_dir=cache,
                                       judge=judge))
        self.since = utcnow()
        first = self.sensors[0]
        self.registration = Registration(
            first.kernel, "sensor", self.name, first.identity, REPORT_INTERVAL_S,
            holds=lambda: [held("sensor", s.config.name, self.since) for s in self.sensors])

    @property
    def observed(self) -> int:
        """Observations recorded so far, by every sensor."""
        return sum(s.observed for s in self.sensors)

    async def run_once(self) -> int:
        """Observe each sensor once now (a manual observation, no tick)."""
        for sensor in self.sensors:
            await sensor.observe(None)
        return len(self.sensors)

    async def prepare(self) -> None:
        """Its start-up check: a sensor whose command runs in a cell needs a
        host that can build one (``SandboxUnavailable``, naming the package:
        the host waits until it can, ``ledger.runtime.startup``)."""
        if any(s.config.command is not None and s.config.cell.sandbox for s in self.sensors):
            await asyncio.to_thread(cells.check_available)

    async def run(self, stop: asyncio.Event) -> None:
        """Observe every tick of every sensor until ``stop`` is set."""
        await self.prepare()
        self.since = utcnow()
        async with self.registration.kept(stop):
            await asyncio.gather(*(sensor.run(stop) for sensor in self.sensors))
