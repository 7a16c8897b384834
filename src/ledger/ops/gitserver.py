"""Real git servers on free ports, for tests and drills of fleets whose roles
share nothing but PostgreSQL and a git remote.

* ``GitDaemon`` -- git's own ``git daemon`` with ``receive-pack`` enabled:
  the ``git://`` transport, unauthenticated, as a LAN mirror would run it.
* ``HttpGitServer`` -- git's ``http-backend`` (the smart HTTP protocol) as a
  CGI program behind a small threaded HTTP server that demands basic
  authentication on every request: the authenticated transport. Ledger's
  trusted git reaches it with a credential helper
  (``LEDGER_GIT_CREDENTIAL_HELPER``, see ``ledger.git.hardened_git``);
  ``credential_file`` writes one for a host.

Both serve every bare repository under ``root`` (``bare_repository`` makes
one), listen on ``host`` (loopback by default; the address of a bridge when
the roles run in network namespaces of their own, ``ledger.ops.netns``), keep
their port across ``stop()`` and ``start()`` -- an outage and a recovery at
the same URL -- and count what they served (``requests``, per user for HTTP).

The servers run git with no system or user configuration of the caller's
(a ``HOME`` of their own): what they serve is what the repositories hold.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from ledger.settings import inherited_environment

#: How long a server may take to accept connections after starting.
START_TIMEOUT_S = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _accepting(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def plain_git_environment(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a git that is not Ledger's (a server, a user of the
    remote): no system configuration, ``home`` as its own ``HOME``, no prompt."""
    env = {k: v for k, v in inherited_environment().items() if k in ("PATH", "LANG", "TZ") or k.startswith("LC_")}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
               GIT_TERMINAL_PROMPT="0", GIT_AUTHOR_NAME="User", GIT_AUTHOR_EMAIL="user@localhost",
               GIT_COMMITTER_NAME="User", GIT_COMMITTER_EMAIL="user@localhost")
    env.update(extra or {})
    return env


