"""Bulk operator actions: select by a filter, preview, then act on exactly what was previewed.

The design at length: docs/internals.md (``ledger.bulk``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from ledger.db.models import OPEN_STATES
from ledger.db.reads import Reads
from ledger.errors import Forbidden, InvalidInput, LedgerError

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
    #: the campaigns picked one by one (rows selected on the board)
    ids: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        """Whether nothing narrows it (a bulk action then refuses)."""
        return not (self.states or self.classes or self.target or self.objective_key
                    or self.label or self.search or self.updated_since or self.ids)

    def canonical(self) -> str:
        """The selector as canonical JSON (what the token digests)."""
        return json.dumps({"states": sorted(self.states), "classes": sorted(self.classes),
                           "target": self.target, "objective_key": self.objective_key,
                           "label": self.label, "search": self.search,
                           "updated_since": self.updated_since.isoformat()
                           if self.updated_since else None,
                           **({"ids": sorted(set(self.ids))} if self.ids else {})},
                          sort_keys=True, separators=(",", ":"))


_TOKEN = re.compile(r"^sel2-([0-9]{10})-([0-9a-f]{64})$")
#: What a selection token looks like (the API's schema says so).
TOKEN_PATTERN = _TOKEN.pattern


def token_of(key: bytes, action: str, selector: Selector, ids: Sequence[int], caller: str,
             expires: int) -> str:
    """The selection token of ``ids`` previewed by ``caller`` for ``action``
    under ``selector``, valid until ``expires`` (Unix seconds)."""
    text = (f"{action}\n{caller}\n{expires}\n{selector.canonical()}\n"
            f"{','.join(str(i) for i in sorted(ids))}")
    mac = hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
    return f"sel2-{expires:010d}-{mac}"


def token_digest(token: str) -> str:
    """What a bulk job records of its token (single use): its SHA-256."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_token(key: bytes, token: str, action: str, selector: Selector, ids: Sequence[int],
                caller: str, now: float | None = None) -> None:
    """``InvalidInput`` unless ``token`` is this caller's unexpired preview of
    exactly ``ids`` for ``action`` under ``selector`` (on this deployment)."""
    found = _TOKEN.match(token or "")
    if found is None:
        raise InvalidInput("the selection token is not one this server issued: preview again")
    expires = int(found.group(1))
    expected = token_of(key, action, selector, ids, caller, expires)
    if not hmac.compare_digest(expected, token):
        raise InvalidInput("the selection token is not that of these campaign ids for this "
                           "action, filter and caller: preview again")
    if (time.time() if now is None else now) > expires:
        raise InvalidInput("the preview has expired: preview again")


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
                 cap: int = DEFAULT_CAP, *, key: bytes, caller: str,
                 ttl_s: float = 900.0) -> Selection:
    """What ``selector`` matches now for ``action`` (at most ``cap`` ids), with
    the token ``caller`` may confirm it with for ``ttl_s``."""
    ids, truncated = await matching(reads, action, selector, cap)
    expires = int(time.time() + ttl_s)
    return Selection(action, selector, ids, truncated,
                     token_of(key, action, selector, ids, caller, expires))


async def matching(reads: Reads, action: str, selector: Selector,
                   cap: int = DEFAULT_CAP) -> tuple[tuple[int, ...], bool]:
    """The ids ``selector`` matches now for ``action`` (at most ``cap``), and
    whether more matched."""
    allowed = action_states(action)
    if selector.is_empty():
        raise InvalidInput("a bulk action needs a filter (state, class, target, objective "
                           "key, label, text, updated since or picked ids): it never acts on "
                           "everything")
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
            limit=want, ids=list(selector.ids) or None)
        ids.extend(c.id for c in page)
        if len(page) < want:
            break
        cursor = (page[-1].updated_at, page[-1].id)
    return tuple(ids[:cap]), len(ids) > cap


@dataclass
class Plan:
    """What confirming a preview will act on, decided before anything is done."""

    action: str
    acting: list[int]
    not_previewed: list[int]
    no_longer_matching: list[int]
    truncated: bool


async def plan(reads: Reads, action: str, selector: Selector, previewed: Sequence[int],
               token: str, *, key: bytes, caller: str, cap: int = DEFAULT_CAP) -> Plan:
    """Check the preview's token, select again, and split the previewed ids into
    those still matching (to act on) and what changed since."""
    previewed_ids = list(dict.fromkeys(int(i) for i in previewed))
    if not previewed_ids:
        raise InvalidInput("nothing was previewed: preview the bulk action first and send "
                           "back its campaign ids and selection token")
    check_token(key, token, action, selector, previewed_ids, caller)
    now, truncated = await matching(reads, action, selector, max(cap, len(previewed_ids)))
    still = set(now)
    wanted = set(previewed_ids)
    return Plan(action, [i for i in previewed_ids if i in still],
                not_previewed=[i for i in now if i not in wanted],
                no_longer_matching=[i for i in previewed_ids if i not in still],
                truncated=truncated)


async def act_on(planned: Plan, act: Callable[[int], Awaitable[object]],
                 record: Callable[[int, str], Awaitable[object]] | None = None) -> Applied:
    """Act (``act(campaign_id)``) on each planned id, one at a time, recording
    each item's outcome (``record``). ``Forbidden`` (from ``act``) stops at once,
    since the role may not do this at all; any other refusal of one campaign
    (it moved meanwhile) is counted under its problem slug."""
    result = Applied(planned.action, truncated=planned.truncated,
                     not_previewed=list(planned.not_previewed),
                     no_longer_matching=list(planned.no_longer_matching))
    for cid in planned.acting:
        try:
            await act(cid)
            outcome = DONE[planned.action]
            result.acted_on.append(cid)
        except Forbidden:
            raise
        except LedgerError as exc:
            outcome = exc.slug  # it moved between this read and the write
        result.outcomes[outcome] = result.outcomes.get(outcome, 0) + 1
        if record is not None:
            await record(cid, outcome)
    return result


async def apply(reads: Reads, action: str, selector: Selector, previewed: Sequence[int],
                token: str, act: Callable[[int], Awaitable[object]],
                cap: int = DEFAULT_CAP, *, key: bytes, caller: str) -> Applied:
    """``plan`` then ``act_on``: act on the previewed ids that still match, and
    on nothing else (the caller records single use; see ``ledger.api``)."""
    planned = await plan(reads, action, selector, previewed, token, key=key, caller=caller,
                         cap=cap)
    return await act_on(planned, act)
