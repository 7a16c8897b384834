"""Which commands are services: each declares it (``service_command``), and
the host (``ledger.runtime.host``) acts on the declaration.

A command invoked as a service gets the host's clean stop while it starts
(``stop_cleanly_while_starting``): a SIGTERM before the host runs exits 0.
Whether it is one is read from the command's own declaration and the
parameters click parsed -- never from a second reading of argv. This module is
imported by the command line at start-up, so it imports nothing; the host is
imported when a service command is invoked (it will run it anyway).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
#: The attribute ``service_command`` marks a command with: (when, unless).
SERVICE = "__ledger_service__"


def is_service(command: Callable[..., Any], params: Mapping[str, Any]) -> bool:
    """Whether ``command`` invoked with ``params`` (its parameters by name) runs
    as a service: it is declared one (``service_command``), the parameter it
    needs is given and the one that makes it one-shot is not."""
    declared: tuple[str | None, str | None] | None = getattr(command, SERVICE, None)
    if declared is None:
        return False
    when, unless = declared
    return ((when is None or params.get(when) not in (None, False))
            and (unless is None or params.get(unless) in (None, False)))


def service_command(*, when: str | None = None, unless: str | None = None) -> Callable[[F], F]:
    """Declare a command a long-running service (run by the host until
    SIGTERM) -- only when its parameter ``when`` is given, and not when
    ``unless`` is (``verifier --once`` is one-shot)."""
    def declare(command: F) -> F:
        @functools.wraps(command)
        def invoked(*args: Any, **params: Any) -> Any:
            if is_service(invoked, params):
                from ledger.runtime.host import stop_cleanly_while_starting

                stop_cleanly_while_starting()
            return command(*args, **params)

        setattr(invoked, SERVICE, (when, unless))
        return invoked  # type: ignore[return-value]
    return declare
