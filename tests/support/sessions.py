"""Sessions in-process: a session created by the store in a temporary workspace, at the
start of the clock the test moves (support/clock.py). conftest registers the fixtures
`workspace`, `clock` and `session` from here for every test.

An engine over such a session, played by an in-process agent, is in engines.py.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ralph.session_store import Limits, Session, create

from .clock import START, FrozenClock, frozen_clock


def new_session(workspace, objective: str = "in-process objective", sid: str = "s1", *,
                clock=None, limits: Limits | None = None) -> Session:
    """A new session of `workspace`, created by the store as `ralph session start` does."""
    now = clock.now() if clock is not None else START
    return create(str(workspace), objective, now=now, session_id=sid, limits=limits)


@pytest.fixture
def workspace(tmp_path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def clock() -> Iterator[FrozenClock]:
    """The engine's clock, frozen (freezegun) at START for the test, which moves it."""
    with frozen_clock() as frozen:
        yield frozen


@pytest.fixture
def session(workspace) -> Session:
    """A new session ("s1") of the test's workspace, created at START (the clock's start;
    the session alone freezes nothing)."""
    return new_session(workspace)
