"""Bulk operator actions: select by a filter, preview, then act on exactly what was previewed.

One module for every surface (the HTTP API, the dashboard, and the CLI when
it grows a bulk command), so the rule lives in one place:

1. ``select`` pages through what a filter matches *now*, within the states
   the action applies to (abandon: any open state; reopen: exhausted), up to
   a cap, and returns a ``Selection``: the ids and a ``token``, a digest of the
   action, the filter and the ids.
2. The caller shows that preview. To act, it sends back the previewed ids and
   the token (``apply``). The token proves the ids are the ones previewed for
   this action and filter (it is not a secret: it protects against mixing up
   previews, not against an operator, who may act on any campaign one by one).
3. ``apply`` selects again and acts on the previewed ids that *still* match,
   one at a time, and on nothing else. What changed in between is reported,
   never acted on: ids that match now but were not previewed (``not_previewed``)
   and previewed ids that no longer match (``no_longer_matching``).

A bulk action never runs without a filter, and never on more than the cap.
When more campaigns match than the cap, the selection is the most recently
changed ``cap`` of them; a previewed campaign pushed out of that window by
newer changes counts as no longer matching -- left alone, never the reverse.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from .errors import Forbidden, InvalidInput, LedgerError
from .reads import Reads
from .models import OPEN_STATES

Action = Literal["abandon", "reopen"]
#: The states each action applies to.
ACTION_STATES: dict[str, tuple[str, ...]] = {
    "abandon": tuple(OPEN_STATES),  # every open state (the transition table's abandon rows)
    "reopen": ("exhausted",),
}
#: What a campaign acted on became, per action.
DONE: dict[str, str] = {"abandon": "abandoned", "reopen": "reopened"}
DEFAULT_CAP = 1000
MAX_CAP = 10_000
_PAGE = 500


def action_states(action: str) -> tuple[str, ...]:
    """The states ``action`` applies to; ``InvalidInput`` if there is no such action."""
    try:
        return ACTION_STATES[action]
    except KeyError:
        raise InvalidInput(f"no bulk action {action!r} (abandon or reopen)") from None


@dataclass(frozen=True)
class Selector:
    """Which campaigns a bulk action is for; every field narrows (as ``Reads.campaigns``)."""

    states: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    target: str | None = None
    objective_key: str | None = None
    label: str | None = None
    search: str | None = None
    updated_since: datetime | None = None

    def is_empty(self) -> bool:
        """Whether nothing narrows it (a bulk action then refuses)."""
        return not (self.states or self.classes or self.target or self.objective_key
                    or self.label or self.search or self.updated_since)

    def canonical(self) -> str:
        """The selector as canonical JSON (what the token digests)."""
        return json.dumps({"states": sorted(self.states), "classes": sorted(self.classes),
                           "target": self.target, "objective_key": self.objective_key,
                           "label": self.label, "search": self.search,
                           "updated_since": self.updated_since.isoformat()
                           if self.updated_since else None},
                          sort_keys=True, separators=(",", ":"))


def token_of(action: str, selector: Selector, ids: Sequence[int]) -> str:
    """The selection token of ``ids`` previewed for ``action`` under ``selector``."""
    text = f"{action}\n{selector.canonical()}\n{','.join(str(i) for i in sorted(ids))}"
    return "sel1-" + hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Selection:
    """What a filter matched for an action: ids (newest change first) and its token."""

    action: str
    selector: Selector
    ids: tuple[int, ...]
    truncated: bool  # more matched than the cap
    token: str


@dataclass
class Applied:
    """What ``apply`` did: per outcome how many, and what had changed since the preview."""

    action: str
    acted_on: list[int] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    not_previewed: list[int] = field(default_factory=list)
    no_longer_matching: list[int] = field(default_factory=list)
    truncated: bool = False

    @property
    def changed(self) -> bool:
        """Whether what matches differs from what was previewed."""
        return bool(self.not_previewed or self.no_longer_matching)

    def summary(self) -> str:
        """One line for a person."""
        done = ", ".join(f"{n} {what}" for what, n in sorted(self.outcomes.items())) or "nothing"
        parts = [done]
        if self.no_longer_matching:
            parts.append(f"{len(self.no_longer_matching)} previewed no longer matched")
        if self.not_previewed:
            parts.append(f"{len(self.not_previewed)} matching now but not previewed left alone")
        return "; ".join(parts)


async def select(reads: Reads, action: str, selector: Selector,
                 cap: int = DEFAULT_CAP) -> Selection:
    """What ``selector`` matches now for ``action`` (at most ``cap`` ids)."""
    allowed = action_states(action)
    if selector.is_empty():
        raise InvalidInput("a bulk action needs a filter (state, class, target, objective "
                           "key, label, text or updated since): it never acts on everything")
    if not 1 <= cap <= MAX_CAP:
        raise InvalidInput(f"a bulk action takes 1 to {MAX_CAP} campaigns")
    states = [s for s in allowed if not selector.states or s in selector.states]
    ids: list[int] = []
    cursor: tuple[datetime, int] | None = None
    while states and len(ids) <= cap:
        want = min(_PAGE, cap + 1 - len(ids))
        page = await reads.campaigns(
            states=states, classes=list(selector.classes) or None, target=selector.target,
            objective_key=selector.objective_key, label=selector.label,
            search=selector.search, updated_since=selector.updated_since, cursor=cursor,
            limit=want)
        ids.extend(c.id for c in page)
        if len(page) < want:
            break
        cursor = (page[-1].updated_at, page[-1].id)
    kept = tuple(ids[:cap])
    return Selection(action, selector, kept, len(ids) > cap, token_of(action, selector, kept))


async def apply(reads: Reads, action: str, selector: Selector, previewed: Sequence[int],
                token: str, act: Callable[[int], Awaitable[object]],
                cap: int = DEFAULT_CAP) -> Applied:
    """Act (``act(campaign_id)``) on the previewed ids that still match, and on
    nothing else. ``InvalidInput`` if ``token`` is not the preview's of these
    ids under this action and selector; ``Forbidden`` (from ``act``) stops at
    once, since the role may not do this at all; any other refusal of one
    campaign (it moved meanwhile) is counted under its problem slug."""
    previewed_ids = list(dict.fromkeys(int(i) for i in previewed))
    if not previewed_ids:
        raise InvalidInput("nothing was previewed: preview the bulk action first and send "
                           "back its campaign ids and selection token")
    if token != token_of(action, selector, previewed_ids):
        raise InvalidInput("the selection token is not that of these campaign ids for this "
                           "action and filter: preview again")
    now = await select(reads, action, selector, max(cap, len(previewed_ids)))
    matching = set(now.ids)
    wanted = set(previewed_ids)
    result = Applied(action, truncated=now.truncated,
                     not_previewed=[i for i in now.ids if i not in wanted],
                     no_longer_matching=[i for i in previewed_ids if i not in matching])
    for cid in previewed_ids:
        if cid not in matching:
            continue
        try:
            await act(cid)
            outcome = DONE[action]
            result.acted_on.append(cid)
        except Forbidden:
            raise
        except LedgerError as exc:
            outcome = exc.slug  # it moved between this read and the write
        result.outcomes[outcome] = result.outcomes.get(outcome, 0) + 1
    return result
