"""Seams: named steps of a service where a drill may stop the process.

A service awaits ``pause(point)`` at such a step (say, after a git update and
before recording it). By default nothing happens. The fault tooling the drills
own (``ledger.ops.faults``) is plugged in from outside: a command installs it
when its environment arms a point (``ledger.cli``), a test passes it to the
service it builds -- so no service depends on fault-injection code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

#: What a service awaits at a seam: given the point's name, return to go on.
Pause = Callable[[str], Awaitable[None]]


async def go_on(point: str) -> None:
    """The seam as it is unless a drill plugs into it: carry on."""
    return None


_installed: Pause = go_on


def install(pause: Pause) -> None:
    """Make ``pause`` what every service of this process built afterwards awaits."""
    global _installed
    _installed = pause


def installed() -> Pause:
    """What a service built now awaits at its seams."""
    return _installed
