"""Attempt cells (``ledger.sandbox.cell``): an attempt cannot leave its cell, and what
it tries is recorded.

The main test runs a real ``ledger worker`` against a real repository with a
hostile attempt command (``drills/hostile_agent.py``) that tries each escape
found before cells existed -- the worker's environment through ``/proc``,
the database directly, the user's repository (its refs, its working tree,
its hooks), hooks and configuration for Ledger's own git, a daemon that
outlives the attempt, Ledger's configuration and the judge's interpreter,
and the network -- and then checks, on the host, that each was refused or
contained: nothing of the worker's environment reached the journal, the
repository and the files are as they were, no planted program ran, no
process survived, the listener heard nothing; that the cell's report is a
``security_event`` and the candidate was refused; and that the honest
second attempt is recorded. Smaller tests check the cell's own promises one
by one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from conftest import TEST_PREFIX, Actors, Admin
from drive import eventually
from ledger import Database
from ledger.config import load_config
from ledger.sandbox import cell as cells
from ledger.sandbox.processes import cell_environment, run_command
from ledger.sandbox.redaction import Redactor, known_secrets

pytestmark = pytest.mark.anyio

HOSTILE = Path(__file__).resolve().parent.parent / "drills" / "hostile_agent.py"
CLASS = "hostile"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"

needs_cells = pytest.mark.skipif(cells.bubblewrap() is None,
                                 reason="bubblewrap is not installed (apt-get install bubblewrap)")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


def _tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _work_tree(repo: Path) -> dict[str, str]:
    return {k: v for k, v in _tree_digest(repo).items() if not k.startswith(".git/")}


def _host_processes_with(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if tag.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


class Listener:
    """A TCP server on the host's loopback that records every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def heard(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return n
            conn.close()
            n += 1


@needs_cells
async def test_a_hostile_attempt_is_contained_and_recorded(tmp_path: Path, db_url: str, actors: Actors,
                                                          admin: Admin) -> None:
    repo = tmp_path / "repo"
    _git(tmp_path, "init", "-q", "-b", "main", str(repo))
    (repo / "calc.py").write_text(BUGGY)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "calc with a bug")
    main_before = _git(repo, "rev-parse", "refs/heads/main")
    data = tmp_path / "data"
    markers = tmp_path / "markers"
    markers.mkdir()
    listener = Listener()
    tag = f"hostile-daemon-{uuid.uuid4().hex}"
    canary = f"canary-{uuid.uuid4().hex}"
    site = Path(sysconfig.get_paths()["purelib"])
    targets = tmp_path / "targets.json"
    config = tmp_path / "ledger.toml"
    targets.write_text(json.dumps({
        "user_repo": str(repo), "ledger_toml": str(config), "data_dir": str(data),
        "site_packages": str(site), "db_port": conninfo_to_dict(db_url).get("port") or 5432,
        "listen_port": listener.port, "marker_dir": str(markers), "daemon_tag": tag,
        "fix": {"calc.py": FIXED}}))
    config.write_text(f"""
[classes.{CLASS}]
repository = "{repo}"
base_ref = "main"
attempt_command = ["{sys.executable}", "{HOSTILE}", "{targets}"]
attempt_timeout_s = 60
max_attempts = 3
lease_s = 20
heartbeat_s = 2
backoff = {{ base_s = 0, jitter = 0 }}
""")
    config_before = _digest(config)
    _work_tree_before = _work_tree(repo)
    git_config_before = _digest(repo / ".git" / "config")
    hooks_before = _tree_digest(repo / ".git" / "hooks")
    site_before = sorted(p.name for p in site.iterdir())
    op = await actors("operator")
    await op.register_class(CLASS, **load_config(config).campaign_class(CLASS).registration())
    cid = (await (await actors("sensor")).open_campaign(CLASS, "hostile", "repo")).campaign_id

    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_DATA_DIR": str(data), "LEDGER_CONFIG": str(config), "HOSTILE_CANARY": canary}
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "ledger", "worker", "--poll", "0.2"], env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        def attempts() -> list[dict]:
            return admin.execute("SELECT attempt_no, outcome, failure_reason FROM ledger.attempt "
                                 "WHERE campaign_id = %s ORDER BY attempt_no", (cid,)).fetchall()
        await eventually(lambda: len(attempts()) >= 2 and attempts()[1]["outcome"] != "running",
                         timeout=120, what="the hostile attempt and the honest one after it")
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    first, second = attempts()[:2]

    # The cell's report: a security event, and the candidate refused.
    assert first["outcome"] == "failed", first
    assert first["failure_reason"].startswith("refused: the attempt tried what its cell does not allow")
    actions = {r["action"] for r in admin.execute(
        "SELECT action FROM ledger.security_event WHERE campaign_id = %s", (cid,)).fetchall()}
    assert "cell.leftover_processes" in actions
    assert second["outcome"] == "attempted", second  # the honest fix, recorded

    # What the agent itself saw: every escape refused.
    output = "".join(r["chunk"] for r in admin.execute(
        "SELECT payload->>'text' AS chunk FROM ledger.campaign_event WHERE campaign_id = %s "
        "AND type = 'output' ORDER BY seq", (cid,)).fetchall() if r["chunk"])
    seen = {}
    for line in output.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            seen[entry["escape"]] = entry
    assert set(seen) >= {"proc.environ", "database", "user.repository", "git.plants", "daemon",
                         "config.judge", "network"}, output
    escaped = {k: v for k, v in seen.items() if v["outcome"] != "refused"}
    assert escaped == {}, escaped

    # And on the host: nothing of the worker's reached the journal ...
    everything = json.dumps([dict(r) for r in admin.execute(
        "SELECT payload FROM ledger.campaign_event WHERE campaign_id = %s", (cid,)).fetchall()])
    everything += json.dumps([r["log_tail"] for r in admin.execute(
        "SELECT log_tail FROM ledger.attempt WHERE campaign_id = %s", (cid,)).fetchall()])
    assert canary not in everything
    assert db_url not in everything
    # ... the user's repository, Ledger's configuration and the interpreter are as they were ...
    assert _git(repo, "rev-parse", "refs/heads/main") == main_before
    assert _work_tree(repo) == _work_tree_before
    assert _digest(repo / ".git" / "config") == git_config_before
    assert _tree_digest(repo / ".git" / "hooks") == hooks_before
    assert not (repo / "HOSTILE").exists()
    assert _digest(config) == config_before
    assert sorted(p.name for p in site.iterdir()) == site_before
    assert not (data / "hostile").exists()
    # ... no planted program ran, no process survived, nobody was heard.
    assert list(markers.iterdir()) == []
    assert _host_processes_with(tag) == []
    assert listener.heard() == 0


