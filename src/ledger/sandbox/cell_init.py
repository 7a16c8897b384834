"""The first process inside a cell (``ledger.sandbox.cell``): runs the untrusted
command, then reports what it left behind.

Run by Ledger's own interpreter in isolated mode, inside the sandbox, as
``init.py REPORT_FD [--egress SOCKET] -- ARGV...``. It makes itself
undumpable (so the command, which runs as the same user, cannot open
``/proc/<this>/fd`` and forge the report), starts the command with every
descriptor but stdin, stdout and stderr closed, and waits for it. When the
command exits it lists the processes still alive in the cell's PID namespace
-- daemons the command started with ``setsid``, double forks, anything that
meant to outlive it -- writes a short report to ``REPORT_FD`` (``exit <code>``
and a ``left <pid> <hex of its command line>`` line per process still
running), kills them and exits; the namespace dies with it. If the command
kills this process instead, the cell dies at once and the report is missing,
which Ledger records as what it is.

With ``--egress``, it also carries every connection to the cell's
``127.0.0.1:3128`` to the Unix socket ``SOCKET``, where the worker's proxy
decides what may leave (``ledger.sandbox.egress``).

Standard library only: the cell sees none of Ledger's code but this file.
"""

import ctypes
import os
import signal
import socket
import sys
import threading

_PR_SET_DUMPABLE = 4
_EGRESS_PORT = 3128


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(300)
    except OSError:
        return b"?"
    return raw.replace(b"\0", b" ").strip() or b"?"


def _alive(mine: int) -> list[tuple[int, bytes]]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in (1, mine):
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == b"Z":  # a zombie left to PID 1: exited, nothing to stop
            continue
        found.append((pid, _cmdline(pid)))
    return found


def _splice(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            chunk = source.recv(65536)
            if not chunk:
                break
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _forward(listener: socket.socket, path: str) -> None:
    while True:
        try:
            inside, _ = listener.accept()
        except OSError:
            return
        outside = socket.socket(socket.AF_UNIX)
        try:
            outside.connect(path)
        except OSError:
            inside.close()
            outside.close()
            continue
        for a, b in ((inside, outside), (outside, inside)):
            threading.Thread(target=_splice, args=(a, b), daemon=True).start()


def main() -> int:
    report_fd = int(sys.argv[1])
    rest = sys.argv[2:]
    egress = None
    if rest[:1] == ["--egress"]:
        egress, rest = rest[1], rest[2:]
    argv = rest[1:]  # after "--"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    listener = None
    if egress is not None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", _EGRESS_PORT))
        listener.listen(64)
    pid = os.fork()
    if pid == 0:
        try:
            os.closerange(3, 65536)
            # Python ignores these two, and an ignored signal stays ignored
            # across exec: the command gets the defaults any shell would give
            # it, so a write past the cell's file_size_mb kills it (SIGXFSZ)
            # as the limit means, instead of failing like a full disk.
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"cannot run {argv[0]}: {exc.strerror}\n".encode())
            os._exit(127)
    if listener is not None:
        threading.Thread(target=_forward, args=(listener, egress), daemon=True).start()
    _, status = os.waitpid(pid, 0)
    left = _alive(os.getpid())
    for process, _ in left:
        try:
            os.kill(process, signal.SIGKILL)
        except OSError:
            pass
    if os.WIFSIGNALED(status):
        code = -os.WTERMSIG(status)
    else:
        code = os.WEXITSTATUS(status)
    # (no json: importing it costs more than the rest of this process)
    lines = [b"exit %d" % code] + [b"left %d %s" % (p, c.hex().encode()) for p, c in left[:100]]
    os.write(report_fd, b"\n".join(lines) + b"\n")
    os.close(report_fd)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
