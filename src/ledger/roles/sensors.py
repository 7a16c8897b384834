"""Sensors: scheduled observations of targets (``ledger sensor run``).

The design at length: docs/internals.md (``ledger.roles.sensors``).
"""

from __future__ import annotations

import asyncio
import signal
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

from ledger import tracing
from ledger.config import CampaignClassConfig, LedgerConfig, SensorConfig
from ledger.db.documents import ObservationDetails
from ledger.db.kernel import Kernel
from ledger.db.models import ObservationRecorded
from ledger.errors import ConfigError, LedgerError
from ledger.git.repository import GitError, Repository
from ledger.logs import get_logger
from ledger.runtime.registry import Registration, held, utcnow
from ledger.sandbox import cell as cells
from ledger.sandbox import guise as guises
from ledger.sandbox.processes import CommandResult, cell_environment, child_environment, run_command
from ledger.verifiers.judge import (
    Judge,
    Judged,
    JudgeSettings,
    files_of,
    read_stream,
    remove_bytecode,
)
from ledger.verifiers.pytest_report import PYTEST_EXIT_MEANING, Report, pytest_command, read_report

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


#: The outcomes of an observation: green and red say what the target is;
#: error says the check itself failed, and moves no campaign.
OUTCOMES = ("green", "red", "error")


@dataclass(frozen=True)
class Reading:
    """What a check saw."""

    status: str  # green, red or error (details.error says why)
    started_at: datetime
    finished_at: datetime
    #: what it saw, as the observation stores it (``ObservationDetails.stored``)
    details: dict[str, Any]

    @property
    def error(self) -> str | None:
        """Why the check could not tell (an error reading), else ``None``."""
        said = ObservationDetails.load(self.details).error
        return (said or "the check failed") if self.status == "error" else None


async def check(sensor: SensorConfig, *, repository: str | None = None, ref: str | None = None,
                cache_dir: Path | None = None, judge: JudgeSettings | None = None) -> Reading:
    """Run the sensor's check once: a command or an HTTP probe, and tell its
    outcome (``command_outcome``, ``http_outcome``). A command whose sensor
    observes a repository (``repository`` and ``ref``: its target names its
    class's repository) runs in a fresh export of that ref's tree, fetched
    from the remote for a URL. A pytest command runs by the fixed judge
    (``judge``: its class's ``acceptance.pytest``), as the verifier's do:
    green needs exit 0 *and* a complete, consistent report from the judge,
    and ``details.tests`` is what the judge saw."""
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    if sensor.command is not None:
        details = await _run_command(sensor, repository, ref, cache_dir, judge or JudgeSettings())
        status = command_outcome(sensor, details)
    else:
        details = await _probe(sensor)
        status = http_outcome(sensor, details)
    details.duration_s = round(time.monotonic() - t0, 3)
    return Reading(status, started, datetime.now(timezone.utc), details.stored())


def command_outcome(sensor: SensorConfig, details: ObservationDetails) -> str:
    """green, red or error for a command check's ``details`` (an error's
    reason goes to ``details.error``).

    Exit 0 is green and an exit code of ``red_exit_codes`` red; anything
    else is the check's own failure: another exit code (2 of a check that
    cannot reach its remote, 127 of a program not found), a kill (by a
    signal: the cell's limits, the timeout), a check that could not start or
    be set up (its checkout, its cell). A pytest run by the judge is green
    only when the judge can trust it; red for failed tests and for collection
    errors (pytest's exit 2 naming the modules that failed to import), and
    for a run that exited 0 or red but that the judge cannot trust (code of
    the tree got in its way); an error for pytest's own codes (2 interrupted,
    3 internal error, 4 usage error, 5 no tests collected) and a judge that
    never started."""
    if details.error:
        return "error"
    code = details.exit_code
    tests = details.report()
    if tests is not None and tests.judged is not None:
        if tests.judged is not True:
            if code == 0 or code in sensor.red_exit_codes:
                # pytest ran and reported, but not as the judge saw it: code
                # of the observed tree (a plugin, an exit at import) got in
                # the way -- the target's doing, so red, never green
                return "red"
            problems = "; ".join(str(p) for p in tests.problems[:3])
            details.error = (f"pytest exited {code} and the judge cannot trust the run"
                                + (f": {problems}" if problems else ""))
            return "error"
        if code == 0:
            return "green"
        collection_errors = [t for t in tests.failed if "::" not in t]
        if code in sensor.red_exit_codes or (code == 2 and collection_errors):
            return "red"
        meaning = PYTEST_EXIT_MEANING.get(code) if isinstance(code, int) else None
        details.error = (f"pytest exited {code}" + (f" ({meaning})" if meaning else "")
                            + ": a run that says nothing of the tests' outcome")
        return "error"
    if code == 0:
        return "green"
    if code in sensor.red_exit_codes:
        return "red"
    details.error = describe_exit(code, sensor.red_exit_codes, details.output or "")
    return "error"


