"""Sessions in-process: a session created by the store in a temporary workspace, at the
time of a clock the test moves. Light (the store only): conftest registers the fixtures
`workspace`, `clock` and `session` from here for every test.

An engine over such a session, played by an in-process agent, is in engines.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from session_store import Limits, Session, create

from .clock import FakeClock


def new_session(workspace, objective: str = "in-process objective", sid: str = "s1", *,
                clock=None, limits: Limits | None = None) -> Session:
    """A new session of `workspace`, created by the store as `ralph session start` does."""
    now = (clock or FakeClock()).now()
    return create(str(workspace), objective, now=now, session_id=sid, limits=limits)


@pytest.fixture
def workspace(tmp_path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def session(workspace, clock) -> Session:
    """A new session ("s1") of the test's workspace, created at the fake clock's now."""
    return new_session(workspace, clock=clock)
