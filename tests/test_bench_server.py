"""A benchmark on the embedded default stops its server however the run ends
(bench/harness.py ``server``): the embedded library stops it only from an
``atexit`` hook, which a process ended by SIGTERM never runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).parents[1]
HOLD = """
import time
from bench.harness import server
with server() as url:
    print(url, flush=True)
    time.sleep(120)
"""


def test_a_benchmark_ended_by_a_signal_stops_and_deletes_its_embedded_server() -> None:
    signum = signal.SIGTERM  # (SIGHUP takes the same path; one server start is enough)
    env = {k: v for k, v in os.environ.items() if k != "LEDGER_BENCH_DATABASE_URL"}
    proc = subprocess.Popen([sys.executable, "-c", HOLD], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    pgdata: Path | None = None
    postmaster = None
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url, "the benchmark's server did not start"
        pgdata = Path(str(conninfo_to_dict(url)["host"]))
        postmaster = psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))
        assert postmaster.is_running()
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 128 + signum
        gone, _ = psutil.wait_procs([postmaster], timeout=30)
        assert gone, f"the benchmark's PostgreSQL {postmaster.pid} outlived it"
        assert not pgdata.parent.exists(), "its data directory was left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if postmaster is not None and postmaster.is_running():
            postmaster.send_signal(signal.SIGQUIT)  # the leak this test is about: end it
            psutil.wait_procs([postmaster], timeout=30)
