"""What each trigger does to the session once the state has changed (the table's
`effect` column). Each takes the Tracker and the Next that was fired."""
from __future__ import annotations

from session_store import PauseKind, Status, progress


def next_iteration(tracker, nxt) -> None:
    tracker.metadata.iteration += 1
    tracker.metadata.batch = 1
    observed = tracker.metadata.fallback  # the assessor's counters are per iteration
    observed.gates_passed = observed.gates_failed = observed.blockers_in_iteration = 0
    observed.errors, observed.error_unit = 0, None


def next_batch(tracker, nxt) -> None:
    tracker.metadata.batch += 1


def pause(tracker, nxt) -> None:
    o = tracker.metadata.orchestrator
    o.pause_reason = nxt.reason
    o.pause_kind = nxt.kind or PauseKind.SIGNAL
    tracker.metadata.status = Status.PAUSED
    if nxt.signal is not None:
        # [/] tasks stay as they are (they run again on resume), with a note
        tracker.mark_in_progress(progress.IN_PROGRESS, "Paused by signal")


def resume(tracker, nxt) -> None:
    o = tracker.metadata.orchestrator
    o.pause_reason = o.pause_kind = None
    tracker.metadata.status = Status.ACTIVE
    # the operator looked at it: failures from before the pause are not a streak to report
    tracker.metadata.fallback.errors = 0


def complete(tracker, nxt) -> None:
    tracker.metadata.status = Status.COMPLETED
    tracker.metadata.completed_at = tracker.clock.now()


def abort(tracker, nxt) -> None:
    """Seed 001 §3.4: [/] tasks become [F], the iteration gets completed_at; nothing is
    reverted."""
    tracker.mark_in_progress(progress.FAILED, "Aborted by signal")
    tracker.finish_iteration()
    tracker.metadata.status = Status.ABORTED
    tracker.metadata.completed_at = tracker.clock.now()
