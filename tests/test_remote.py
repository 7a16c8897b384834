"""Ledger's git against a real git server on loopback (``ledger.ops.gitserver``):
``git daemon`` with receive-pack (``git://``) and git's ``http-backend``
behind basic authentication (``http://``), each role through a cache of its
own. Publication, compare-and-swap promotion, deletion by ``ledger gc``, an
outage and missing credentials -- every one over both transports."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.config import parse_config
from ledger.git.repository import RefMoved, Repository, SystemFault
from ledger.ops.gitserver import GitDaemon, GitServer, HttpGitServer, bare_repository, push_change
from ledger.roles.gc import collect

pytestmark = pytest.mark.anyio


class Remote:
    """A served repository and what a role needs to reach it."""

    def __init__(self, server: GitServer, root: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch):
        self.server, self.root, self.tmp = server, root, tmp
        self.bare = bare_repository(root, "app.git", {"value.txt": "good\n"})
        self.url = server.url("app.git")
        self.credentials: Path | None = None
        if isinstance(server, HttpGitServer):
            self.credentials = server.credentials(tmp / "operator" / "git-credentials")
            monkeypatch.setenv("LEDGER_GIT_CREDENTIAL_HELPER", f"store --file={self.credentials}")
        self._caches = 0

    def role(self) -> Repository:
        """The repository as one more role sees it: through a cache of its own."""
        self._caches += 1
        return Repository(self.url, cache_dir=self.tmp / f"role-{self._caches}" / "repos")

    def on_server(self, *args: str) -> str:
        """Look at (or move) the served repository itself, as its host would."""
        return subprocess.run(["git", "-C", str(self.bare), *args], check=True, capture_output=True,
                              text=True).stdout.strip()


@pytest.fixture(params=["git", "http"])
def remote(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Remote]:
    root = tmp_path / "served"
    root.mkdir()
    server: GitServer = GitDaemon(root) if request.param == "git" else HttpGitServer(root)
    server.start()
    try:
        yield Remote(server, root, tmp_path, monkeypatch)
    finally:
        server.close()


def test_a_candidate_published_by_one_role_is_fetched_by_another(remote: Remote) -> None:
    """The worker's candidate reaches the remote (read back there)
    and a verifier with a cache of its own fetches it by its ref."""
    worker, verifier = remote.role(), remote.role()
    base = worker.resolve("main")
    candidate = worker.make_candidate(base, base, "ledger: a candidate", *(2 * [worker_identity()]))
    ref = "refs/heads/ledger/7/1"
    worker.publish(ref, candidate)
    assert remote.on_server("rev-parse", ref) == candidate
    worker.publish(ref, candidate)  # a retry of the same publication is fine
    verifier.fetch(ref)
    assert verifier.has_commit(candidate)
    other = worker.make_candidate(base, base, "ledger: another", *(2 * [worker_identity()]))
    with pytest.raises(RefMoved):  # never moves a published candidate elsewhere
        worker.publish(ref, other)
    assert remote.on_server("rev-parse", ref) == candidate


def worker_identity() -> Any:
    from ledger.git.repository import Identity

    return Identity("Worker", "worker@localhost")


def test_a_promotion_moves_the_remote_branch_with_compare_and_swap(remote: Remote) -> None:
    """The dispatcher's ref update lands on the remote, and only
    from where it expected the branch to be."""
    worker, dispatcher = remote.role(), remote.role()
    base = worker.resolve("main")
    candidate = worker.make_candidate(base, base, "ledger: fix", *(2 * [worker_identity()]))
    worker.publish("refs/heads/ledger/1/1", candidate)
    dispatcher.fetch("refs/heads/ledger/1/1")
    dispatcher.update_ref("refs/heads/main", candidate, base)
    assert remote.on_server("rev-parse", "refs/heads/main") == candidate
    assert dispatcher.remote_ref("refs/heads/main") == candidate

    # Someone pushes meanwhile: a promotion from the old place is refused.
    moved = push_change(remote.url, {"value.txt": "theirs\n"}, "theirs", credentials=remote.credentials)
    late = worker.make_candidate(base, base, "ledger: late", *(2 * [worker_identity()]))
    worker.publish("refs/heads/ledger/1/2", late)
    dispatcher.fetch("refs/heads/ledger/1/2")
    with pytest.raises(RefMoved) as refused:
        dispatcher.update_ref("refs/heads/main", late, candidate)
    assert refused.value.actual == moved
    assert remote.on_server("rev-parse", "refs/heads/main") == moved


def test_an_outage_is_a_system_fault_and_the_remote_comes_back_at_the_same_url(remote: Remote) -> None:
    repo = remote.role()
    base = repo.resolve("main")
    remote.server.stop()
    for step in (lambda: repo.resolve("main"), lambda: repo.remote_ref("refs/heads/main"),
                 lambda: repo.publish("refs/heads/ledger/1/1", base),
                 lambda: repo.update_ref("refs/heads/main", base, base)):
        with pytest.raises(SystemFault):
            step()
    remote.server.start()
    assert repo.resolve("main") == base


def test_without_credentials_the_authenticated_remote_refuses(remote: Remote,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if remote.credentials is None:
        pytest.skip("git:// has no authentication")
    monkeypatch.delenv("LEDGER_GIT_CREDENTIAL_HELPER")
    with pytest.raises(SystemFault, match="could not read Username"):
        remote.role().resolve("main")
    # and with the wrong password
    assert isinstance(remote.server, HttpGitServer)
    wrong = remote.server.credentials(remote.tmp / "wrong", password="not-it")
    monkeypatch.setenv("LEDGER_GIT_CREDENTIAL_HELPER", f"store --file={wrong}")
    with pytest.raises(SystemFault, match="Authentication failed"):
        remote.role().resolve("main")
    assert remote.server.requests["unauthenticated"] >= 2


@pytest.mark.rollback
async def test_gc_deletes_ledgers_refs_on_the_remote_with_compare_and_swap(remote: Remote, actors: Any) -> None:
    """Item 6: ``ledger gc`` lists Ledger's refs on the remote (ls-remote) and
    deletes those of long-closed campaigns there, each only if it is still
    where it was listed; a ref moved since is kept."""
    config = parse_config({"classes": {"quick": {"repository": remote.url, "attempt_command": ["true"],
                                                 "branch_retention_s": 0}}})
    operator, sensor = await actors("operator"), await actors("sensor")
    await operator.register_class("quick", **config.classes["quick"].registration())
    closed = (await sensor.open_campaign("quick", "a", "repo")).campaign_id
    still_open = (await sensor.open_campaign("quick", "b", "repo")).campaign_id
    await operator.abandon(closed, "done with it")
    main = remote.on_server("rev-parse", "main")
    for cid, attempt in ((closed, 1), (closed, 2), (still_open, 1)):
        remote.on_server("update-ref", f"refs/heads/ledger/{cid}/{attempt}", main)
    data = remote.tmp / "gc-data"

    done = await collect(await actors.reads(), config, data)
    assert sorted(done.deleted) == [f"{remote.url} refs/heads/ledger/{closed}/1",
                                    f"{remote.url} refs/heads/ledger/{closed}/2"]
    assert (done.kept_open, done.errors) == (1, [])
    left = remote.on_server("for-each-ref", "--format=%(refname)", "refs/heads/ledger/").split()
    assert left == [f"refs/heads/ledger/{still_open}/1"]

    # Listed, then moved by someone else before the delete: kept.
    repo = Repository(remote.url, cache_dir=data / "repos")
    remote.on_server("update-ref", f"refs/heads/ledger/{closed}/3", main)
    [(ref, sha, _, _)] = [b for b in repo.attempt_branches() if b[2] == closed]
    moved = push_change(remote.url, {"value.txt": "moved\n"}, "moved", branch=ref.removeprefix("refs/heads/"),
                        credentials=remote.credentials)
    assert not repo.delete_ref(ref, sha)
    assert remote.on_server("rev-parse", ref) == moved
    assert repo.delete_ref(ref, moved)
    assert not remote.on_server("for-each-ref", ref)


@pytest.mark.rollback
@pytest.mark.cells
async def test_a_sensor_that_cannot_reach_the_remote_observes_nothing(remote: Remote, actors: Any) -> None:
    """A sensor observing ``REPOSITORY#REF`` on a remote that is down records
    an error, which moves nothing: a red one would send the promoted campaign
    back to be attempted again, charged (or open a campaign on a fault).
    Once the remote is back, the same sensor confirms the promotion."""
    import sys

    from drive import Driver
    from ledger.config import SensorConfig
    from ledger.roles.sensors import Sensor

    config = parse_config({"classes": {"fix": {"repository": remote.url, "attempt_command": ["true"],
                                               "promote_to": "refs/heads/main"}}})
    operator = await actors("operator")
    await operator.register_class("fix", **config.classes["fix"].registration())
    class Watched(Driver):  # the campaign the sensor's objective names
        async def open(self, key: str | None = None, **kw: Any) -> int:
            opened = await (await self.k("sensor")).open_campaign("fix", "s:app#main", "app#main")
            return opened.campaign_id

    cid = await Watched(actors, "fix").promoted()
    check = [sys.executable, "-c", "import pathlib, sys; "
             "sys.exit(pathlib.Path('value.txt').read_text() != 'good\\n')"]
    sensor = Sensor(await actors("sensor"), SensorConfig(name="s", target="app#main", every_s=60, command=check,
                                                         **{"class": "fix"}),
                    "sensor-1", observes=(remote.url, "main"), cache_dir=remote.tmp / "sensor" / "repos")
    remote.server.stop()
    error = await sensor.observe(None)
    assert error is not None and (error.effect, error.campaign_id) == ("recorded", None)
    assert error.reason is not None and error.reason.startswith("cannot check out main of")
    reads = await actors.reads()
    assert (await reads.observation(error.observation_id)).status == "error"
    assert (await reads.campaign(cid)).state == "verified"
    assert (await reads.recent_observations(cid)) == []
    remote.server.start()
    seen = await sensor.observe(None)
    assert seen is not None and seen.effect == "confirmed"
    assert (await reads.campaign(cid)).state == "confirmed"


def test_a_remote_gone_silent_is_a_system_fault_not_a_step_without_end(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote that accepts the connection and then says nothing (a hung
    server, a half-dead network path) made every transfer wait forever -- the
    verifier heartbeating a check that never ends. Every transfer has a
    deadline (``REPOSITORY.REMOTE_TIMEOUT_S``); past it, it is a system fault."""
    import socket
    import threading
    import time

    from ledger.git import repository

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # accepted, and never answered
            except OSError:
                continue

    threading.Thread(target=hold, daemon=True).start()
    monkeypatch.setattr(repository, "REMOTE_TIMEOUT_S", 2.0)
    url = f"git://127.0.0.1:{listener.getsockname()[1]}/app.git"
    repo = Repository(url, cache_dir=tmp_path / "repos")
    try:
        for step in (lambda: repo.resolve("main"), lambda: repo.remote_ref("refs/heads/main"),
                     lambda: repo.update_ref("refs/heads/main", "a" * 40, "b" * 40)):
            started = time.monotonic()
            with pytest.raises(SystemFault, match="did not finish within 2s"):
                step()
            assert time.monotonic() - started < 30
    finally:
        stop.set()
        listener.close()
        for conn in held:
            conn.close()
