"""The session machine, defined once, as data: DESIGN §5's table.

Everything else (the `transitions` Machine, the diagrams, the docs) is built from
TRANSITIONS. Hooks are attached at the machine level so they run on every transition.
"""
from __future__ import annotations

from typing import NamedTuple

from states import State

ACTIVE = (State.PLANNING, State.EXECUTING_BATCH, State.REVIEWING_BATCH,
          State.KNOWLEDGE_APPROVAL)


class Transition(NamedTuple):
    trigger: str
    sources: tuple[State, ...]
    dest: State
    when: str
    # resume goes back to where the session paused from: one row per state, guarded.
    only_if_paused_from: State | None = None


TRANSITIONS: tuple[Transition, ...] = (
    Transition("plan_ready", (State.PLANNING,), State.EXECUTING_BATCH,
               "the planner defined at least one task"),
    Transition("objective_met", (State.PLANNING,), State.COMPLETE,
               "the planner says nothing is left (LOOP_COMPLETE)"),
    Transition("batch_done", (State.EXECUTING_BATCH,), State.REVIEWING_BATCH,
               "every task of the batch is [x] or [F]"),
    Transition("next_batch", (State.REVIEWING_BATCH,), State.EXECUTING_BATCH,
               "the plan has another batch"),
    Transition("iteration_reviewed", (State.REVIEWING_BATCH,), State.KNOWLEDGE_APPROVAL,
               "all batches reviewed and knowledge is staged"),
    Transition("next_iteration", (State.REVIEWING_BATCH, State.KNOWLEDGE_APPROVAL),
               State.PLANNING, "iteration over: replan (iteration + 1)"),
    Transition("pause", ACTIVE, State.PAUSED,
               "PAUSE signal, limit reached, unanswered question, repeated blocker"),
    *(Transition("resume", (State.PAUSED,), s, "ralph session resume", only_if_paused_from=s)
      for s in ACTIVE),
    Transition("abort", tuple(s for s in State if s is not State.COMPLETE), State.COMPLETE,
               "ABORT signal (status aborted)"),
)

TRIGGERS: tuple[str, ...] = tuple(dict.fromkeys(t.trigger for t in TRANSITIONS))


def allowed(state: State, trigger: str) -> bool:
    return any(t.trigger == trigger and state in t.sources for t in TRANSITIONS)


def rows_for_transitions() -> list[dict]:
    """The table in the form `transitions` takes (no guards: the diagrams use it too)."""
    return [{"trigger": t.trigger, "source": [s.value for s in t.sources], "dest": t.dest.value}
            for t in TRANSITIONS]


def build_machine(model, initial: State, *, before_state_change, after_state_change,
                  paused_from):
    """A `transitions` Machine over `model` with exactly the table's triggers.

    `paused_from(event)` returns the state a PAUSED session came from (resume's guard).
    """
    from transitions import Machine  # heavy: imported only by the engine

    def guard(state):
        return lambda event: paused_from(event) is state

    rows = []
    for t, row in zip(TRANSITIONS, rows_for_transitions()):
        if t.only_if_paused_from is not None:
            row["conditions"] = [guard(t.only_if_paused_from)]
        rows.append(row)
    return Machine(model=model, states=[s.value for s in State], transitions=rows,
                   initial=initial.value, auto_transitions=False, send_event=True,
                   ignore_invalid_triggers=False,
                   before_state_change=list(before_state_change),
                   after_state_change=list(after_state_change))