@needs_cells
async def test_the_cell_sees_no_process_of_the_host_and_an_empty_environment(tmp_path: Path) -> None:
    spec = cells.CellSpec(cells.CellPolicy(), (cells.Binding(tmp_path, cells.INSIDE_WORK, True),),
                          env=cell_environment())
    script = ("import os, json; pids = [p for p in os.listdir('/proc') if p.isdigit()]; "
              "print(json.dumps({'pids': len(pids), 'init_env': open('/proc/1/environ','rb').read().decode(), "
              "'uid': os.getuid(), 'env': sorted(os.environ)}))")
    result = await run_command([sys.executable, "-c", script], "/", timeout_s=60, cell=spec)
    assert result.passed, result.output
    seen = json.loads(result.output)
    assert seen["pids"] <= 4  # bubblewrap's init, the monitor, the command (and nothing of the host's)
    assert seen["init_env"] == ""
    assert seen["uid"] == cells.CELL_UID
    assert not any(k.startswith(("LEDGER_", "PG")) or "DATABASE" in k for k in seen["env"])


@needs_cells
async def test_only_the_workspace_is_writable_and_the_host_is_mostly_absent(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "key").write_text("do not read")
    spec = cells.CellSpec(cells.CellPolicy(), (cells.Binding(work, cells.INSIDE_WORK, True),),
                          env=cell_environment())
    script = (f"import os\nfor path in ['/etc/x', '/usr/x', '{sys.prefix}/x', '/tmp/x', '/cell/work/x']:\n"
              f"    try:\n        open(path, 'w').write('x'); print('wrote', path)\n"
              f"    except OSError as e: print('refused', path, e.errno)\n"
              f"print('secret', os.path.exists('{secret_dir}/key'))\n"
              f"print('home', sorted(os.listdir('{Path.home()}')) if os.path.isdir('{Path.home()}') else [], "
              f"os.environ['HOME'])\n"
              "try:\n    open('/etc/shadow').read(); print('shadow True')\n"
              "except OSError:\n    print('shadow False')\n")
    result = await run_command([sys.executable, "-c", script], "/", timeout_s=60, cell=spec)
    lines = result.output.splitlines()
    assert "wrote /tmp/x" in lines and "wrote /cell/work/x" in lines
    assert (work / "x").exists()
    for path in ("/etc/x", "/usr/x", f"{sys.prefix}/x"):
        assert f"wrote {path}" not in lines, result.output
    assert "secret False" in lines
    assert "shadow False" in lines
    # Of the host's $HOME, at most the way to an interpreter Ledger runs under (bound read-only).
    home_line = next(line for line in lines if line.startswith("home "))
    assert home_line.endswith(cells.INSIDE_HOME)
    allowed = {Path(p).relative_to(Path.home()).parts[0] for p in cells._interpreter_paths()
               if p.startswith(str(Path.home()) + "/")}
    seen_in_home = set(eval(home_line[len("home "):-len(cells.INSIDE_HOME)].strip()))  # noqa: S307 (our own print)
    assert seen_in_home <= allowed, seen_in_home


