"""The session machine, defined once, as data: DESIGN §5's table.

Each row carries what the trigger means beyond its states: the hooks that run before
the state changes (none for pause and abort, which take effect at once) and its effect on
the session once the state has changed. The `transitions` Machine, the diagrams and the
docs are built from TRANSITIONS.
"""
from __future__ import annotations

import enum
from typing import Callable, NamedTuple

from ralph.session_store import State
from ralph.states import Trigger

from . import effects

ACTIVE = (State.PLANNING, State.EXECUTING_BATCH, State.REVIEWING_BATCH,
          State.KNOWLEDGE_APPROVAL)


class Hook(enum.Enum):
    """What runs before the state changes, in this order."""
    POLL = "poll the mailbox (a PAUSE or ABORT taken wins over the trigger)"
    POLL_RESUME = "poll the mailbox; a PAUSE that waited while paused is void"
    ASSESS = "assess confidence (a fallback trigger asks a human)"
    HOLD = "hold while a blocking human question is pending"


EVERY = (Hook.POLL, Hook.ASSESS, Hook.HOLD)
AT_ONCE = ()   # pause and abort: no polling, no holding before them


class Transition(NamedTuple):
    trigger: Trigger
    sources: tuple[State, ...]
    dest: State
    when: str
    before: tuple[Hook, ...] = EVERY
    effect: Callable | None = None      # effect(tracker, next) once the state changed
    # resume goes back to where the session paused from: one row per state, guarded.
    only_if_paused_from: State | None = None

    @property
    def preempts(self) -> bool:
        """Takes effect at once, over whatever was under way."""
        return self.before == AT_ONCE


TRANSITIONS: tuple[Transition, ...] = (
    Transition(Trigger.PLAN_READY, (State.PLANNING,), State.EXECUTING_BATCH,
               "the planner defined at least one task"),
    Transition(Trigger.OBJECTIVE_MET, (State.PLANNING,), State.COMPLETE,
               "the planner says nothing is left (LOOP_COMPLETE)", effect=effects.complete),
    Transition(Trigger.BATCH_DONE, (State.EXECUTING_BATCH,), State.REVIEWING_BATCH,
               "every task of the batch is [x] or [F]"),
    Transition(Trigger.NEXT_BATCH, (State.REVIEWING_BATCH,), State.EXECUTING_BATCH,
               "the plan has another batch", effect=effects.next_batch),
    Transition(Trigger.ITERATION_REVIEWED, (State.REVIEWING_BATCH,), State.KNOWLEDGE_APPROVAL,
               "all batches reviewed and knowledge is staged"),
    Transition(Trigger.NEXT_ITERATION, (State.REVIEWING_BATCH, State.KNOWLEDGE_APPROVAL),
               State.PLANNING, "iteration over: replan (iteration + 1)",
               effect=effects.next_iteration),
    Transition(Trigger.PAUSE, ACTIVE, State.PAUSED,
               "PAUSE signal, limit reached, unanswered question, repeated blocker",
               before=AT_ONCE, effect=effects.pause),
    *(Transition(Trigger.RESUME, (State.PAUSED,), s, "ralph session resume",
                 before=(Hook.POLL_RESUME, Hook.HOLD), effect=effects.resume,
                 only_if_paused_from=s)
      for s in ACTIVE),
    Transition(Trigger.ABORT, tuple(s for s in State if s is not State.COMPLETE), State.COMPLETE,
               "ABORT signal (status aborted)", before=AT_ONCE, effect=effects.abort),
)

TRIGGERS: tuple[Trigger, ...] = tuple(dict.fromkeys(t.trigger for t in TRANSITIONS))


def allowed(state: State, trigger: str) -> bool:
    return any(t.trigger == trigger and state in t.sources for t in TRANSITIONS)


def rows_for_transitions() -> list[dict]:
    """The table in the form `transitions` takes (no guards: the diagrams use it too)."""
    return [{"trigger": t.trigger.value, "source": [s.value for s in t.sources],
             "dest": t.dest.value} for t in TRANSITIONS]
