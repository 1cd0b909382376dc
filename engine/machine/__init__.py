"""The session machine: a `transitions` Machine built from the table, with its hooks.

On every transition, before the state changes, the row's hooks run as the row's
condition, in order (poll the mailbox, assess, hold for a human): the first one that
returns a decision (a PAUSE or ABORT taken, a timeout policy) stops the transition, and
`fire` returns that decision for the driver to fire instead. After the state changes:
the row's effect, then persist metadata, then record the transition on the bus.
"""
from __future__ import annotations

from typing import Callable

from ralph.session_store import LastTransitionRecord, State
from ralph.states import Next

from .table import ACTIVE, TRANSITIONS, TRIGGERS, Hook, Transition, allowed, rows_for_transitions

__all__ = ["ACTIVE", "TRANSITIONS", "TRIGGERS", "Hook", "SessionMachine", "Transition",
           "allowed", "rows_for_transitions"]

BeforeHook = Callable[[Next], "Next | None"]


class _Model:
    """What `transitions` drives: it sets `state` and adds the trigger methods."""


class SessionMachine:
    def __init__(self, tracker, *, before: dict[Hook, BeforeHook],
                 record: Callable[[LastTransitionRecord], None]):
        from transitions import Machine  # heavy: imported only by the engine
        self._tracker = tracker
        self._before = before
        self._record = record
        self._decision: Next | None = None
        self._model = _Model()
        rows = []
        for t, row in zip(TRANSITIONS, rows_for_transitions()):
            conditions = [] if t.only_if_paused_from is None else [self._paused_from(t)]
            row["conditions"] = conditions + [self._run_before(t)]
            if t.effect is not None:
                row["after"] = [lambda event, effect=t.effect: effect(
                    self._tracker, event.kwargs["next"])]
            rows.append(row)
        Machine(model=self._model, states=[s.value for s in State], transitions=rows,
                initial=tracker.state.value, auto_transitions=False, send_event=True,
                ignore_invalid_triggers=False,
                after_state_change=[self._persist_metadata, self._record_transition])

    @property
    def state(self) -> State:
        return State(self._model.state)

    def fire(self, nxt: Next) -> Next | None:
        """Fire `nxt`; None when done, or the decision a hook took instead (not fired)."""
        self._decision = None
        if self._model.trigger(nxt.trigger.value, next=nxt):
            return None
        return self._decision

    def _paused_from(self, t: Transition):
        def guard(event) -> bool:
            return self._tracker.metadata.orchestrator.previous_state is t.only_if_paused_from
        return guard

    def _run_before(self, t: Transition):
        def condition(event) -> bool:
            nxt = event.kwargs["next"]
            for hook in t.before:
                decision = self._before[hook](nxt)
                if decision is not None:
                    self._decision = decision
                    return False
            return True
        return condition

    def _persist_metadata(self, event) -> None:
        nxt = event.kwargs["next"]
        self._tracker.record_transition(
            State(event.transition.source), State(event.transition.dest), nxt.trigger.value,
            nxt.reason, nxt.signal.name if nxt.signal is not None else None)

    def _record_transition(self, event) -> None:
        self._record(self._tracker.metadata.orchestrator.last_transition)