def describe_exit(code: int | None, red: Sequence[int], output: str = "") -> str:
    """Why an exit code is the check's own failure, in words, with the last
    line the check wrote (``fatal: unable to connect ...``)."""
    if code is None:
        said = "the check ended without an exit code"
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        said = f"the check was killed by {name}"
        if -code == signal.SIGXFSZ:
            said += " (it wrote past its cell's file_size_mb)"
    elif code == 127:
        said = "the check's program was not found (exit 127)"
    elif code == 126:
        said = "the check's program could not be run (exit 126)"
    elif code > 128 and code - 128 in {s.value for s in signal.Signals}:
        said = f"the check was killed by {signal.Signals(code - 128).name} (exit {code})"
    else:
        said = (f"the check exited {code}, not 0 (green) nor one of its red_exit_codes "
                f"({', '.join(map(str, red))})")
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return said + (f": {lines[-1][:300]}" if lines else "")


def http_outcome(sensor: SensorConfig, details: ObservationDetails) -> str:
    """green, red or error for an HTTP probe's ``details``: ``expect_status``
    is green; a status of ``red_statuses`` red (by default any other status
    below 500); a connection failure, a timeout, a 5xx not declared red and
    any other status an error."""
    if details.error:
        return "error"
    code = details.status_code
    if code == sensor.expect_status:
        return "green"
    red = sensor.red_statuses
    if (code in red) if red is not None else (isinstance(code, int) and code < 500):
        return "red"
    if isinstance(code, int) and code >= 500 and (red is None or code not in red):
        details.error = (f"the server answered {code}: its own failure, not a verdict on the "
                            "target (declare it in red_statuses to count it red)")
    else:
        details.error = (f"HTTP {code} is neither expect_status ({sensor.expect_status}) nor "
                            "one of red_statuses")
    return "error"


async def _run_command(sensor: SensorConfig, repository: str | None, ref: str | None,
                       cache_dir: Path | None, settings: JudgeSettings) -> ObservationDetails:
    """Run a command check: in a fresh export of ``ref`` (when it observes
    a repository), by the judge (a pytest command), in its cell (unless the
    sensor opts out); what it saw."""
    assert sensor.command is not None
    details = ObservationDetails(command=sensor.command)
    # A face of the sensor family's for the cell (none of the verifier's
    # runs looks like it), in a directory whose name says nothing.
    uids, names = cells.taken_accounts()
    guise = guises.draw("sensor", guises.project_name(repository), taken_uids=uids, taken_names=names) \
        if sensor.cell.sandbox else None
    with tempfile.TemporaryDirectory() as scratch:
        work, out = Path(scratch) / "work", Path(scratch) / "out"
        out.mkdir()
        if not await _checked_out(details, repository, ref, cache_dir, work):
            return details
        ran = await _run_check(sensor, settings, details, guise, work, out)
        if ran is None:
            return details
        result, judged = ran
        # Only a wrapper's report is read from the outputs (it can open a
        # campaign, never confirm one: it has no judged passed ids).
        tests = read_report(out / "junit.xml") if pytest_command(sensor.command) is None else None
    _record_run(details, sensor, result, judged, tests)
    return details


