"""Long-running processes: ``ledger worker``, ``ledger run``, ``ledger sensor
run``. Each builds its services and hands them to the host
(``ledger.runtime.host``), which owns signals, watching and shutdown. What
the build needs of the host and the configuration -- the database and its
schema, ledger.toml, the repositories -- it waits for, not ready, when it is
not there yet (``ledger.runtime.startup``); ``--wait-for-start 0`` makes a
missing one the command's exit code at once."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ledger.cli.context import run, state
from ledger.cli.knobs import option
from ledger.runtime.commands import service_command

if TYPE_CHECKING:
    from ledger.config import LedgerConfig
    from ledger.runtime.service import Service
    from ledger.runtime.startup import Standby

CONFIG_OPTION = option("config")
LISTEN_OPTION = option("listen")
WAIT_OPTION = option("wait_for_database_s")
START_OPTION = option("wait_for_start_s")
HEALTH_OPTION = option("health")
LOG_OPTION = option("log_level")
#: The roles ``ledger run`` acts as (each login is checked before anything opens).
RUN_ACTORS = ("worker", "reaper", "verifier", "dispatcher", "sensor", "reader", "operator")


sensor_app = typer.Typer(help="Scheduled observations of targets.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the runtime commands to ``app``."""
    app.command("worker")(worker)
    app.command("run")(run_all)
    app.add_typer(sensor_app, name="sensor")


async def to_thread(function: Callable[..., object], /, *args: Any, **kwargs: Any) -> None:
    """Run a blocking check (git asks repositories) off the event loop, so a
    health probe is still answered meanwhile."""
    import asyncio  # not at the top: ``ledger --help`` needs no event loop

    await asyncio.to_thread(function, *args, **kwargs)


def config_path(ctx: typer.Context, option: Path | None) -> Path:
    """The config file: the option, else LEDGER_CONFIG, else ./ledger.toml."""
    return option or state(ctx).settings.config


def preflight(cfg: LedgerConfig, source: Path, *, classes: list[str] | None = None,
              sensors: list[str] | None = None, refused: str = "nothing was done",
              said: set[str] | None = None) -> None:
    """Check the repositories of ``cfg`` up front (``ledger.roles.preflight``):
    refuse a misconfiguration (exit 78, one line naming the key), warn on
    stderr about a remote out of reach now and go on (each warning once, for
    a command that checks again while it waits: ``said``)."""
    from ledger.cli.context import console_err
    from ledger.roles import preflight as checks

    said = set() if said is None else said

    def warn(line: str) -> None:
        if line not in said:
            said.add(line)
            console_err.print(f"ledger: {line}", highlight=False, markup=False, soft_wrap=True)

    checks.enforce(checks.check(cfg, classes=classes, sensors=sensors), str(source), warn,
                   refused=refused)


@service_command()
def worker(
    ctx: typer.Context,
    config: Path = CONFIG_OPTION,
    concurrency: int = option("concurrency"),
    class_: list[str] = typer.Option([], "--class", help="Serve only these classes (repeatable)."),
    poll: float = option("poll_s"),
    drain_timeout: float = option("drain_timeout_s"),
    grace: float = option("reaper_grace_s"),
    listen: bool = LISTEN_OPTION,
    wait_for_database: float = WAIT_OPTION,
    wait_for_start: float | None = START_OPTION,
    health: str | None = HEALTH_OPTION,
    log_level: str = LOG_OPTION,
) -> None:
    """Claim campaigns and make one isolated attempt each, until SIGTERM (then drain)."""
    from ledger import logs
    from ledger.config import load_config
    from ledger.db.hub import listening
    from ledger.roles.services import ReaperOptions, worker_services
    from ledger.roles.worker import WorkerOptions
    from ledger.runtime.host import serve_when_ready

    logs.configure(log_level)
    st = state(ctx)
    path = config_path(ctx, config)
    options = WorkerOptions(data_dir=st.settings.data_dir, concurrency=concurrency,
                            classes=class_, poll_s=poll, drain_timeout_s=drain_timeout,
                            config_file=path)
    reaper = ReaperOptions(grace_s=grace, interval_s=max(min(grace, 5.0), 0.2))
    said: set[str] = set()

    async def build(stack: AsyncExitStack, standby: Standby) -> list[Service]:
        db = st.database(wait_s=wait_for_database)
        standby.through(db)
        await db.check_logins(("worker", "reaper", "reader") if listen else ("worker", "reaper"))
        cfg = load_config(path)
        for name in class_:
            cfg.campaign_class(name)  # an unknown class is named before any repository is asked
        await to_thread(preflight, cfg, path, classes=class_ or None, sensors=[],
                                refused="the worker did not start: nothing was claimed", said=said)
        hub = await stack.enter_async_context(listening(db, listen))
        return await worker_services(stack, db, cfg, options, reaper, hub)

    raise typer.Exit(run(serve_when_ready(build, name="worker", role="worker",
                                          wait_s=wait_for_start, health=health)))


