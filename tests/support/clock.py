"""The engine's clock in tests: engine.clock.SystemClock read under freezegun, so the
test moves wall-clock time and nothing in the engine waits for it for real."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory

from ralph.engine.clock import SystemClock, Wakeup

START = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


class FrozenClock(SystemClock):
    """SystemClock's now() and monotonic() on freezegun's frozen time; a sleep or a timed
    wait of the engine moves that time on (a wait its wakeup already ended does not)."""

    def __init__(self, frozen: FrozenDateTimeFactory):
        self.frozen = frozen
        self.slept: list[float] = []      # every sleep or timed wait asked of it, in seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)

    def wait(self, wakeup: Wakeup, seconds: float) -> bool:
        if wakeup.wait(0):
            return True
        self.sleep(seconds)
        return False

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.frozen.tick(timedelta(seconds=seconds))

    def advance_to(self, when: datetime) -> None:
        """Move to `when` (never back)."""
        self.advance((when - self.now()).total_seconds())


@contextmanager
def frozen_clock(start: datetime = START) -> Iterator[FrozenClock]:
    """Wall-clock time frozen at `start` in this process (asyncio, pytest's timing of the
    test and subprocess's timeouts keep real time), moved only by the test or by the
    engine's waits on the clock yielded."""
    with freeze_time(start, real_asyncio=True, ignore=["_pytest", "subprocess"]) as frozen:
        yield FrozenClock(frozen)