@needs_cells
async def test_daemons_die_with_the_cell_and_are_reported(tmp_path: Path) -> None:
    tag = f"cell-daemon-{uuid.uuid4().hex}"
    script = ("import os, sys, time\n"
              "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)', '{tag}'])\n"
              "    os._exit(0)\nos.wait(); time.sleep(0.3)\n")
    spec = cells.CellSpec(cells.CellPolicy(), (), cwd="/", env=cell_environment())
    result = await run_command([sys.executable, "-c", script], "/", timeout_s=60, cell=spec)
    assert result.passed, result.output
    assert any(tag in left for left in result.leftovers), result.leftovers
    await eventually(lambda: _host_processes_with(tag) == [], what="the daemon to be gone")


@needs_cells
async def test_no_network_by_default(tmp_path: Path) -> None:
    listener = Listener()
    script = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {listener.port}), timeout=2)\n"
              "    print('reached')\nexcept OSError as e:\n    print('refused', e)\n")
    spec = cells.CellSpec(cells.CellPolicy(), (), cwd="/", env=cell_environment())
    result = await run_command([sys.executable, "-c", script], "/", timeout_s=60, cell=spec)
    assert result.output.startswith("refused"), result.output
    assert listener.heard() == 0
    host = cells.CellSpec(cells.CellPolicy(network="host"), (), cwd="/", env=cell_environment())
    opened = await run_command([sys.executable, "-c", script], "/", timeout_s=60, cell=host)
    assert opened.output.startswith("reached"), opened.output  # the opt-in does what it says
    assert listener.heard() == 1


@needs_cells
async def test_limits_bound_memory_and_file_size(tmp_path: Path) -> None:
    spec = cells.CellSpec(cells.CellPolicy(memory_mb=256, file_size_mb=1),
                          (cells.Binding(tmp_path, cells.INSIDE_WORK, True),), env=cell_environment())
    grow = await run_command([sys.executable, "-c", "x = bytearray(1 << 30)"], "/", timeout_s=60, cell=spec)
    assert not grow.passed and "MemoryError" in grow.output
    write = await run_command(["/bin/sh", "-c", "head -c 2000000 /dev/zero > /cell/work/big"], "/",
                              timeout_s=60, cell=spec)
    assert not write.passed
    assert (tmp_path / "big").stat().st_size <= 1 << 20


@needs_cells
async def test_a_cell_is_killed_at_its_timeout(tmp_path: Path) -> None:
    spec = cells.CellSpec(cells.CellPolicy(), (), cwd="/", env=cell_environment())
    result = await run_command(["/bin/sleep", "60"], "/", timeout_s=0.5, cell=spec)
    assert result.timed_out and result.duration_s < 30


async def test_known_secrets_are_redacted_even_across_chunks() -> None:
    secrets = known_secrets({"LEDGER_DATABASE_URL": "postgresql://ledger:s3cr3t-pw@db:5432/x",
                             "LEDGER_SESSION_SECRET": "session-secret-value", "PATH": "/bin"})
    assert "s3cr3t-pw" in secrets and "session-secret-value" in secrets and "/bin" not in secrets
    redactor = Redactor(secrets)
    stream = b"connect to postgresql://ledger:s3cr3t-pw@db:5432/x now; pw s3cr3"
    out = redactor.feed(stream[:20]) + redactor.feed(stream[20:]) + redactor.feed(b"t-pw done") + redactor.flush()
    assert b"s3cr3t-pw" not in out and out.count(b"[redacted]") == 2, out
    assert out.endswith(b" done")


