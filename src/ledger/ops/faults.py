"""Named fault points, for drills and tests that must stop a process at an
exact step (say, after a git update and before recording it).

A runtime calls ``await faults.point("dispatcher.after_action")`` where such a
step is. Nothing happens unless ``LEDGER_FAULT_POINTS`` names that point; then
the process writes ``<LEDGER_FAULT_DIR>/<point>.reached`` (so the test can wait
for that file, not sleep) and hangs there until it is killed.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
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
