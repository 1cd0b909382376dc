"""Pacing by the agent CLIs' usage windows (limits.quota): a subscriber's 5-hour and
weekly windows are shared with the human's own work, so the loop stops starting runs past
a threshold and leaves the rest to them.

  observe  each run's output is read for its windows (the preset's `quota`: Claude Code's
           rate_limit_event); a window whose reading changed is recorded for the run's own
           account (never one the output names: a run speaks only for its account), for
           every session on it (the store's verbs: the state directory, or the fleet's
           database), with a `quota.observed` event and the run's share in points
  blocking past `pause_at_percent` (per window, at most 100 - reserve_percent) of a window
           that has not reset yet, no new run starts: the engine waits for the reset, the
           same durable wait as a hard limit's (engine/policy/limits.py); with `spread`, a window
           is also not spent faster than its time passes

What an agent printed is untrusted: the presets clamp percents and drop implausible
resets; here a reading is only ever about the account of the run that printed it.
"""
from __future__ import annotations

import getpass
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from ralph.session_store import QuotaReading, check_account

from ..agents.preset import QuotaSeen
from ..config import AgentConfig
from ..config_types import Quota
from ..quota_view import describe_reading

LENGTHS = {"five_hour": timedelta(hours=5), "seven_day": timedelta(days=7),
           "seven_day_opus": timedelta(days=7), "seven_day_sonnet": timedelta(days=7)}


def account_of(agent: AgentConfig) -> str:
    """agent.account, else one per CLI and user ("claude-alice")."""
    if agent.account:
        return agent.account
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    return check_account(f"{agent.backend.value}-{re.sub(r'[^A-Za-z0-9._@+-]', '_', user)}"
                         [:64])


def describe(r: QuotaReading) -> str:
    return describe_reading(r.window, r.percent, r.resets_at)


def threshold(quota: Quota, window: str) -> float:
    at = quota.pause_at_percent
    return min(at.get(window, at.get("all", 90.0)), 100.0 - quota.reserve_percent)


@dataclass(frozen=True, slots=True)
class Block:
    """Why no new run starts now, and until when."""
    reading: QuotaReading
    threshold: float
    until: datetime
    spread: bool = False    # held back by `spread`, not by the threshold

    def words(self) -> str:
        if self.spread:
            return f"{describe(self.reading)}: ahead of an even spread of {self.threshold:g} % " \
                   f"over the window (limits.quota.spread)"
        return f"{describe(self.reading)}: past limits.quota.pause_at_percent " \
               f"{self.threshold:g} %"


def blocking(readings: dict[str, QuotaReading], quota: Quota, now: datetime) -> Block | None:
    """The window that holds runs back now (the one that resets last, if several)."""
    found: list[Block] = []
    for r in readings.values():
        if r.resets_at is None or r.resets_at <= now:
            continue   # reset since (or never said): the window is no reason to wait
        limit = threshold(quota, r.window)
        if r.percent >= limit:
            found.append(Block(r, limit, r.resets_at))
        elif quota.spread and r.window in LENGTHS:
            # spent evenly, `limit` % is used up at the reset: this share is due by then
            length = LENGTHS[r.window]
            due = r.resets_at - length + length * (r.percent / limit)
            if due > now + timedelta(seconds=1):
                found.append(Block(r, limit, min(due, r.resets_at), spread=True))
    return max(found, key=lambda b: b.until) if found else None


def readings_of(seen: tuple[QuotaSeen, ...], agent: str, session: str,
                now: datetime) -> list[QuotaReading]:
    return [QuotaReading(window=s.window, percent=s.percent, resets_at=s.resets_at,
                         seen_at=now, agent=agent, session=session) for s in seen]


def changed(known: QuotaReading | None, new: QuotaReading) -> bool:
    return known is None or (known.percent, known.resets_at) != (new.percent, new.resets_at)


def share(known: QuotaReading | None, new: QuotaReading) -> float:
    """The points a run took of a window: the rise since the last reading of the same
    window period (a window that reset meanwhile: all it reads now)."""
    if known is None or known.resets_at != new.resets_at:
        return 0.0 if known is None else new.percent
    return max(0.0, round(new.percent - known.percent, 1))