async def test_the_sandbox_unavailable_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cells, "bubblewrap", lambda: None)
    monkeypatch.setattr(cells, "_checked", {})
    with pytest.raises(cells.SandboxUnavailable) as raised:
        cells.check_available()
    assert "bubblewrap" in raised.value.message and "apt-get install bubblewrap" in (raised.value.hint or "")


class Echo:
    """A TCP server on the host's loopback that answers each line with itself."""

    def __init__(self) -> None:
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            line = await reader.readline()
            writer.write(b"echo " + line)
            await writer.drain()
            writer.close()
        self.server = await asyncio.start_server(echo, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]


PROXIED = """import json, socket, sys
allowed, other = int(sys.argv[1]), int(sys.argv[2])
def connect(target):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n".encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    status = head.split(b" ", 2)[1].decode() if head else "none"
    if status == "200":
        s.sendall(b"hello\\n")
        return status, s.recv(100).decode().strip()
    return status, ""
out = {"allowed": connect(f"127.0.0.1:{allowed}"), "other": connect(f"127.0.0.1:{other}"),
       "by_name": connect(f"localhost:{allowed}")}
try:
    socket.create_connection(("127.0.0.1", allowed), timeout=2)
    out["direct"] = "reached"
except OSError:
    out["direct"] = "refused"
print(json.dumps(out))
"""


@needs_cells
async def test_the_proxy_policy_lets_out_only_what_the_class_allows() -> None:
    allowed, other = Echo(), Echo()
    await allowed.start()
    await other.start()
    # an address only by naming it exactly; *:OTHER matches names only
    policy = cells.CellPolicy(network="proxy", allow=[f"127.0.0.1:{allowed.port}", f"*:{other.port}"])
    spec = cells.CellSpec(policy, (), cwd="/", env=cell_environment())
    result = await run_command([sys.executable, "-c", PROXIED, str(allowed.port), str(other.port)], "/",
                               timeout_s=60, cell=spec)
    assert result.passed, result.output
    seen = json.loads(result.output)
    assert seen["allowed"] == ["200", "echo hello"]
    assert seen["other"][0] == "403"  # an address no pattern names exactly (*:PORT does not)
    assert seen["by_name"][0] == "403"  # a name that is not allowed (and resolves to loopback)
    assert seen["direct"] == "refused"  # around the proxy: no network at all
    assert result.egress_refused == (
        f"127.0.0.1:{other.port} (an address of this host's own networks)", f"localhost:{allowed.port}")


async def test_an_allowed_name_resolving_to_this_hosts_networks_is_refused() -> None:
    from ledger.sandbox.egress import EgressProxy
    proxy = EgressProxy(["localhost:5432", "*.internal:443"])
    async with proxy.serving() as path:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(b"CONNECT localhost:5432 HTTP/1.1\r\n\r\n")
        await writer.drain()
        answer = await reader.read(200)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 403"), answer  # allowed by name, but it is the host's own database
    assert proxy.refused and "resolves to" in proxy.refused[0]
    assert proxy.permits("api.internal", 443) and not proxy.permits("api.internal", 80)


def test_a_proxy_policy_needs_its_allow_list() -> None:
    with pytest.raises(ValueError, match="needs cell.allow"):
        cells.CellPolicy(network="proxy")
    with pytest.raises(ValueError, match="HOST:PORT"):
        cells.CellPolicy(network="proxy", allow=["api.example.com"])


