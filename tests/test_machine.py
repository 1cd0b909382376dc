"""The table is the machine: exactly the table's (state, trigger) pairs are allowed."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from transitions import MachineError

from ralph.engine.clock import SystemClock
from ralph.engine.machine import ACTIVE, TRANSITIONS, TRIGGERS, Hook, SessionMachine, allowed
from ralph.engine.tracker import Tracker
from ralph.session_store import PauseKind, create
from ralph.states import Next, State, Trigger

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def machine_in(workspace, state: State, paused_from: State | None = None):
    session = create(str(workspace), "table walk", now=NOW, session_id=f"walk-{state.value}")
    session.metadata.orchestrator.state = state
    session.metadata.orchestrator.previous_state = paused_from
    tracker = Tracker(session, SystemClock())
    # the walk checks the machine alone: no mailbox, no human block
    return SessionMachine(tracker, before={h: lambda nxt: None for h in Hook},
                          record=lambda lt: None), tracker


def fire(machine, trigger: str):
    kind = PauseKind.SIGNAL if trigger == "pause" else None
    return machine.fire(Next(Trigger(trigger), "walk", kind))


def test_table_matches_design():
    rows = {(t.trigger, tuple(s.value for s in t.sources), t.dest.value) for t in TRANSITIONS}
    assert ("plan_ready", ("PLANNING",), "EXECUTING_BATCH") in rows
    assert ("objective_met", ("PLANNING",), "COMPLETE") in rows
    assert ("batch_done", ("EXECUTING_BATCH",), "REVIEWING_BATCH") in rows
    assert ("next_batch", ("REVIEWING_BATCH",), "EXECUTING_BATCH") in rows
    assert ("iteration_reviewed", ("REVIEWING_BATCH",), "KNOWLEDGE_APPROVAL") in rows
    assert ("next_iteration", ("REVIEWING_BATCH", "KNOWLEDGE_APPROVAL"), "PLANNING") in rows
    assert ("pause", tuple(s.value for s in ACTIVE), "PAUSED") in rows
    assert {r[2] for r in rows if r[0] == "resume"} == {s.value for s in ACTIVE}
    abort_sources = next(r[1] for r in rows if r[0] == "abort")
    assert set(abort_sources) == {s.value for s in State} - {"COMPLETE"}
    assert set(TRIGGERS) == {"plan_ready", "objective_met", "batch_done", "next_batch",
                             "iteration_reviewed", "next_iteration", "pause", "resume", "abort"}


@pytest.mark.parametrize("state", list(State))
def test_every_state_trigger_pair(tmp_path, state):
    """Fire every trigger from every state on a real engine: allowed iff in the table."""
    for trigger in TRIGGERS:
        machine, tracker = machine_in(
            tmp_path / f"{state.value}-{trigger}", state,
            paused_from=State.EXECUTING_BATCH if state is State.PAUSED else None)
        if allowed(state, trigger):
            fire(machine, trigger)
            expected = next(t.dest for t in TRANSITIONS if t.trigger == trigger
                            and state in t.sources and (t.only_if_paused_from in (None, State.EXECUTING_BATCH)))
            assert machine.state is expected, (state, trigger)
            assert tracker.metadata.orchestrator.state is expected
        else:
            with pytest.raises(MachineError):
                fire(machine, trigger)
            assert machine.state is state


def test_no_auto_transitions(tmp_path):
    machine, _ = machine_in(tmp_path, State.PLANNING)
    assert not any(hasattr(machine._model, f"to_{s.value}") for s in State)


@pytest.mark.parametrize("paused_from", list(ACTIVE))
def test_resume_returns_where_it_paused(tmp_path, paused_from):
    machine, _ = machine_in(tmp_path, State.PAUSED, paused_from=paused_from)
    fire(machine, "resume")
    assert machine.state is paused_from
