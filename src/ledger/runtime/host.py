"""The host: runs a set of services in one process until it is told to stop.

The design at length: docs/internals.md (``ledger.runtime.host``).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import signal
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ledger import tracing
from ledger.backoff import backoff
from ledger.errors import LedgerError
from ledger.logs import get_logger
from ledger.runtime import startup
from ledger.runtime.health import serving_health
from ledger.runtime.service import Service
from ledger.settings import environment

Policy = Literal["fail", "restart"]
POLICIES: tuple[Policy, ...] = ("fail", "restart")
#: The exit code when the host had to clean up after its services.
EX_SOFTWARE = 70
SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The host whose service runs in this context (tasks inherit it).
_HOST: contextvars.ContextVar[Host | None] = contextvars.ContextVar("ledger_host", default=None)

@dataclass
class Hosted:
    """One service under the host, and what became of it."""

    name: str
    service: Service
    policy: Policy
    restarts: int = 0
    error: BaseException | None = None
    #: its error ends the host whatever the policy (a wait to start that ran out)
    fatal: bool = False

@dataclass(frozen=True)
class Leftovers:
    """What outlived the services (empty: nothing)."""

    tasks: list[str] = field(default_factory=list)
    children: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tasks or self.children)

class Host:
    """Runs services as named tasks until ``stop()`` or a signal (see the module)."""

    def __init__(self, *, name: str = "ledger", policy: Policy = "fail",
                 restart_base_s: float = 0.5, restart_cap_s: float = 30.0,
                 handle_signals: bool = True, settle_s: float = 5.0,
                 wait_for_start_s: float | None = None):
        if policy not in POLICIES:
            raise ValueError(f"host policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if not 0 < restart_base_s <= restart_cap_s or settle_s < 0 or (wait_for_start_s or 0) < 0:
            raise ValueError("host: restart_base_s must be positive and at most restart_cap_s, "
                             "settle_s and wait_for_start_s not negative")
        self.name = name
        self.policy: Policy = policy
        self.restart_base_s = restart_base_s
        self.restart_cap_s = restart_cap_s
        self.handle_signals = handle_signals
        self.settle_s = settle_s
        self.wait_for_start_s = wait_for_start_s
        self.services: dict[str, Hosted] = {}
        self.stopping = asyncio.Event()
        self.leftovers = Leftovers()
        self.signals = 0
        self.log = get_logger("host", host=name)

    def add(self, service: Service, *, name: str | None = None, policy: Policy | None = None) -> Host:
        """Run ``service`` (under ``name``, default its own) with ``policy``
        (default the host's). Names are unique: they name the tasks and the logs."""
        if not isinstance(service, Service):
            raise TypeError(f"{service!r} is not a service (name, run_once, run(stop))")
        name = name or service.name
        if name in self.services:
            raise ValueError(f"host: a service named {name!r} is already added")
        chosen = policy or self.policy
        if chosen not in POLICIES:
            raise ValueError(f"host policy must be one of {', '.join(POLICIES)}, not {chosen!r}")
        self.services[name] = Hosted(name, service, chosen)
        return self

    def stop(self) -> None:
        """Ask every service to stop (idempotent)."""
        if not self.stopping.is_set():
            self.log.info("stopping", services=sorted(self.services))
            self.stopping.set()

    def _signalled(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.stopping.is_set():
            self.log.info("already stopping", signal=sig.name)
        else:
            self.log.info("signal received", signal=sig.name)
            self.stop()

    async def run(self) -> int:
        """Run every service until each has returned; returns the exit code
        (0, or ``EX_SOFTWARE`` when something outlived them). Raises the
        exception of a ``fail`` service that died, once the rest stopped."""
        if not self.services:
            raise ValueError("host: no services to run")
        loop = asyncio.get_running_loop()
        before_children = set(child_processes())
        previous_factory = loop.get_task_factory()
        spawned = self._track_tasks(loop)
        previous_handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
        if self.handle_signals:
            for sig in SIGNALS:
                loop.add_signal_handler(sig, self._signalled, sig)
        self.log.info("starting", services=sorted(self.services))
        startup.READINESS.serving = True
        try:
            tasks = [asyncio.create_task(self._keep(hosted), name=f"{self.name}:{hosted.name}")
                     for hosted in self.services.values()]
            await asyncio.gather(*tasks)
        finally:
            startup.READINESS.serving = False
            if self.handle_signals:
                for sig in SIGNALS:
                    loop.remove_signal_handler(sig)
                    # Back to what was there before (the clean stop while
                    # starting, ``stop_cleanly_while_starting``), not
                    # to the default: a SIGTERM while the process exits (its
                    # cells still being torn down) is a clean stop, not death
                    # by the signal.
                    previous = previous_handlers[sig]
                    if previous is not None:
                        signal.signal(sig, previous)
            try:
                self.leftovers = await self._sweep(spawned, before_children)
            finally:
                loop.set_task_factory(previous_factory)
        failed = [h for h in self.services.values()
                  if h.error is not None and (h.policy == "fail" or h.fatal)]
        restarts = {h.name: h.restarts for h in self.services.values() if h.restarts}
        # Each service logs its own last line; the host adds one only for news.
        if failed or restarts or self.leftovers:
            self.log.warning("stopped", failed=[h.name for h in failed], restarts=restarts)
        if failed:
            raise failed[0].error  # type: ignore[misc]
        return EX_SOFTWARE if self.leftovers else 0

    def _track_tasks(self, loop: asyncio.AbstractEventLoop) -> weakref.WeakSet[asyncio.Task[object]]:
        """Record every task created in a context that one of our services runs in."""
        spawned: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()
        previous: Any = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                    **kwargs: Any) -> Any:
            task = (previous(loop, coro, **kwargs) if previous is not None
                    else asyncio.Task(coro, loop=loop, **kwargs))
            context = kwargs.get("context")
            owner = (context if isinstance(context, contextvars.Context)
                     else contextvars.copy_context()).get(_HOST)
            if owner is self:
                spawned.add(task)
            return task

        loop.set_task_factory(factory)  # type: ignore[arg-type]  # typeshed lacks context=
        return spawned

    async def _keep(self, hosted: Hosted) -> None:
        """Run one service by its policy; never raises (the host reads ``error``)."""
        _HOST.set(self)  # this task's context: the service's tasks inherit it
        waiter = startup.Waiter(hosted.name, log=self.log, wait_s=self.wait_for_start_s,
                                report=lambda line: startup.say_not_ready(
                                    getattr(hosted.service, "registration", None), line))
        failures = 0
        try:
            while True:
                try:
                    if not await self._prepared(hosted, waiter):
                        return
                    await hosted.service.run(self.stopping)
                    if self.stopping.is_set():
                        return
                    raise RuntimeError(f"service {hosted.name} returned before it was asked to stop")
                except Exception as exc:
                    if startup.fault_of(exc) is not None and not self.stopping.is_set():
                        # not a death: back to waiting for what it needs
                        try:
                            if await waiter.failed(exc, self.stopping):
                                continue
                            return
                        except Exception as gave_up:
                            exc = gave_up  # waited as long as it may: as ``fail``
                            hosted.error, hosted.fatal = exc, True
                            self.log.error("service cannot start; stopping the others",
                                           service=hosted.name, error=_said(exc),
                                           exc_info=_traceback(exc))
                            self.stop()
                            return
                    hosted.error = exc
                    if hosted.policy == "fail" or self.stopping.is_set():
                        self.log.error("service died; stopping the others", service=hosted.name,
                                       error=_said(exc), exc_info=_traceback(exc))
                        self.stop()
                        return
                    failures += 1
                    hosted.restarts += 1
                    delay = backoff(failures, base_s=self.restart_base_s, cap_s=self.restart_cap_s)
                    self.log.error("service died; restarting it", service=hosted.name,
                                   error=_said(exc), restart_in_s=round(delay, 2),
                                   exc_info=_traceback(exc))
                try:
                    await asyncio.wait_for(self.stopping.wait(), delay)
                    return
                except TimeoutError:
                    pass
        finally:
            startup.READINESS.waiting.pop(hosted.name, None)

    async def _prepared(self, hosted: Hosted, waiter: startup.Waiter) -> bool:
        """Wait until the service's start-up checks (its ``prepare``) pass;
        ``False`` if the host was stopped first."""
        prepare = getattr(hosted.service, "prepare", None)
        if prepare is None:
            waiter.succeeded()
            return True
        ready = await waiter.until_ready(lambda: _ready(prepare), self.stopping)
        registration = getattr(hosted.service, "registration", None)
        if registration is not None:
            registration.not_ready = None
        return ready is not None  # (stopped meanwhile: it never started)

    async def _sweep(self, spawned: weakref.WeakSet[asyncio.Task[object]], before_children: set[int]
                     ) -> Leftovers:
        """Find, log and end what the services left behind."""
        def new_tasks() -> list[asyncio.Task[object]]:
            return [t for t in list(spawned) if not t.done()]

        # Tasks that are ending (a cancelled waiter's cleanup) get a moment.
        deadline = asyncio.get_running_loop().time() + self.settle_s
        while new_tasks() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        tasks = new_tasks()
        children = [pid for pid in child_processes() if pid not in before_children]
        if not tasks and not children:
            return Leftovers()
        self.log.error("services left work running; ending it", tasks=[t.get_name() for t in tasks],
                       children=children)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pid in children:
            kill_process(pid)
        return Leftovers([t.get_name() for t in tasks], children)

async def _ready(prepare: Any) -> bool:
    await prepare()
    return True


def _said(exc: BaseException) -> str:
    """An error as a log line says it: a Ledger error by its message (and hint)."""
    if isinstance(exc, LedgerError):
        return startup.cause(exc)
    return repr(exc)


def _traceback(exc: BaseException) -> BaseException | bool:
    """What ``exc_info`` a log line of ``exc`` gets: a defect's traceback; a
    Ledger error's only with ``LEDGER_DEBUG``."""
    return exc if environment("debug") or not isinstance(exc, (LedgerError, OSError)) else False


def child_processes(parent: int | None = None) -> Iterable[int]:
    """Live (not zombie) child processes of ``parent`` (default this process),
    from ``/proc``; none where there is no ``/proc``."""
    parent = os.getpid() if parent is None else parent
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[0] != "Z" and int(fields[1]) == parent:
            found.append(int(entry.name))
    return found

def kill_process(pid: int) -> None:
    """SIGKILL ``pid`` -- and its process group when it leads one (every
    command Ledger runs does) -- unless it is already gone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass

async def serve(services: Iterable[Service], *, name: str = "ledger", policy: Policy = "fail",
                wait_for_start_s: float | None = None) -> int:
    """Run ``services`` on a new host until a signal; returns its exit code."""
    host = Host(name=name, policy=policy, wait_for_start_s=wait_for_start_s)
    for service in services:
        host.add(service)
    # Spans, if the OTEL_* variables ask for them (ledger.tracing); flushed
    # at the end, so what the process did is exported before it exits.
    traced = tracing.configure(name)
    try:
        return await host.run()
    finally:
        if traced:
            await asyncio.to_thread(tracing.shutdown)


def _stop_before_start(signum: int, frame: object) -> None:
    raise SystemExit(0)


def stop_cleanly_while_starting() -> None:
    """Make a SIGTERM before the host runs a clean stop (exit 0): see the module."""
    signal.signal(signal.SIGTERM, _stop_before_start)


async def serve_when_ready(build: Callable[[AsyncExitStack, startup.Standby], Awaitable[list[Service]]], *,
                           name: str, role: str, policy: Any = "fail",
                           wait_s: float | None = None, health: str | None = None) -> int:
    """Build the services of a long-running command -- waiting out the start-up
    faults the build meets (``Waiter``), each try's resources released -- and
    run them on a host until a signal; returns its exit code. ``health``:
    where ``/livez`` and ``/readyz`` answer meanwhile."""
    standby = startup.Standby(role, name)
    waiter = startup.Waiter(name, log=get_logger(name), wait_s=wait_s, report=standby.report)
    stop = asyncio.Event()
    async with serving_health(health), AsyncExitStack() as kept:
        kept.push_async_callback(standby.close)
        while True:
            stack = AsyncExitStack()
            try:
                services = await build(stack, standby)
            except Exception as exc:
                await stack.aclose()
                if startup.fault_of(exc) is None:
                    raise
                if not await waiter.failed(exc, stop):
                    return 0
                continue
            break
        waiter.succeeded()
        standby.hand_over(services)
        await standby.close()  # its row goes on in the service's own session
        async with stack:
            return await serve(services, name=name, policy=policy, wait_for_start_s=wait_s)