async def test_a_worker_without_bubblewrap_fails_at_start_naming_the_package(
        tmp_path: Path, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.config import parse_config
    from ledger.roles.worker import Worker, WorkerOptions

    monkeypatch.setattr(cells, "bubblewrap", lambda: None)
    monkeypatch.setattr(cells, "_checked", {})
    config = parse_config({"classes": {"c": {"repository": str(tmp_path), "attempt_command": ["true"]}}})
    worker = Worker(db, config, WorkerOptions(data_dir=tmp_path / "data", poll_s=0.1))
    stop = asyncio.Event()
    with pytest.raises(cells.SandboxUnavailable) as raised:
        await asyncio.wait_for(worker.run(stop), 30)
    assert "bubblewrap" in raised.value.message and raised.value.exit_code == 78
    # ... while a class that opted out of the cell needs no bubblewrap
    opted_out = parse_config({"classes": {"c": {"repository": str(tmp_path), "attempt_command": ["true"],
                                                "cell": {"sandbox": False}}}})
    assert not opted_out.classes["c"].cell.sandbox


# --- the host's own networks, however spelt -----------------------------------------

OWN = ["127.0.0.2", "127.1", "2130706434", "0x7f.0.0.1", "0177.0.0.1", "[::ffff:127.0.0.1]",
       "[::ffff:7f00:1]", "::ffff:127.0.0.1", "[::1]", "[::127.0.0.1]", "10.0.0.1", "172.16.0.5",
       "192.168.1.1", "100.64.0.1", "169.254.169.254", "[::ffff:169.254.169.254]", "[fe80::1%25eth0]",
       "[fe80::1]", "[fc00::1]", "0.0.0.0", "[::]", "224.0.0.1", "[2002:7f00:1::]", "[64:ff9b::a9fe:a9fe]",
       "255.255.255.255"]


def test_every_spelling_of_the_hosts_own_networks_is_an_address_of_them() -> None:
    from ledger.sandbox.egress import literal, own_network
    for host in OWN:
        address = literal(host)
        assert address is not None, host
        assert own_network(address), host
    for host in ("8.8.8.8", "[2606:4700:4700::1111]", "1.1.1.1"):
        address = literal(host)
        assert address is not None and not own_network(address), host
    for name in ("api.example.com", "localhost", "10.example", "cafe", "deadbeef.internal"):
        assert literal(name) is None, name


async def test_the_proxy_refuses_addresses_whatever_the_pattern_and_records_each() -> None:
    """with ``*:PORT`` (matches any name), CONNECT to an address of
    the host's own networks -- any spelling -- is refused, each recorded; a
    listener on loopback hears nothing. Only a pattern naming an address
    (and port) exactly lets it through."""
    from ledger.sandbox.egress import EgressProxy
    echo = Echo()
    await echo.start()
    port = echo.port
    proxy = EgressProxy([f"*:{port}"])
    answers = {}
    async with proxy.serving() as path:
        for host in [*OWN, "localhost"]:
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode())
            await writer.drain()
            answers[host] = (await reader.read(200)).split(b" ", 2)[1]
            writer.close()
    assert set(answers.values()) == {b"403"}, answers
    assert len(proxy.refused) == len(OWN) + 1
    assert any("127.0.0.2" in r and "own networks" in r for r in proxy.refused)
    exact = EgressProxy([f"127.0.0.1:{port}"])
    async with exact.serving() as path:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.write(b"hi\n")
        assert await reader.readline() == b"echo hi\n"
        writer.close()
        # ... and only that one (its other spellings are the same address; the next is not)
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n".encode())
        await writer.drain()
        assert (await reader.read(200)).startswith(b"HTTP/1.1 403")
        writer.close()


def test_a_pattern_whose_wildcards_could_only_match_addresses_is_refused() -> None:
    for pattern in ("10.*:443", "127.0.0.?:80", "*.*.*.1:443", "[::ffff:*]:443", "1*:443"):
        with pytest.raises(ValueError, match="would match IP addresses"):
            cells.CellPolicy(network="proxy", allow=[pattern])
    for pattern in ("*:443", "*.example.com:443", "api.example.com:443", "10.0.0.5:443", "cafe*:443"):
        cells.CellPolicy(network="proxy", allow=[pattern])


# --- a judged cell's face -----------------------------------------------------------

FACE = """import json, os, pwd, socket
def text(path):
    try:
        return open(path, "rb").read().decode("utf-8", "replace")
    except OSError as exc:
        return f"unreadable: {exc}"
seen = {"cwd": os.getcwd(), "host": socket.gethostname(), "uid": os.getuid(),
        "user": pwd.getpwuid(os.getuid()).pw_name, "env": dict(os.environ), "root": sorted(os.listdir("/")),
        "etc": sorted(os.listdir("/etc")), "hostname": text("/etc/hostname").strip(),
        "everything": "".join(text(p) for p in ("/proc/self/mountinfo", "/proc/1/cmdline", "/proc/self/cmdline",
                                              "/proc/1/environ", "/proc/self/cgroup", "/etc/passwd",
                                              "/etc/group", "/etc/hosts"))}
try:
    open("/x", "w")
    seen["root_writable"] = True
except OSError:
    seen["root_writable"] = False
print(json.dumps(seen))
"""


