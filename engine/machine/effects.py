"""What each trigger does to the session once the state has changed (the table's
`effect` column). Each takes the Tracker and the Next that was fired, and says what
happened through the tracker's intents (the tracker alone writes the session's metadata;
the transition's save persists it)."""
from __future__ import annotations

from ralph.session_store import PauseKind, Status, progress


def next_iteration(tracker, nxt) -> None:
    tracker.begin_next_iteration()


def next_batch(tracker, nxt) -> None:
    tracker.begin_next_batch()


def pause(tracker, nxt) -> None:
    tracker.set_paused(nxt.reason, nxt.kind or PauseKind.SIGNAL)
    if nxt.signal is not None:
        # [/] tasks stay as they are (they run again on resume), with a note
        tracker.mark_in_progress(progress.IN_PROGRESS, "Paused by signal")


def resume(tracker, nxt) -> None:
    tracker.set_active()


def complete(tracker, nxt) -> None:
    tracker.set_ended(Status.COMPLETED)


def abort(tracker, nxt) -> None:
    """Seed 001 §3.4: [/] tasks become [F], the iteration gets completed_at; nothing is
    reverted."""
    tracker.mark_in_progress(progress.FAILED, "Aborted by signal")
    tracker.finish_iteration()
    tracker.set_ended(Status.ABORTED)