@sensor_app.command("run")
@service_command(unless="once")
def sensor_run(
    ctx: typer.Context,
    names: list[str] = typer.Argument(None, help="Sensors to run (default: all in the config)."),
    config: Path = CONFIG_OPTION,
    once: bool = typer.Option(False, "--once", help="Observe each sensor once now and exit."),
    wait_for_database: float = WAIT_OPTION,
    wait_for_start: float | None = START_OPTION,
    health: str | None = HEALTH_OPTION,
    log_level: str = LOG_OPTION,
) -> None:
    """Run sensors on their schedules until SIGTERM; each observation may open,
    regress, confirm or dismiss a campaign."""
    from ledger import logs
    from ledger.config import load_config
    from ledger.db.kernel import Kernel
    from ledger.identity import process_identity
    from ledger.roles.sensors import Sensors
    from ledger.runtime.host import serve_when_ready

    logs.configure(log_level)
    st = state(ctx)
    path = config_path(ctx, config)
    said: set[str] = set()

    async def build(stack: AsyncExitStack, standby: Standby) -> list[Service]:
        db = st.database(wait_s=wait_for_database)
        standby.through(db)
        await db.check_logins(("sensor",))
        cfg = load_config(path)
        unknown = [n for n in names or [] if n not in cfg.sensors]
        if not unknown:  # (unknown names are refused by Sensors, before it connects)
            await to_thread(
                preflight, cfg, path, classes=[], sensors=names or None,
                refused="the sensors did not start: nothing was observed or opened", said=said)
        session = await stack.enter_async_context(db.session("sensor"))
        return [Sensors(Kernel(session), cfg, names or [], process_identity("sensor"),
                        data_dir=st.settings.data_dir)]

    async def once_now() -> int:
        from ledger.runtime.startup import Standby

        async with AsyncExitStack() as stack:
            [sensors] = await build(stack, Standby("sensor", "sensors"))
            await sensors.run_once()
            return 0

    if once:
        raise typer.Exit(run(once_now()))
    raise typer.Exit(run(serve_when_ready(build, name="sensor", role="sensor",
                                          wait_s=wait_for_start, health=health)))


@service_command()
def run_all(
    ctx: typer.Context,
    config: Path = CONFIG_OPTION,
    workers: int = option("workers"),
    model_family: str = option("model_family"),
    no_sensors: bool = typer.Option(False, "--no-sensors", help="Do not run the sensors."),
    poll: float = option("poll_s"),
    drain_timeout: float = option("drain_timeout_s"),
    trim_after: str = option("trim_after"),
    listen: bool = LISTEN_OPTION,
    wait_for_database: float = WAIT_OPTION,
    wait_for_start: float | None = START_OPTION,
    health: str | None = HEALTH_OPTION,
    log_level: str = LOG_OPTION,
) -> None:
    """Run sensors, a worker and its reaper, a verifier and a dispatcher (and with
    --trim-after the journal trimmer) in one process on one machine; a part that
    dies is restarted; SIGTERM stops them all, draining the worker."""
    from ledger import logs
    from ledger.cli.journal import parse_duration
    from ledger.config import load_config
    from ledger.db.hub import listening
    from ledger.roles.services import ReaperOptions, RunOptions, one_machine
    from ledger.roles.worker import WorkerOptions
    from ledger.runtime.host import serve_when_ready

    logs.configure(log_level)
    st = state(ctx)
    path = config_path(ctx, config)
    options = RunOptions(WorkerOptions(data_dir=st.settings.data_dir, concurrency=workers, poll_s=poll,
                                       drain_timeout_s=drain_timeout, config_file=path),
                         ReaperOptions(), model_family=model_family, sensors=not no_sensors,
                         trim_after_s=parse_duration(trim_after) if trim_after else None)
    said: set[str] = set()

    async def build(stack: AsyncExitStack, standby: Standby) -> list[Service]:
        db = st.database(wait_s=wait_for_database)
        standby.through(db)
        await db.check_logins(RUN_ACTORS)
        cfg = load_config(path)
        await to_thread(
            preflight, cfg, path, sensors=None if not no_sensors else [],
            refused="nothing was started: nothing was claimed, observed or opened", said=said)
        hub = await stack.enter_async_context(listening(db, listen))
        return await one_machine(stack, db, cfg, options, hub)

    raise typer.Exit(run(serve_when_ready(build, name="run", role="worker", policy="restart",
                                          wait_s=wait_for_start, health=health)))