async def _face(tmp_path: Path, family: str) -> tuple[Any, dict[str, Any]]:
    from ledger.sandbox import guise as guises
    work = tmp_path / f"w{uuid.uuid4().hex[:6]}"
    work.mkdir()
    guise = guises.draw(family, "calc")  # type: ignore[arg-type]
    spec = cells.CellSpec(cells.CellPolicy(), (cells.Binding(work, guise.checkout, True),), cwd=guise.checkout,
                          env=cell_environment(), guise=guise)
    result = await run_command([sys.executable, "-c", FACE], "/", timeout_s=60, cell=spec)
    assert result.passed, result.output
    return guise, json.loads(result.output)


@needs_cells
async def test_a_judged_cell_looks_like_an_ordinary_machine_and_names_nothing(tmp_path: Path) -> None:
    """a judged run's checkout is where a user's would be, its host,
    user and home ordinary, and nothing it can read -- its environment, its
    mounts, its first processes' command lines, /etc -- names Ledger or /cell."""
    guise, seen = await _face(tmp_path, "verifier")
    assert seen["cwd"] == guise.checkout and seen["cwd"].startswith("/home/")
    assert seen["host"] == seen["hostname"] == guise.hostname
    assert seen["uid"] == guise.uid != cells.CELL_UID and seen["user"] == guise.user
    assert seen["env"]["HOME"] == guise.home and seen["env"]["USER"] == guise.user
    assert {"home", "opt", "srv", "var", "tmp"} <= set(seen["root"]) and "cell" not in seen["root"]
    text = json.dumps(seen).lower()
    assert "ledger" not in text and "/cell" not in text
    assert not seen["root_writable"]  # the cell's own root is not a disk to fill
    other, again = await _face(tmp_path, "verifier")
    assert (other.checkout, other.hostname) != (guise.checkout, guise.hostname)  # drawn per run
    sensor, watched = await _face(tmp_path, "sensor")
    assert watched["cwd"] == sensor.checkout and not watched["cwd"].startswith("/home/")


def test_the_verifiers_and_the_sensors_faces_share_nothing() -> None:
    """A fix keyed to what the verifier's runs look like fails the sensor's
    confirming run: the families share no path prefix, user, uid or host
    name pattern."""
    from ledger.sandbox import guise as guises
    verifier = [guises.draw("verifier", "calc") for _ in range(300)]
    sensor = [guises.draw("sensor", "calc") for _ in range(300)]
    assert {g.checkout.split("/")[1] for g in verifier} == {"home"}
    assert "home" not in {g.checkout.split("/")[1] for g in sensor}
    assert not {g.user for g in verifier} & {g.user for g in sensor}
    assert not {g.uid for g in verifier} & {g.uid for g in sensor}
    assert not {g.hostname for g in verifier} & {g.hostname for g in sensor}
    assert len({g.checkout for g in verifier}) > 100  # not a fixed fingerprint either
    assert guises.project_name("/srv/git/calc.git") == "calc"
    assert guises.project_name("/var/lib/ledger/repos/x") == "x"
    assert "ledger" not in guises.project_name("https://example.com/acme/ledger.git")


