"""The engine's clock, injected so tests can move wall-clock time (freezegun) freely.

Deadlines (a question's, a knowledge approval's) are instants of the wall clock, kept on
disk in UTC. A wait for one sleeps at most CHECK_SECONDS at a time and then reads the
wall clock again, so when the clock is stepped (NTP, a suspended machine waking up) a
deadline is never lost: stepped forward past it, it fires within CHECK_SECONDS of the
step; stepped back, it fires when the wall clock reaches it again (later by the step).
It never fires before the wall clock says so.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol


CHECK_SECONDS = 30.0   # the longest a wait sleeps before it reads the wall clock again


def until(deadline: datetime, now: datetime) -> float:
    """Seconds to sleep toward `deadline`: none once it has passed, at most CHECK_SECONDS."""
    return max(0.0, min((deadline - now).total_seconds(), CHECK_SECONDS))


class Wakeup(Protocol):
    """What the engine's timed waits wait on (a threading.Event, the lanes' Wakeups)."""

    def wait(self, timeout: float | None = None) -> bool: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, wakeup: Wakeup, seconds: float) -> bool:
        """Wait up to `seconds` for `wakeup` (the watcher's): True if it was set. Every
        timed wait of the engine (a deadline, a limit's reset, a cooldown) waits here, so
        a test clock can pass the time instead."""
        return wakeup.wait(seconds)
