"""The board's filter: parsed from the URL or a form, kept in links, handed to
the kernel's reads and to bulk actions."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from fastapi import Request

from ledger import bulk
from ledger.api.dashboard.render import STATES
from ledger.db.bounds import is_ascii_int
from ledger.db.cursors import BIGINT_MAX
from ledger.errors import InvalidInput

_FILTER_TEXT = re.compile(r"^[^\x00]{1,200}$")


@dataclass(frozen=True)
class BoardFilter:
    """What the board is narrowed to; kept in the URL."""

    states: tuple[str, ...] = ()
    class_: str | None = None
    target: str | None = None
    label: str | None = None
    q: str | None = None
    #: campaigns picked one by one (the board's row checkboxes)
    ids: tuple[int, ...] = ()

    @classmethod
    def parse(cls, get: Callable[[str], str | None], get_all: Callable[[str], list[str]]
              ) -> BoardFilter:
        """From query or form fields; ``InvalidInput`` for what cannot be a filter."""
        states = tuple(dict.fromkeys(s for s in get_all("state") if s))
        unknown = [s for s in states if s not in STATES]
        if unknown:
            raise InvalidInput(f"unknown state(s): {', '.join(unknown)}")
        values = {}
        for name in ("class", "target", "label", "q"):
            # ``search`` is the API's name for ``q`` (GET /campaigns?search=): honoured too
            value = (get(name) or (get("search") if name == "q" else None) or "").strip()
            if value and not _FILTER_TEXT.match(value):
                raise InvalidInput(f"{name}: at most 200 characters, no NUL")
            values[name] = value or None
        picked = [i.strip() for i in get_all("id") if i.strip()]
        if len(picked) > bulk.DEFAULT_CAP or not all(is_ascii_int(i) and 1 <= int(i) <= BIGINT_MAX
                                                     for i in picked):
            raise InvalidInput(f"id: up to {bulk.DEFAULT_CAP} campaign ids")
        ids = tuple(dict.fromkeys(int(i) for i in picked))
        return cls(states, values["class"], values["target"], values["label"], values["q"], ids)

    @classmethod
    def from_query(cls, request: Request) -> BoardFilter:
        """From the URL."""
        return cls.parse(request.query_params.get, request.query_params.getlist)

    def is_empty(self) -> bool:
        """Whether nothing narrows the board."""
        return not (self.states or self.class_ or self.target or self.label or self.q or self.ids)

    def pairs(self) -> list[tuple[str, str]]:
        """The filter as query pairs."""
        pairs = [("state", s) for s in self.states]
        pairs += [(k, v) for k, v in (("class", self.class_), ("target", self.target),
                                      ("label", self.label), ("q", self.q)) if v]
        pairs += [("id", str(i)) for i in self.ids]
        return pairs

    def query(self, **extra: str) -> str:
        """The URL query of this filter (plus ``extra``)."""
        return urlencode(self.pairs() + [(k, v) for k, v in extra.items() if v])

    def with_states(self, states: Sequence[str]) -> BoardFilter:
        """The same filter, narrowed to ``states`` (those of it, if it names any)."""
        kept = tuple(s for s in states if not self.states or s in self.states)
        return replace(self, states=kept or tuple(states))

    def describe(self) -> str:
        """The filter in words."""
        words = [f"{k}={v}" for k, v in self.pairs() if k != "id"]
        if self.ids:
            shown = ", ".join(f"#{i}" for i in self.ids[:5]) + (", …" if len(self.ids) > 5 else "")
            words.append(f"{len(self.ids)} picked campaign{'' if len(self.ids) == 1 else 's'} ({shown})")
        return ", ".join(words) or "everything"

    def reads(self, states: Sequence[str] | None = None) -> dict[str, Any]:
        """Keyword arguments of ``Reads.campaigns`` (``states`` overrides)."""
        return {"states": list(states) if states is not None else (list(self.states) or None),
                "classes": [self.class_] if self.class_ else None, "target": self.target,
                "label": self.label, "search": self.q, "ids": list(self.ids) or None}

    def selector(self) -> bulk.Selector:
        """The filter as a bulk action's selector."""
        return bulk.Selector(states=self.states, classes=(self.class_,) if self.class_ else (),
                             target=self.target, label=self.label, search=self.q, ids=self.ids)
