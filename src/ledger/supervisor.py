"""``ledger run``: sensors, a worker, a verifier and a dispatcher as one
supervised process for a single machine.

Each component runs as a named task with its own database role; one that
crashes is logged and restarted with backoff, so a bug in one does not stop the
others. SIGTERM stops them all gracefully: the worker drains, the others
finish their current step. On separate machines run each piece alone
(``ledger worker``, ``ledger verifier``, ``ledger dispatcher``, ``ledger sensor
run``), each with its own login.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

from .config import LedgerConfig
from .database import Database
from .dispatcher import Dispatcher
from .hub import WakeSource
from .identity import process_identity
from .kernel import Kernel
from .logs import get_logger
from .sensors import run_sensors
from .verifier import Verifier
from .worker import Worker, WorkerOptions

Component = Callable[[asyncio.Event], Awaitable[object]]


class Supervisor:
    """Runs components until stopped, restarting any that crash."""

    def __init__(self, *, restart_base_s: float = 0.5, restart_cap_s: float = 30.0):
        self.components: dict[str, Component] = {}
        self.stopping = asyncio.Event()
        self.restarts: dict[str, int] = {}
        self.restart_base_s = restart_base_s
        self.restart_cap_s = restart_cap_s
        self.log = get_logger("supervisor")

    def add(self, name: str, component: Component) -> None:
        """Run ``component(stop)`` under supervision; it should return once
        ``stop`` is set."""
        self.components[name] = component

    def stop(self) -> None:
        """Ask every component to stop (signal handlers call this)."""
        self.stopping.set()

    async def _keep(self, name: str, component: Component) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                await component(self.stopping)
                if self.stopping.is_set():
                    return
                self.log.warning("component returned before stop; restarting", component=name)
            except Exception as exc:  # a crash of one component must not stop the rest
                self.log.error("component crashed; restarting", component=name, error=repr(exc))
            failures += 1
            self.restarts[name] = failures
            delay = min(self.restart_base_s * 2 ** (failures - 1), self.restart_cap_s)
            try:
                await asyncio.wait_for(self.stopping.wait(), delay)
            except TimeoutError:
                pass

    async def run(self) -> int:
        """Run until ``stop()``; returns 0."""
        self.log.info("starting", components=sorted(self.components))
        await asyncio.gather(*(self._keep(name, c) for name, c in self.components.items()))
        self.log.info("stopped")
        return 0


@dataclass
class RunOptions:
    """What ``ledger run`` starts."""

    options: WorkerOptions
    model_family: str = "none"
    sensors: bool = True
    verifier: bool = True
    dispatcher: bool = True
    verification_lease_s: float = 30.0


async def run_everything(db: Database, config: LedgerConfig, run: RunOptions, hub: WakeSource,
                         supervisor: Supervisor) -> int:
    """Wire every component of one machine into ``supervisor`` and run it."""
    async with AsyncExitStack() as stack:
        def worker(stop: asyncio.Event) -> Awaitable[object]:
            w = Worker(db, config, run.options, hub=hub)

            async def go() -> object:
                task = asyncio.create_task(w.run())
                await asyncio.wait({task, asyncio.create_task(stop.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)
                w.stop()  # two-phase drain
                return await task
            return go()
        supervisor.add("worker", worker)

        if run.verifier:
            session = await stack.enter_async_context(db.session("verifier", max_size=2))
            verifier = Verifier(Kernel(session), model_family=run.model_family, hub=hub,
                                lease_s=run.verification_lease_s, poll_s=run.options.poll_s,
                                data_dir=run.options.data_dir)
            supervisor.add("verifier", verifier.run)
        if run.dispatcher:
            session = await stack.enter_async_context(db.session("dispatcher", max_size=2))
            dispatcher = Dispatcher(Kernel(session), hub=hub, poll_s=run.options.poll_s,
                                    data_dir=run.options.data_dir)
            supervisor.add("dispatcher", dispatcher.run)
        if run.sensors and config.sensors:
            session = await stack.enter_async_context(db.session("sensor", max_size=2))
            identity = process_identity("sensor")

            def sensors(stop: asyncio.Event) -> Awaitable[object]:
                return run_sensors(Kernel(session), config, [], identity, stop)
            supervisor.add("sensors", sensors)
        return await supervisor.run()