def _git(cwd: Path, *args: str, env: Mapping[str, str], input: bytes | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env=dict(env), input=input, capture_output=True,
                          timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip()


def bare_repository(root: Path, name: str, files: Mapping[str, str], *, branch: str = "main") -> Path:
    """A bare repository ``root/name`` whose ``branch`` holds one commit of
    ``files``; returns its path. Built by plumbing (no work tree, no hooks)."""
    path = root / name
    scratch = Path(tempfile.mkdtemp(prefix="ledger-gitserver-"))
    try:
        env = plain_git_environment(scratch)
        _git(root, "init", "--quiet", "--bare", "--template=", "-b", branch, str(path), env=env)
        index = {**env, "GIT_INDEX_FILE": str(scratch / "index")}
        for file, text in sorted(files.items()):
            blob = _git(path, "hash-object", "-w", "--stdin", env=env, input=text.encode())
            _git(path, "update-index", "--add", "--cacheinfo", f"100644,{blob},{file}", env=index)
        tree = _git(path, "write-tree", env=index)
        commit = _git(path, "commit-tree", tree, "-m", "start", env=env)
        _git(path, "update-ref", f"refs/heads/{branch}", commit, env=env)
        # A reflog of every ref, so a test can count how often the branch moved.
        _git(path, "config", "core.logAllRefUpdates", "always", env=env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return path


def push_change(url: str, files: Mapping[str, str], message: str, *, branch: str = "main",
                credentials: Path | None = None) -> str:
    """What a user does: clone ``url``, change ``files`` on ``branch``, commit
    and push (with the credential file ``credentials`` for an authenticated
    remote); returns the pushed commit."""
    scratch = Path(tempfile.mkdtemp(prefix="ledger-user-"))
    try:
        env = plain_git_environment(scratch)
        helper = ["-c", f"credential.helper=store --file={credentials}"] if credentials else []
        _git(scratch, *helper, "clone", "--quiet", "--branch", branch, "--", url, "work", env=env)
        work = scratch / "work"
        for file, text in files.items():
            (work / file).parent.mkdir(parents=True, exist_ok=True)
            (work / file).write_text(text)
        _git(work, "add", "--all", env=env)
        _git(work, "commit", "--quiet", "--no-verify", "-m", message, env=env)
        _git(work, *helper, "push", "--quiet", "origin", f"HEAD:refs/heads/{branch}", env=env)
        return _git(work, "rev-parse", "HEAD", env=env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def credential_file(path: Path, url: str, user: str, password: str) -> Path:
    """A ``git credential-store`` file holding ``user``'s password for the
    host of ``url`` (readable by its owner only); returns ``path``."""
    parts = urlsplit(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{parts.scheme}://{user}:{password}@{parts.netloc}\n")
    return path


class GitServer:
    """What both servers share: a root of bare repositories, a host and a
    port that survives a restart, and a count of what was served."""

    scheme = ""

    def __init__(self, root: Path, *, host: str = "127.0.0.1", port: int | None = None):
        self.root = root
        self.host = host
        self.port = port or free_port(host)
        self.requests: Counter[str] = Counter()
        self._home = Path(tempfile.mkdtemp(prefix="ledger-gitserver-home-"))

    def url(self, name: str) -> str:
        """The URL of repository ``name`` under the root."""
        return f"{self.scheme}://{self.host}:{self.port}/{name}"

    @property
    def running(self) -> bool:
        """Whether it accepts connections now."""
        return _accepting(self.host, self.port)

    def start(self) -> GitServer:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop for good."""
        self.stop()
        shutil.rmtree(self._home, ignore_errors=True)

    def __enter__(self) -> GitServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _until_accepting(self, alive: object) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _accepting(self.host, self.port):
            if not alive() or time.monotonic() > deadline:  # type: ignore[operator]
                raise RuntimeError(f"the {self.scheme} server did not start on {self.host}:{self.port}"
                                   + self._why())
            time.sleep(0.02)  # nothing signals that a server started listening

    def _why(self) -> str:
        return ""


class GitDaemon(GitServer):
    """``git daemon --enable=receive-pack`` over ``root`` (``git://``)."""

    scheme = "git"

    def __init__(self, root: Path, *, host: str = "127.0.0.1", port: int | None = None):
        super().__init__(root, host=host, port=port)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = self._home / "daemon.log"

    def start(self) -> GitDaemon:
        """Start serving (again, on the same port)."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        argv = ["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
                "--informative-errors", f"--base-path={self.root}", f"--listen={self.host}",
                f"--port={self.port}", "--verbose", str(self.root)]
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with self._log.open("ab") as log:
                self._proc = subprocess.Popen(argv, cwd=self.root, env=plain_git_environment(self._home),
                                              stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True)
            try:
                self._until_accepting(lambda: self._proc is not None and self._proc.poll() is None)
                return self
            except RuntimeError:
                self.stop()
                if time.monotonic() > deadline:  # the port may still be held by the last one's children
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop serving: the listener and every connection it was serving."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # Its own process group: the daemon and the upload-/receive-packs it forked.
        try:
            os.killpg(proc.pid, 15)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        try:
            os.killpg(proc.pid, 9)  # children still finishing a transfer
        except ProcessLookupError:
            pass

    def _why(self) -> str:
        try:
            tail = self._log.read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            tail = []
        return (": " + " | ".join(tail)) if tail else ""


class HttpGitServer(GitServer):
    """git's ``http-backend`` behind basic authentication (``http://``):
    every request must carry ``user``'s ``password``; a request without it
    is answered 401 (and counted as ``unauthenticated``)."""

    scheme = "http"

    def __init__(self, root: Path, *, user: str = "ledger", password: str | None = None,
                 host: str = "127.0.0.1", port: int | None = None):
        super().__init__(root, host=host, port=port)
        self.user = user
        self.password = password or base64.b32encode(os.urandom(10)).decode().lower()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> HttpGitServer:
        """Start serving (again, on the same port)."""
        if self._httpd is not None:
            return self
        server = self
        expected = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._serve()

            def do_POST(self) -> None:  # noqa: N802
                self._serve()

            def _serve(self) -> None:
                if self.headers.get("Authorization") != expected:
                    server._count("unauthenticated")
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="ledger-test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                server._count(server.user)
                body = self._body()
                path, _, query = self.path.partition("?")
                env = plain_git_environment(server._home, {
                    "GIT_PROJECT_ROOT": str(server.root), "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": server.user,
                    "REMOTE_ADDR": self.client_address[0], "SERVER_PROTOCOL": "HTTP/1.0",
                    "GATEWAY_INTERFACE": "CGI/1.1",
                })
                if self.headers.get("Content-Encoding"):
                    env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
                if self.headers.get("Git-Protocol"):
                    env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
                done = subprocess.run(["git", "http-backend"], env=env, input=body,
                                      capture_output=True, timeout=120)
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = done.stdout.partition(b"\n\n")
                status, headers = 200, []
                for line in head.decode("latin-1").splitlines():
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                httpd = Server((self.host, self.port), Handler)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)  # the port is still held by the last listener
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="git-http", daemon=True)
        self._thread.start()
        self._until_accepting(lambda: self._thread is not None and self._thread.is_alive())
        return self

    def stop(self) -> None:
        """Stop serving: no more connections are accepted."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def credentials(self, path: Path, user: str | None = None, password: str | None = None) -> Path:
        """A credential-store file for this server (its own user and password
        unless told otherwise)."""
        return credential_file(path, self.url(""), user or self.user, password or self.password)

    def _count(self, who: str) -> None:
        with self._lock:
            self.requests[who] += 1
