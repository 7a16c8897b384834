"""Long-running processes: ``ledger worker``, ``ledger run``, ``ledger sensor
run``. Each builds its services and hands them to the host
(``ledger.runtime.host``), which owns signals, watching and shutdown."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ledger.runtime.commands import service_command
from ledger.cli.context import run, state
from ledger.cli.knobs import option

if TYPE_CHECKING:
    from ledger.config import LedgerConfig

CONFIG_OPTION = option("config")
LISTEN_OPTION = option("listen")
WAIT_OPTION = option("wait_for_database_s")
LOG_OPTION = option("log_level")


sensor_app = typer.Typer(help="Scheduled observations of targets.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the runtime commands to ``app``."""
    app.command("worker")(worker)
    app.command("run")(run_all)
    app.add_typer(sensor_app, name="sensor")


def config_path(ctx: typer.Context, option: Path | None) -> Path:
    """The config file: the option, else LEDGER_CONFIG, else ./ledger.toml."""
    return option or state(ctx).settings.config


def preflight(cfg: LedgerConfig, source: Path, *, classes: list[str] | None = None,
              sensors: list[str] | None = None, refused: str = "nothing was done") -> None:
    """Check the repositories of ``cfg`` up front (``ledger.roles.preflight``):
    refuse a misconfiguration (exit 78, one line naming the key), warn on
    stderr about a remote out of reach now and go on."""
    from ledger.roles import preflight as checks
    from ledger.cli.context import console_err

    checks.enforce(checks.check(cfg, classes=classes, sensors=sensors), str(source),
                   lambda line: console_err.print(f"ledger: {line}", highlight=False, markup=False,
                                                  soft_wrap=True),
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
    log_level: str = LOG_OPTION,
) -> None:
    """Claim campaigns and make one isolated attempt each, until SIGTERM (then drain)."""
    from ledger import logs
    from ledger.config import load_config
    from ledger.db.hub import listening
    from ledger.runtime.host import serve
    from ledger.roles.services import ReaperOptions, worker_services
    from ledger.roles.worker import WorkerOptions

    logs.configure(log_level)
    st = state(ctx)
    cfg = load_config(config_path(ctx, config))
    options = WorkerOptions(data_dir=st.settings.data_dir, concurrency=concurrency,
                            classes=class_, poll_s=poll, drain_timeout_s=drain_timeout,
                            config_file=config_path(ctx, config))
    reaper = ReaperOptions(grace_s=grace, interval_s=max(min(grace, 5.0), 0.2))
    for name in class_:
        cfg.campaign_class(name)  # an unknown class is named before any repository is asked
    preflight(cfg, config_path(ctx, config), classes=class_ or None, sensors=[],
              refused="the worker did not start: nothing was claimed")

    async def go() -> int:
        db = st.database(wait_s=wait_for_database)
        async with listening(db, listen) as hub, AsyncExitStack() as stack:
            return await serve(await worker_services(stack, db, cfg, options, reaper, hub),
                               name="worker")

    raise typer.Exit(run(go()))


@sensor_app.command("run")
@service_command(unless="once")
def sensor_run(
    ctx: typer.Context,
    names: list[str] = typer.Argument(None, help="Sensors to run (default: all in the config)."),
    config: Path = CONFIG_OPTION,
    once: bool = typer.Option(False, "--once", help="Observe each sensor once now and exit."),
    wait_for_database: float = WAIT_OPTION,
    log_level: str = LOG_OPTION,
) -> None:
    """Run sensors on their schedules until SIGTERM; each observation may open,
    regress, confirm or dismiss a campaign."""
    from ledger import logs
    from ledger.config import load_config
    from ledger.identity import process_identity
    from ledger.runtime.host import serve

    logs.configure(log_level)
    st = state(ctx)
    cfg = load_config(config_path(ctx, config))
    unknown = [n for n in names or [] if n not in cfg.sensors]
    if not unknown:  # (unknown names are refused by Sensors, before it connects)
        preflight(cfg, config_path(ctx, config), classes=[], sensors=names or None,
                  refused="the sensors did not start: nothing was observed or opened")

    async def go() -> int:
        from ledger.db.kernel import Kernel
        from ledger.roles.sensors import Sensors

        async with st.database(wait_s=wait_for_database).session("sensor") as session:
            sensors = Sensors(Kernel(session), cfg, names or [], process_identity("sensor"),
                              data_dir=st.settings.data_dir)
            if once:
                await sensors.run_once()
                return 0
            return await serve([sensors], name="sensor")

    raise typer.Exit(run(go()))


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
    log_level: str = LOG_OPTION,
) -> None:
    """Run sensors, a worker and its reaper, a verifier and a dispatcher (and with
    --trim-after the journal trimmer) in one process on one machine; a part that
    dies is restarted; SIGTERM stops them all, draining the worker."""
    from ledger import logs
    from ledger.config import load_config
    from ledger.db.hub import listening
    from ledger.runtime.host import serve
    from ledger.roles.services import ReaperOptions, RunOptions, one_machine
    from ledger.roles.worker import WorkerOptions
    from ledger.cli.journal import parse_duration

    logs.configure(log_level)
    st = state(ctx)
    cfg = load_config(config_path(ctx, config))
    options = RunOptions(WorkerOptions(data_dir=st.settings.data_dir, concurrency=workers, poll_s=poll,
                                       drain_timeout_s=drain_timeout,
                                       config_file=config_path(ctx, config)), ReaperOptions(),
                         model_family=model_family, sensors=not no_sensors,
                         trim_after_s=parse_duration(trim_after) if trim_after else None)
    preflight(cfg, config_path(ctx, config), sensors=None if not no_sensors else [],
              refused="nothing was started: nothing was claimed, observed or opened")

    async def go() -> int:
        db = st.database(wait_s=wait_for_database)
        async with listening(db, listen) as hub, AsyncExitStack() as stack:
            return await serve(await one_machine(stack, db, cfg, options, hub), name="run",
                               policy="restart")

    raise typer.Exit(run(go()))
