"""Named fault points, for drills and tests that must stop a process at an
exact step (say, after a git update and before recording it).

A service awaits its seam (``ledger.runtime.seams``) at such a step; ``point``
is what drills plug into it (``plug_in``, called by the command line, does
where ``LEDGER_FAULT_POINTS`` arms a point). Armed, the process writes
``<LEDGER_FAULT_DIR>/<point>.reached`` (so the test can wait for that file,
not sleep) and hangs there until it is killed.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ledger.runtime import seams
from ledger.settings import environment


def armed(name: str) -> bool:
    """Whether the environment arms fault point ``name``."""
    return name in {p.strip() for p in (environment("fault_points") or "").split(",")}


async def point(name: str) -> None:
    """A fault point: a no-op unless armed; armed, it reports and hangs."""
    if not armed(name):
        return
    directory = Path(environment("fault_dir") or ".")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.reached").write_text(str(os.getpid()))
    await asyncio.Event().wait()  # until SIGKILL


def plug_in() -> None:
    """Make ``point`` the seam of every service this process builds, if the
    environment arms any point (else the seams stay as they are)."""
    if (environment("fault_points") or "").strip():
        seams.install(point)