@needs_cells
async def test_etc_is_shown_without_anything_named_for_ledger(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "ledger").mkdir(parents=True)
    (etc / "ledger" / "ledger.toml").write_text("secret = 1\n")
    (etc / "systemd" / "system").mkdir(parents=True)
    (etc / "systemd" / "system" / "ledger-worker.service").write_text("[Service]\n")
    (etc / "systemd" / "system" / "sshd.service").write_text("[Service]\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "shadow").write_text("root:x\n")
    (etc / "shadow").chmod(0o600)
    (etc / "os-release").symlink_to("hosts")
    args = cells.etc_args(str(etc), "/etc")
    bwrap = cells.bubblewrap()
    assert bwrap is not None
    listing = subprocess.run(
        [bwrap, "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
         "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", *args, "--",
         "/bin/sh", "-c", "find /etc | sort; cat /etc/shadow; echo; cat /etc/os-release"],
        capture_output=True, text=True, check=True).stdout
    assert "ledger" not in listing.lower(), listing
    assert "/etc/systemd/system/sshd.service" in listing and "/etc/hosts" in listing
    assert "root:x" not in listing  # not world-readable: not shown
    assert listing.strip().endswith("127.0.0.1 localhost")  # links kept


# --- limits on everything a command can fill ----------------------------------------

FILL = """import os, sys
os.makedirs("fill", exist_ok=True)
chunk = b"x" * (4 << 20)
for n in range(int(sys.argv[1])):
    with open(f"fill/{n}", "wb") as f:
        f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
print("wrote", n + 1)
"""


@needs_cells
async def test_the_workspace_can_grow_by_workspace_mb_and_no_more(tmp_path: Path) -> None:
    """a file-size limit is per file; 2 GiB went into /cell/work in
    files each allowed. The cell is killed once its workspace grew past
    cell.workspace_mb -- what it held at the start does not count."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "clone").write_bytes(b"c" * (24 << 20))  # bigger than the allowance: not the command's
    policy = cells.CellPolicy(workspace_mb=16)
    spec = cells.CellSpec(policy, (cells.Binding(work, cells.INSIDE_WORK, True),), env=cell_environment())
    small = await run_command([sys.executable, "-c", FILL, "2"], "/", timeout_s=60, cell=spec)
    assert small.passed and "wrote 2" in small.output, small.output
    assert small.limits["workspace_start_mb"] >= 24
    big = await run_command([sys.executable, "-c", FILL, "64"], "/", timeout_s=120, cell=spec)
    assert not big.passed and "wrote" not in big.output
    assert big.limits["exceeded"] == "workspace"
    assert "cell.workspace_mb (16 MiB)" in big.describe()
    grown = sum(p.stat().st_size for p in (work / "fill").iterdir()) >> 20
    assert grown < 16 + 64, f"{grown} MiB written past a 16 MiB allowance"


@needs_cells
async def test_the_cells_record_says_how_it_was_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.sandbox import cgroups
    spec = cells.CellSpec(cells.CellPolicy(), (), cwd="/", env=cell_environment())
    result = await run_command(["/bin/true"], "/", timeout_s=60, cell=spec)
    assert result.limits["mode"] == cgroups.host().mode
    assert result.evidence()["limits"]["mode"] == cgroups.host().mode
    monkeypatch.setattr(cgroups, "host", lambda: cgroups.Host("rlimits", reason="no cgroup here"))
    bare = await run_command(["/bin/true"], "/", timeout_s=60, cell=spec)
    assert bare.passed and bare.limits["mode"] == "rlimits" and bare.limits["mode_reason"] == "no cgroup here"


needs_cgroups = pytest.mark.skipif(cells.bubblewrap() is None or __import__(
    "ledger.sandbox.cgroups", fromlist=["host"]).host().mode == "rlimits",
    reason="this host offers no cgroup Ledger may use")


def _cell_cgroups() -> list[Path]:
    from ledger.sandbox import cgroups
    found = []
    for parent in set(cgroups.host().parents.values()):
        found += [p for p in parent.iterdir() if p.name.startswith(f"{cgroups.PREFIX}{os.getpid()}-")
                  and not p.name.endswith("-probe")]
    return found


BOMB = """import os, time
n = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as exc:
    print("refused after", n, exc.errno)
"""
HOG = """import os, time
for _ in range(5):
    if os.fork() == 0:
        block = bytearray(96 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(60)
        os._exit(0)
time.sleep(60)
"""


@needs_cgroups
async def test_a_cgroup_bounds_the_whole_cells_processes_and_memory() -> None:
    """Root workers too (RLIMIT_NPROC does not count root's processes): the
    cell's cgroup bounds its tasks and its memory as a whole."""
    spec = cells.CellSpec(cells.CellPolicy(processes=16, memory_mb=256), (), cwd="/", env=cell_environment())
    bomb = await run_command([sys.executable, "-c", BOMB], "/", timeout_s=60, cell=spec)
    assert "refused after" in bomb.output, bomb.output
    assert int(bomb.output.split()[2]) < 16 and bomb.limits["forks_refused"] >= 1
    # five processes of 96 MiB each: every one within its address space, not the cell within 256 MiB
    hog = await run_command([sys.executable, "-c", HOG], "/", timeout_s=20, cell=spec)
    assert hog.limits["oom_kills"] >= 1, hog.limits
    assert hog.limits["memory_peak_mb"] <= 256 + 1
    assert _cell_cgroups() == []  # removed after each cell


@needs_cgroups
async def test_cpu_time_is_bounded_for_the_whole_cell() -> None:
    spin = "import os\nos.fork()\nwhile True: pass\n"  # two spinning processes
    spec = cells.CellSpec(cells.CellPolicy(cpu_s=1), (), cwd="/", env=cell_environment())
    result = await run_command([sys.executable, "-c", spin], "/", timeout_s=60, cell=spec)
    assert not result.passed and result.duration_s < 30
    assert result.limits.get("exceeded") == "cpu" or "cpu_s" in (result.stopped_by() or ""), result.limits
    assert "cell.cpu_s" in result.describe()


def test_cgroup_mounts_and_memberships_are_read_as_the_kernel_writes_them() -> None:
    from ledger.sandbox import cgroups
    mountinfo = ("30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
                 "31 25 0:27 /docker/abc /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n"
                 "32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
                 "33 25 0:29 / /proc rw - proc proc rw\n")
    mounts = cgroups._mounts(mountinfo)
    assert [(m[0], m[1]) for m in mounts] == [("cgroup", "/sys/fs/cgroup/memory"), ("cgroup", "/sys/fs/cgroup/pids"),
                                              ("cgroup2", "/sys/fs/cgroup/unified")]
    member = cgroups._memberships("4:memory:/process/x\n8:pids:/docker/abc/y\n0::/user.slice\n")
    assert member == {"memory": "/process/x", "pids": "/docker/abc/y", "": "/user.slice"}
    assert cgroups._within("/sys/fs/cgroup/pids", "/docker/abc", member["pids"]) == Path("/sys/fs/cgroup/pids/y")
    assert cgroups._within("/sys/fs/cgroup/memory", "/", member["memory"]) == Path("/sys/fs/cgroup/memory/process/x")
    none = cgroups.detect("33 25 0:29 / /proc rw - proc proc rw\n", "0::/\n")
    assert none.mode == "rlimits" and "no cgroup2" in none.reason and "memory" in none.reason


def test_a_delegated_cgroup2_is_used_from_the_services_parent(tmp_path: Path) -> None:
    """systemd's Delegate=yes with DelegateSubgroup=: the service runs in a
    leaf below the delegated cgroup, which can give its children memory and
    pids; cells go beside the leaf. (A fake hierarchy of plain files: this
    host has no cgroup2 controllers to delegate.)"""
    from ledger.sandbox import cgroups
    root = tmp_path / "unified"
    service = root / "system.slice" / "ledger.service"
    leaf = service / "supervisor"
    leaf.mkdir(parents=True)
    (service / "cgroup.controllers").write_text("cpu memory pids\n")
    (service / "cgroup.subtree_control").write_text("")
    (leaf / "cgroup.controllers").write_text("\n")  # a leaf with processes: nothing for children
    mountinfo = f"40 25 0:30 / {root} rw,nosuid - cgroup2 cgroup2 rw\n"
    found = cgroups.detect(mountinfo, "0::/system.slice/ledger.service/supervisor\n")
    assert (found.mode, found.parents.get("memory")) == ("cgroup2", service), found
    assert (service / "cgroup.subtree_control").read_text() == "+memory +pids"
    # the same without the controllers: no cgroup, and the reason says why
    (service / "cgroup.controllers").write_text("cpu\n")
    none = cgroups.detect(mountinfo, "0::/system.slice/ledger.service/supervisor\n")
    assert none.mode == "rlimits" and "memory and pids not available" in none.reason


def test_a_spec_this_release_stores_is_one_the_previous_release_reads() -> None:
    """Rolling upgrades: 0.2.0's verifiers (their CellPolicy forbids unknown
    keys) keep judging campaigns this release registers, as long as the new
    limits are left at their defaults."""
    from ledger.config import parse_config
    previous = {"sandbox", "network", "allow", "memory_mb", "processes", "file_size_mb", "tmp_mb",
                "read_only", "writable"}  # 0.2.0's cell settings
    config = parse_config({"classes": {"c": {"repository": "/x", "attempt_command": ["true"],
                                             "acceptance": {"commands": [["true"]]}}}})
    assert set(config.classes["c"].registration()["acceptance"]["cell"]) <= previous
    tightened = parse_config({"classes": {"c": {"repository": "/x", "attempt_command": ["true"],
                                                "acceptance": {"commands": [["true"]],
                                                               "cell": {"workspace_mb": 512}}}}})
    assert tightened.classes["c"].registration()["acceptance"]["cell"]["workspace_mb"] == 512
