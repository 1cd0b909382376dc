"""A clock the test moves (engine/clock.py's interface): nothing sleeps for real."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

START = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


class FakeClock:
    """now(), monotonic() and sleep() of engine.clock.SystemClock; time moves only when
    the test (or something sleeping on it) moves it."""

    def __init__(self, start: datetime = START):
        self._now = start
        self._mono = 1000.0
        self.slept: list[float] = []      # every sleep asked of it, in seconds

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds

    def advance_to(self, when: datetime) -> None:
        """Move to `when` (never back)."""
        self.advance((when - self._now).total_seconds())
