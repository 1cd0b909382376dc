"""The Engine in-process: every role played by one in-process agent, on a clock the test
moves, its console kept in a buffer.

    session = new_session(workspace, clock=clock)       # support/sessions.py
    agent = RecordingAgent([...])                       # support/recording.py
    engine = engine_for(session, agent, clock=clock)    # Engine(session, Config(),
    code = engine.run()                                 #   agent_for=lambda role: agent, ...)
"""
from __future__ import annotations

import io

import yaml

from engine.config import Config, parse
from engine.driver import Engine
from session_store import Session

from .clock import FakeClock


def config(data: dict | None = None) -> Config:
    """A Config from a ralph.yml document, checked as `ralph validate` checks one."""
    return parse(yaml.safe_dump(data), "ralph.yml") if data else Config()


class InProcessEngine(Engine):
    """The Engine, but a wait for a deadline (a question's hold, a knowledge timeout)
    moves a fake clock there at once instead of sleeping."""

    def wait_until(self, deadline) -> None:
        if isinstance(self.clock, FakeClock):
            self.clock.advance_to(deadline)
            self.wakeup.clear()
        else:
            super().wait_until(deadline)


def engine_for(session: Session, agent, *, clock=None, config: Config | None = None,
               out=None) -> Engine:
    """An Engine whose every role is played by `agent` (an object with
    `.run(inv, wakeup, should_stop) -> Outcome`), on `clock` (a FakeClock by default)."""
    return InProcessEngine(session, config or Config(), agent_for=lambda role: agent,
                           clock=clock or FakeClock(),
                           out=out if out is not None else io.StringIO())
