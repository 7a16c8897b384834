"""The autonomy report: per day, what the ledger did on its own and what a
human had to do, and the streak of days closed with no human help.

A human action is anything done by the ``operator`` role -- from the HTTP API,
the dashboard or the CLI; to a campaign (its journal) or to a class (pausing
and resuming it: the class's journal, ``ledger.class_event``) -- decided by
the role each journal event records
(``campaign_event.actor_role``), never by the actor's name: a sensor posting
observations through the API with its token is automation, however its
actor is named. (Events journaled before roles were recorded have none and
count as automation.)

A day with no campaign open at any point is *under-exercised*: the system had
nothing to prove, and the report never counts such a day as a success.
"""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel

from ledger.db.reads import Reads

Verdict = Literal["autonomous", "human-assisted", "no-closure", "under-exercised"]


class Day(BaseModel):
    """One UTC day."""

    day: date
    opened: int
    attempts: int
    rejections: int
    verified: int
    confirmed: int
    human_actions: int  # the operator role's actions: transitions, retries, pauses
    exercised: bool

    @property
    def verdict(self) -> Verdict:
        """How the day reads."""
        if not self.exercised:
            return "under-exercised"
        if self.human_actions:
            return "human-assisted"
        return "autonomous" if self.confirmed else "no-closure"


class Report(BaseModel):
    """Days oldest first, and the current streak of autonomous days."""

    days: list[Day]
    streak: int

    def as_json(self) -> dict[str, object]:
        """The report for machines (verdicts included)."""
        return {"streak": self.streak,
                "days": [{**d.model_dump(mode="json"), "verdict": d.verdict} for d in self.days]}


def streak(days: list[Day]) -> int:
    """Consecutive autonomous days up to the latest; today, still in progress,
    does not break the streak until it is over."""
    count = 0
    for i, day in enumerate(reversed(days)):
        if day.verdict == "autonomous":
            count += 1
        elif i == 0 and day.verdict == "no-closure":
            continue
        else:
            break
    return count


async def autonomy_report(reads: Reads, days: int = 7) -> Report:
    """The report over the last ``days`` UTC days (today included)."""
    rows = [Day.model_validate(r) for r in await reads.daily_activity(days)]
    return Report(days=rows, streak=streak(rows))
