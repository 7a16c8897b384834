"""The runtime host and the one backoff (``ledger.runtime``): a service that
dies is noticed at once (fail fast, or restarted by policy), SIGTERM/SIGINT is
handled once, nothing a service started outlives the host, and every retry
pauses by the same function."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from conftest import TEST_PREFIX
from drive import Driver, eventually
from ledger import Database
from ledger.backoff import backoff
from ledger.errors import ConfigError
from ledger.ops.drill import process_gone
from ledger.roles.dispatcher import Dispatcher
from ledger.roles.reaper import Reaper
from ledger.roles.services import ReaperOptions
from ledger.roles.trimmer import Trimmer
from ledger.runtime.host import EX_SOFTWARE, Host
from ledger.runtime.service import Service

pytestmark = pytest.mark.anyio


class DyingReaper(Reaper):
    """A real reaper whose second pass meets a defect (an exception that is not
    one of the transient failures a loop survives)."""

    async def run_once(self) -> int:
        if self.runs >= 1:
            raise RuntimeError("a defect in the reaper")
        return await super().run_once()


class Waiter:
    """A service that works until stopped, then takes ``release`` to finish."""

    name = "waiter"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def run_once(self) -> int:
        return 0

    async def run(self, stop: asyncio.Event) -> None:
        self.started.set()
        await stop.wait()
        self.stopped.set()
        await self.release.wait()


def test_backoff_doubles_is_capped_and_keeps_its_fixed_part() -> None:
    assert [backoff(n, base_s=2, cap_s=600, jitter=0) for n in (1, 2, 3, 10, 500)] == [2, 4, 8, 600, 600]
    samples = [backoff(3, base_s=2, cap_s=600, jitter=0.2) for _ in range(200)]
    assert all(6.4 <= s <= 8 for s in samples) and len(set(samples)) > 1
    equal = [backoff(4, base_s=0.25, cap_s=1.0) for _ in range(200)]  # equal jitter by default
    assert all(0.5 <= s <= 1.0 for s in equal) and len(set(equal)) > 1
    with pytest.raises(ValueError):
        backoff(1, base_s=1, cap_s=1, jitter=1.5)


async def test_a_reaper_that_dies_stops_the_host_at_once(actors) -> None:
    """Before the host, a worker's reaper task that died went unnoticed until
    shutdown; now its defect stops every service and is raised."""
    reaper = DyingReaper(await actors("reaper"), interval_s=0.05)
    dispatcher = Dispatcher(await actors("dispatcher"), poll_s=0.05)
    host = Host(handle_signals=False).add(reaper).add(dispatcher)
    with pytest.raises(RuntimeError, match="a defect in the reaper"):
        async with asyncio.timeout(30):  # nobody calls stop(): only the failure ends it
            await host.run()
    assert host.stopping.is_set() and reaper.runs == 1
    assert isinstance(host.services["reaper"].error, RuntimeError)
    assert host.services["dispatcher"].error is None and dispatcher.runs >= 1
    assert not host.leftovers


async def test_the_restart_policy_runs_a_dead_service_again(actors) -> None:
    reaper = DyingReaper(await actors("reaper"), interval_s=0.05)
    waiter = Waiter()
    host = Host(handle_signals=False, policy="restart", restart_base_s=0.01, restart_cap_s=0.05)
    host.add(reaper).add(waiter)
    running = asyncio.create_task(host.run())
    await eventually(lambda: host.services["reaper"].restarts >= 3, what="three restarts")
    assert not waiter.stopped.is_set()  # the others kept working
    host.stop()
    assert await running == 0
    assert waiter.stopped.is_set()


async def test_a_service_that_returns_before_stop_is_a_failure() -> None:
    class Quitter(Waiter):
        name = "quitter"

        async def run(self, stop: asyncio.Event) -> None:
            return

    waiter = Waiter()
    host = Host(handle_signals=False).add(Quitter()).add(waiter)
    with pytest.raises(RuntimeError, match="returned before it was asked to stop"):
        await host.run()
    assert waiter.stopped.is_set()


@pytest.mark.cells
async def test_a_service_that_cannot_start_waits_not_ready_and_starts_once_it_can(
        actors, monkeypatch: pytest.MonkeyPatch) -> None:
    """No cell for the verifier (bubblewrap gone from this process's view):
    under the ``fail`` policy it is no death -- the host waits for its
    prepare(), says the cause once without a traceback, its registry row says
    why, nothing is verified; bubblewrap back, it starts, the row clear."""
    from structlog.testing import capture_logs

    from ledger.roles.verifier import Verifier
    from ledger.runtime import startup
    from ledger.sandbox import cell as cells

    there = cells.bubblewrap
    monkeypatch.setattr(cells, "bubblewrap", lambda: None)
    monkeypatch.setattr(cells, "_checked", {})
    verifier = Verifier(await actors("verifier"), poll_s=0.05)
    host = Host(handle_signals=False).add(verifier)
    reads = await actors.reads()

    async def row(want_not_ready: bool) -> bool:
        rows = [r for r in await reads.processes() if r.role == "verifier" and r.status == "live"]
        return bool(rows) and (("bubblewrap" in (rows[0].not_ready or "")) if want_not_ready
                               else rows[0].not_ready is None)

    with capture_logs() as logs:
        running = asyncio.create_task(host.run())
        await eventually(lambda: row(True), what="the verifier's row saying it is not ready")
        assert "bubblewrap" in startup.READINESS.waiting["verifier"]
        assert verifier.runs == 0 and not host.stopping.is_set()
        monkeypatch.setattr(cells, "bubblewrap", there)
        await eventually(lambda: verifier.runs >= 1, what="the verifier working")
        await eventually(lambda: row(False), what="its row clear")
        assert "verifier" not in startup.READINESS.waiting
        host.stop()
        assert await running == 0
    said = [e for e in logs if "bubblewrap" in e["event"]]
    assert len(said) == 1 and said[0]["event"].startswith("not ready: "), said
    assert not any(e.get("exc_info") for e in logs), logs
    assert host.services["verifier"].error is None and host.services["verifier"].restarts == 0


async def test_a_bounded_wait_to_start_ends_the_host_with_the_cause(
        actors, monkeypatch: pytest.MonkeyPatch) -> None:
    """``wait_for_start_s=0`` (``--wait-for-start 0``): the cause is raised at
    once, whatever the policy -- never restarted into a loop."""
    from ledger.roles.verifier import Verifier
    from ledger.sandbox import cell as cells

    monkeypatch.setattr(cells, "bubblewrap", lambda: None)
    monkeypatch.setattr(cells, "_checked", {})
    waiter = Waiter()
    host = Host(handle_signals=False, policy="restart", wait_for_start_s=0)
    host.add(Verifier(await actors("verifier"), poll_s=0.05)).add(waiter)
    with pytest.raises(cells.SandboxUnavailable, match="bubblewrap"):
        async with asyncio.timeout(30):
            await host.run()
    assert host.services["verifier"].restarts == 0 and waiter.stopped.is_set()


async def test_sigterm_is_handled_once_and_stops_every_service() -> None:
    first, second = Waiter(), Waiter()
    second.name = "second"
    second.release.clear()  # still stopping when the second signal comes
    host = Host().add(first).add(second)
    running = asyncio.create_task(host.run())
    await first.started.wait()
    await second.started.wait()
    os.kill(os.getpid(), signal.SIGTERM)
    await second.stopped.wait()
    os.kill(os.getpid(), signal.SIGINT)  # while stopping: logged, nothing more
    await eventually(lambda: host.signals == 2, what="the second signal")
    second.release.set()
    assert await running == 0
    assert first.stopped.is_set()
    # The handlers are gone with the host: SIGTERM is the default again.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


async def test_the_handler_before_the_host_is_back_after_it() -> None:
    """The CLI installs a clean-stop SIGTERM handler before the host starts; a
    SIGTERM while the process exits after the host (its cells still being torn
    down) must meet that handler again, not the default (death by signal: a
    worker in the chaos drill exited -15)."""
    def clean_stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    original = signal.signal(signal.SIGTERM, clean_stop)
    try:
        waiter = Waiter()
        host = Host().add(waiter)
        running = asyncio.create_task(host.run())
        await waiter.started.wait()
        host.stop()
        assert await running == 0
        assert signal.getsignal(signal.SIGTERM) is clean_stop
    finally:
        signal.signal(signal.SIGTERM, original)


async def test_what_a_service_leaves_running_is_found_and_ended(tmp_path) -> None:
    children: list[subprocess.Popen[bytes]] = []

    class Leaky(Waiter):
        name = "leaky"

        async def run(self, stop: asyncio.Event) -> None:
            asyncio.create_task(asyncio.sleep(3600), name="forgotten")
            children.append(subprocess.Popen(["sleep", "3600"], start_new_session=True))
            await super().run(stop)

    bystander = asyncio.create_task(asyncio.sleep(3600), name="bystander")  # not the host's
    leaky = Leaky()
    host = Host(handle_signals=False, settle_s=0.2).add(leaky)
    running = asyncio.create_task(host.run())
    await leaky.started.wait()
    host.stop()
    assert await running == EX_SOFTWARE
    assert host.leftovers.tasks == ["forgotten"]
    assert host.leftovers.children == [children[0].pid]
    assert children[0].wait(timeout=10) == -signal.SIGKILL
    assert process_gone(children[0].pid)
    assert not bystander.done()  # tasks of the code around the host are not its business
    bystander.cancel()


async def test_a_clean_service_leaves_nothing(actors) -> None:
    dispatcher = Dispatcher(await actors("dispatcher"), poll_s=0.05)
    host = Host(handle_signals=False).add(dispatcher)
    running = asyncio.create_task(host.run())
    await eventually(lambda: dispatcher.runs >= 2, what="two dispatcher passes")
    host.stop()
    assert await running == 0 and not host.leftovers


async def test_options_are_checked_before_anything_runs(actors) -> None:
    host = Host(handle_signals=False)
    with pytest.raises(TypeError):
        host.add(object())  # type: ignore[arg-type]
    host.add(Waiter())
    with pytest.raises(ValueError, match="already added"):
        host.add(Waiter())
    with pytest.raises(ValueError):
        Host(policy="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Trimmer(await actors("operator"), older_than_s=-1)
    with pytest.raises(ConfigError):
        ReaperOptions(grace_s=-1)
    with pytest.raises(ValueError):
        Reaper(await actors("reaper"), interval_s=0)
    assert isinstance(Waiter(), Service)


async def test_the_trimmer_service_trims_closed_campaigns_deltas(actors, admin, test_class) -> None:
    d = Driver(actors, test_class)
    worker, op = await d.k("worker"), await d.k("operator")
    closed, gen = await d.leased()
    await worker.append_events(closed, gen, [{"type": "output", "payload": {"t": "a"}, "delta": True},
                                             {"type": "command.started", "payload": {}}])
    await op.abandon(closed)
    trimmer = Trimmer(op, older_than_s=0, interval_s=0.05)
    host = Host(handle_signals=False).add(trimmer)
    running = asyncio.create_task(host.run())
    await eventually(lambda: trimmer.removed == 1, what="the delta to be trimmed")
    host.stop()
    assert await running == 0
    kinds = admin.execute("SELECT type, delta FROM ledger.campaign_event WHERE campaign_id = %s",
                          (closed,)).fetchall()
    assert {"type": "output", "delta": True} not in kinds
    assert {"type": "command.started", "delta": False} in kinds


async def test_trim_every_runs_under_the_host_until_sigterm(db_url, actors, admin, test_class) -> None:
    """The command builds the trimmer and hands it to the host: it trims on
    its interval, and SIGTERM (handled by the host) ends it with exit 0."""
    d = Driver(actors, test_class)
    worker, op = await d.k("worker"), await d.k("operator")
    closed, gen = await d.leased()
    await worker.append_events(closed, gen, [{"type": "output", "payload": {"t": "a"}, "delta": True}])
    await op.abandon(closed)
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX}
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "trim", "--older-than", "0s",
                             "--every", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        def trimmed() -> bool:
            assert proc.poll() is None, proc.communicate()
            return admin.execute("SELECT count(*) AS n FROM ledger.campaign_event "
                                 "WHERE campaign_id = %s AND delta", (closed,)).fetchone()["n"] == 0
        await eventually(trimmed, timeout=60, what="the running trimmer's first pass")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.startswith("removed 1 delta event of campaigns closed more than 0s ago"), out


@pytest.mark.cells
async def test_the_worker_service_run_once_claims_and_attempts_one(db: Database, actors, admin, tmp_path) -> None:
    from ledger.demo import DEMO_CLASS, demo_config, make_repository
    from ledger.roles.worker import Worker, WorkerOptions

    config = demo_config(make_repository(tmp_path))
    await (await actors("operator")).register_class(DEMO_CLASS, **config.classes[DEMO_CLASS].registration())
    worker = Worker(db, config, WorkerOptions(data_dir=tmp_path / "data"))
    assert await worker.run_once() == 0  # nothing to claim
    cid = (await (await actors("sensor")).open_campaign(DEMO_CLASS, "calc", "repo")).campaign_id
    assert await worker.run_once() == 1
    row = admin.execute("SELECT state, attempt_count FROM ledger.campaign WHERE id = %s", (cid,)).fetchone()
    assert row["state"] == "attempted"
    assert worker.attempts == {} and list((tmp_path / "data" / "attempts").glob("*")) == []