async def _checked_out(details: ObservationDetails, repository: str | None, ref: str | None,
                       cache_dir: Path | None, work: Path) -> bool:
    """Export ``ref`` of ``repository`` to ``work`` (an empty ``work`` for a
    check that observes none); ``False`` (the error said) if it cannot be."""
    if repository is None or ref is None:
        work.mkdir()
        return True
    repo = Repository(repository, cache_dir=cache_dir)
    try:
        sha = await asyncio.to_thread(repo.resolve, ref)
        await asyncio.to_thread(repo.export_tree, sha, work)
    except GitError as exc:
        details.error = f"cannot check out {ref} of {repository}: {exc.message}"
        details.system_fault = True
        return False
    details.ref, details.sha = ref, sha
    return True


async def _run_check(sensor: SensorConfig, settings: JudgeSettings, details: ObservationDetails,
                     guise: guises.Guise | None, work: Path, out: Path
                     ) -> tuple[CommandResult, Judged | None] | None:
    """Run the check's command (by the judge, for pytest) in its cell or
    not: its result and what the judge saw; ``None`` (the error said) when
    its cell cannot be had."""
    assert sensor.command is not None
    sandboxed = sensor.cell.sandbox
    seen_work = guise.checkout if guise is not None else str(work)
    seen_out = guise.outputs if guise is not None else str(out)
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
                                 seen_work if sandboxed else str(cwd),
                                 seen_root=guise.scratch if guise is not None else None)
        argv = prepared.argv
        extras = Judge.environment(extras)
    try:
        if sandboxed:
            try:
                await asyncio.to_thread(cells.check_available)
            except cells.SandboxUnavailable as exc:
                details.error = f"{exc.message} ({exc.hint})"
                details.system_fault = True
                return None
            assert guise is not None
            # A judged run is told nothing of Ledger's (no LEDGER_JUNIT_XML:
            # it is for a wrapper's report, and the judge reads none)
            env = cell_environment(extras) if judge is not None else \
                {**cell_environment(extras), JUNIT_VARIABLE: str(report)}
            bindings = [cells.Binding(work, seen_work, writable=True),
                        cells.Binding(out, seen_out, writable=True)]
            policy = sensor.cell
            if judge is not None:
                bindings.append(cells.Binding(judge.root, guise.scratch, writable=False))
                if judge.read_only():
                    policy = policy.model_copy(update={"read_only": [*policy.read_only,
                                                                      *judge.read_only()]})
            spec = cells.CellSpec(policy, tuple(bindings), cwd=seen_work, env=env, guise=guise)
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
    return result, judged


def _record_run(details: ObservationDetails, sensor: SensorConfig, result: CommandResult,
                judged: Judged | None, tests: Report | None) -> None:
    """What the run says, into ``details``."""
    if result.error:
        details.error = f"cannot start: {result.error}"
    elif result.timed_out:
        details.error = f"timed out after {sensor.timeout_s:g}s"
    else:
        details.exit_code, details.output = result.exit_code, result.output
    if result.leftovers:
        details.leftovers = list(result.leftovers)
    details.sandboxed = result.sandboxed
    if result.limits:  # how its cell was limited (cgroup2, cgroup1 or rlimits), what it used
        details.limits = result.limits
    if judged is not None:
        if judged.connected or result.exit_code == 0:
            details.tests = judged.summary()
        if not judged.connected and not result.timed_out and result.exit_code not in (None, 0):
            details.error = "the judge did not start: " + result.output[-300:]
            details.system_fault = True
    elif tests is not None:
        details.tests = tests.summary()


