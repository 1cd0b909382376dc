"""When an agent CLI says its usage limit resets: an instant in epoch seconds, or a time
of day (with or without a date) in a time zone. Whatever is implausible is no reset (the
engine then waits agent.limit_wait_seconds): an agent's output may say anything."""
from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

MAX_AHEAD = timedelta(days=400)   # a reset further than this is garbage: say none
MINUTE = timedelta(minutes=1)
MONTHS = {m: n for n, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug",
                                      "Sep", "Oct", "Nov", "Dec"), 1)}


def aware(now: datetime) -> datetime:
    return now if now.tzinfo is not None else now.astimezone()


def sane(at: datetime, now: datetime) -> datetime | None:
    return at if now - timedelta(days=1) <= at <= now + MAX_AHEAD else None


def epoch(value, now: datetime) -> datetime | None:
    """A reset in epoch seconds, if it is a number near enough to now."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return sane(datetime.fromtimestamp(value, timezone.utc), now)
    except (OverflowError, ValueError, OSError):
        return None


def clock(found: re.Match, zone: str, now: datetime) -> datetime | None:
    """A reset said as a time of day (`h`, `m`, `ap`), with or without a date (`mon`, `day`,
    `year`), in `zone`. Without a date it is the next such time; a minute said is one that
    has begun is its end (the CLIs print no seconds)."""
    try:
        tz = ZoneInfo(zone)
        hour, minute = int(found["h"]), int(found["m"] or 0)
        if not 1 <= hour <= 12:
            return None
        said = time(hour % 12 + (12 if found["ap"].lower() == "pm" else 0), minute)
        local = now.astimezone(tz)
        if found["mon"]:
            day = date(int(found["year"] or local.year), MONTHS[found["mon"]], int(found["day"]))
        else:
            day = local.date()
        at = datetime.combine(day, said, tz)
        if not found["mon"] and at + MINUTE <= now:
            at = datetime.combine(day + timedelta(days=1), said, tz)
    except (KeyError, ValueError, OSError, OverflowError):
        return None
    if at <= now < at + MINUTE:
        at += MINUTE
    return sane(at, now)
