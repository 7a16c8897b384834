"""Typer options made from knobs (``ledger.settings``): each option's names,
variable, default, range and help come from its one declaration.

A value out of its knob's range stops the command with one line naming the
option and its variable, and exit 2 (``InvalidInput``) -- not with click's
usage block -- whether it came from the command line or the environment.
"""

from __future__ import annotations

from typing import Any

import typer

from ledger.errors import InvalidInput
from ledger.settings import KNOBS, SETTINGS, Knob

_UNSET: Any = object()


def in_range(knob: Knob, value: Any) -> Any:
    """``value`` (each item of a list) if it is in ``knob``'s range, else ``InvalidInput``."""
    for item in value if isinstance(value, (list, tuple)) else [value]:
        why = knob.out_of_range(item)
        if why is not None:
            raise InvalidInput(f"{knob.option}: {why}")
    return value


def option(name: str, *, default: Any = _UNSET) -> Any:
    """The typer option of the knob ``name``. A setting's option has no
    default of its own (``None``: ``Settings`` then reads the variable and
    applies the knob's default); ``default`` overrides the knob's for one
    command (``ledger mcp`` logs less), and the help says so."""
    knob = KNOBS[name]
    if not knob.flags:
        raise ValueError(f"knob {name} has no option")
    if name in SETTINGS:
        value = None
    elif default is not _UNSET:
        value = default
    elif knob.default_factory is not None:
        value = knob.default_factory()
    else:
        value = knob.default
    return typer.Option(value, *knob.flags, envvar=knob.envvar, show_envvar=True,
                        help=knob.help + (f" Range: {knob.range_text()}." if knob.range_text() else ""),
                        metavar=knob.metavar,
                        # a lambda: typer inspects each callback's signature at every
                        # start-up, and one without annotations is the cheapest to inspect
                        callback=(lambda value: in_range(knob, value)) if knob.range_text()
                        else None)