async def _probe(sensor: SensorConfig) -> ObservationDetails:
    try:
        async with httpx.AsyncClient(timeout=sensor.timeout_s) as client:
            response = await client.get(sensor.url)  # type: ignore[arg-type]
        return ObservationDetails(url=sensor.url, status_code=response.status_code,
                                  body=response.text[:_OUTPUT_LIMIT])
    except httpx.TimeoutException as exc:
        return ObservationDetails(url=sensor.url, error=f"no answer within {sensor.timeout_s:g}s "
                                                        f"({str(exc) or type(exc).__name__})")
    except httpx.HTTPError as exc:
        return ObservationDetails(url=sensor.url, error=f"cannot reach {sensor.url}: "
                                                        f"{str(exc) or type(exc).__name__}")


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
        """Claim ``tick`` (if given), check, and record (green, red or
        error); ``None`` if another process owns the tick."""
        if tick is not None and not await self.kernel.claim_sensor_tick(self.config.name, tick, self.identity):
            self.log.info("tick owned by another sensor process", tick=tick.isoformat())
            return None
        repository, ref = self.observes or (None, None)
        reading = await check(self.config, repository=repository, ref=ref, cache_dir=self.cache_dir,
                              judge=self.judge)
        # An error (the check's own failure: its remote out of reach, no
        # sandbox here, an exit code it does not declare red) is recorded with
        # its evidence and moves nothing: no red that would open a campaign or
        # send a promoted one back, no green that would close one.
        c = self.config
        result = await tracing.observation(
            self.kernel.executor, c.objective_key(), reading.status,
            {tracing.CAMPAIGN_CLASS: c.campaign_class, tracing.SENSOR: c.name},
            lambda context: self.kernel.record_observation(
                c.name, c.objective_key(), c.target, reading.status,
                reading.started_at, finished_at=reading.finished_at, details=reading.details,
                class_=c.campaign_class, tick=tick, trace_context=context,
                open_after=c.open_after, confirm_after=c.confirm_after),
            start_ns=int(reading.started_at.timestamp() * 1e9))
        self.observed += 1
        when = tick.isoformat() if tick else None
        if reading.status == "error":
            self.log.warning("observed an error: the check itself failed; nothing opened or closed",
                             error=reading.error, tick=when)
        else:
            self.log.info("observed", status=reading.status, effect=result.effect,
                          campaign=result.campaign_id, reason=result.reason, tick=when)
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


# --- the worker's second look ------------------------------------------------------


def sensor_of(config: LedgerConfig, class_: str, objective_key: str, target: str) -> SensorConfig | None:
    """The sensor a campaign of ``class_`` came from: the one of that class
    whose objective key is the campaign's (else the only one of that class on
    its target); ``None`` when no sensor of the config watches it."""
    of_class = [s for s in config.sensors.values() if s.campaign_class == class_]
    by_key = [s for s in of_class if s.objective_key() == objective_key]
    if by_key:
        return by_key[0]
    on_target = [s for s in of_class if s.target == target]
    return on_target[0] if len(on_target) == 1 else None


@dataclass(frozen=True)
class Reobservation:
    """How a worker looks at its campaign's target once more (the class's
    sensor, run once, in its cell, on this machine): before it starts an
    agent on a campaign opened a while ago, and before it charges an attempt
    that changed nothing (``ledger.roles.attempt``)."""

    sensor: SensorConfig
    observes: tuple[str, str] | None = None
    cache_dir: Path | None = None
    judge: JudgeSettings | None = None

    @classmethod
    def of(cls, config: LedgerConfig, class_: str, objective_key: str, target: str,
           cache_dir: Path | None) -> Reobservation | None:
        """The re-observation of a campaign (``None``: no sensor watches it)."""
        sensor = sensor_of(config, class_, objective_key, target)
        if sensor is None:
            return None
        campaign_class = config.classes.get(class_)
        judge = (JudgeSettings.from_spec(campaign_class.acceptance.pytest.model_dump())
                 if campaign_class else None)
        return cls(sensor, observed_ref(sensor, campaign_class), cache_dir, judge)

    async def read(self) -> Reading:
        """Run the sensor's check once, as its own process would."""
        repository, ref = self.observes or (None, None)
        return await check(self.sensor, repository=repository, ref=ref, cache_dir=self.cache_dir,
                           judge=self.judge)
