"""The Engine in-process: every role played by one in-process agent, on the clock the test
moves (support/clock.py: freezegun's time, which the engine's waits move instead of
waiting it out), its console kept in a buffer.

    session = new_session(workspace, clock=clock)       # support/sessions.py
    agent = RecordingAgent([...])                       # support/recording.py
    engine = engine_for(session, agent, clock=clock)    # Engine(session, Config(),
    code = engine.run()                                 #   agent_for=lambda role: agent, ...)

    with held_run(session, "executor") as env:          # a real engine in a thread, the
        ralph("emit", "note", env=env)                  # executor's run held open: tools
                                                        # with `env` are heard as that run
"""
from __future__ import annotations

import io
import threading
from contextlib import contextmanager

import yaml

from ralph.engine.config import Config, parse
from ralph.engine.driver import Engine
from ralph.session_store import Session


def config(data: dict | None = None) -> Config:
    """A Config from a ralph.yml document, checked as `ralph validate` checks one."""
    return parse(yaml.safe_dump(data), "ralph.yml") if data else Config()


def engine_for(session: Session, agent, *, clock, config: Config | None = None,
               out=None) -> Engine:
    """An Engine whose every role is played by `agent` (an object with
    `.run(inv, wakeup, should_stop) -> Outcome`), on `clock` (the `clock` fixture's: its
    waits move the frozen time instead of waiting it out)."""
    return Engine(session, config or Config(), agent_for=lambda role: agent, clock=clock,
                           out=out if out is not None else io.StringIO())


class _Held:
    """An in-process agent: every role succeeds at once (recording.SUCCESS), but the first
    run of `role`, which stays open until released, answering on each wakeup what tools
    started with its environment send (the engine's own should_stop: the outbox drained,
    questions served, the mailbox heard), as the engine does for a CLI's run."""

    def __init__(self, role: str):
        self.role = role
        self.env: dict | None = None
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self, inv, wakeup, should_stop):
        from ralph.engine.agents import Outcome
        from ralph.engine.tools.emit import publish

        from .recording import SUCCESS
        if inv.role == self.role and not self.started.is_set():
            self.env = dict(inv.env)
            self.started.set()
            while not self.release.is_set():
                wakeup.wait(0.05)
                wakeup.clear()
                stopped = should_stop()
                if stopped:
                    return Outcome(exit_code=None, stopped=stopped)
        for topic, payload in ([("plan.ready", {"tasks": [{"id": "t1", "title": "T"}]})]
                               if inv.role == "planner" and inv.env["RALPH_ITERATION"] == "1"
                               else SUCCESS.get(inv.role, [])):
            publish(inv.env["RALPH_SESSION_DIR"], topic, payload, run=inv.env["RALPH_RUN_ID"])
        should_stop()
        return Outcome(exit_code=0)


@contextmanager
def held_run(session: Session, role: str = "executor", config: Config | None = None):
    """A real engine (in a thread, on the system clock) running `session` with its run of
    `role` held open: yields that run's environment (RALPH_SESSION_DIR, RALPH_RUN_ID, ...),
    with which `ralph emit`, `tools`, `mcp` are heard as that run. On leaving, the run
    ends and the session goes on to its end."""
    agent = _Held(role)
    engine = Engine(session, config or Config(), agent_for=lambda r: agent, out=io.StringIO())
    thread = threading.Thread(target=engine.run, name="held-run-engine", daemon=True)
    thread.start()
    if not agent.started.wait(30):
        raise AssertionError(f"the {role}'s run did not start")
    try:
        yield agent.env
    finally:
        agent.release.set()
        engine.wakeup.set()
        thread.join(60)
