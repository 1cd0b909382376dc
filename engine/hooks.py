"""Machine-level hooks: small named functions run, in this order, on every transition.

Before the state changes: poll the mailbox, hold while a human question is pending.
After it changes: apply the trigger's effect on the session, persist metadata, record
the transition on the bus. Each receives transitions' EventData; `event.model` is the
Engine.
"""
from __future__ import annotations

from session_store import LastTransitionRecord, PauseKind, Status
from states import State


STOPS = ("pause", "abort")  # these take effect at once: no polling, no holding before them


def poll_signals(event) -> None:
    """Consume the mailbox; a PAUSE or ABORT taken here wins over the requested trigger."""
    if event.event.name not in STOPS:
        event.model.poll_signals(requested=event.event.name)


def assess_confidence(event) -> None:
    """Weigh the confidence factors; a fallback trigger asks the human (held next)."""
    if event.event.name not in STOPS + ("resume",):
        event.model.assess_confidence()


def hold_for_human(event) -> None:
    """Wait while a blocking human question is pending (answered or timed out first)."""
    if event.event.name not in STOPS:
        event.model.hold_for_human()


# --- effects of each trigger on the session, applied once the state has changed ---

def _start_next_iteration(engine, event) -> None:
    engine.metadata.iteration += 1
    engine.metadata.batch = 1
    observed = engine.metadata.fallback  # the assessor's counters are per iteration
    observed.gates_passed = observed.gates_failed = observed.blockers_in_iteration = 0
    observed.errors = 0


def _next_batch(engine, event) -> None:
    engine.metadata.batch += 1


def _pause(engine, event) -> None:
    o = engine.metadata.orchestrator
    o.pause_reason = event.kwargs.get("reason")
    o.pause_kind = event.kwargs.get("kind", PauseKind.SIGNAL)
    engine.metadata.status = Status.PAUSED
    if event.kwargs.get("signal") is not None:
        engine.note_in_progress("Paused by signal")


def _resume(engine, event) -> None:
    o = engine.metadata.orchestrator
    o.pause_reason = o.pause_kind = None
    engine.metadata.status = Status.ACTIVE


def _objective_met(engine, event) -> None:
    engine.metadata.status = Status.COMPLETED
    engine.metadata.completed_at = engine.clock.now()


def _abort(engine, event) -> None:
    engine.abort_cleanup()
    engine.metadata.status = Status.ABORTED
    engine.metadata.completed_at = engine.clock.now()


EFFECTS = {
    "next_iteration": _start_next_iteration,
    "next_batch": _next_batch,
    "pause": _pause,
    "resume": _resume,
    "objective_met": _objective_met,
    "abort": _abort,
}


def apply_effects(event) -> None:
    effect = EFFECTS.get(event.event.name)
    if effect:
        effect(event.model, event)


def persist_metadata(event) -> None:
    engine = event.model
    o = engine.metadata.orchestrator
    o.previous_state = State(event.transition.source)
    o.state = State(event.transition.dest)
    o.transitions += 1
    signal = event.kwargs.get("signal")
    if signal is not None:
        o.last_signal = signal.name
    o.last_transition = LastTransitionRecord(
        n=o.transitions, trigger=event.event.name, source=o.previous_state, dest=o.state,
        reason=event.kwargs.get("reason"), at=engine.clock.now())
    engine.save()


def record_transition(event) -> None:
    event.model.record_transition(event.model.metadata.orchestrator.last_transition)


BEFORE_STATE_CHANGE = (poll_signals, assess_confidence, hold_for_human)
AFTER_STATE_CHANGE = (apply_effects, persist_metadata, record_transition)
