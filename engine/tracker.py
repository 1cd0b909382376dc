"""The engine's copy of a session's truth: its metadata and its current iteration (the
iteration's metadata and task markers), kept in memory and persisted through the store.

Every change the engine makes to the session goes through here, so the session's task
counts and usage are always derived the same way before they are written.
"""
from __future__ import annotations

import attrs

from session_store import (Iteration, IterationMetadata, PlannedTask, Session, State,
                           progress)


class Tracker:
    def __init__(self, session: Session, clock):
        self.session = session
        self.clock = clock
        self._last_mono = clock.monotonic()
        self._current: tuple[Iteration, IterationMetadata, list[progress.TaskLine]] | None = None
        self.on_task_done = []   # callables run when a task reaches [x] (the assessor's)

    @property
    def metadata(self):
        return self.session.metadata

    @property
    def state(self) -> State:
        return self.metadata.orchestrator.state

    def save(self) -> None:
        """Persist metadata: usage, the session's task counts, a new revision."""
        mono = self.clock.monotonic()
        usage = self.metadata.usage
        usage.runtime_seconds = round(usage.runtime_seconds + (mono - self._last_mono), 3)
        self._last_mono = mono
        if self._current is not None and self._current[0].number == self.metadata.iteration:
            self._count_tasks()
        self.session.save(self.clock.now())

    def _count_tasks(self) -> None:
        _, meta, lines = self._current
        counts, before = self.metadata.tasks, meta.tasks_before
        counts.total = before.total + len(lines)
        counts.completed = before.completed + sum(t.marker == progress.DONE for t in lines)
        counts.failed = before.failed + sum(t.marker == progress.FAILED for t in lines)
        counts.pending = before.pending + sum(t.marker not in progress.FINISHED for t in lines)

    # --- the current iteration ---

    def iteration(self) -> tuple[Iteration, IterationMetadata]:
        """(Iteration files, its metadata): created on first use, cached while current."""
        number = self.metadata.iteration
        if self._current is None or self._current[0].number != number:
            it = self.session.iteration(number)
            if it.exists():
                meta = it.load()
            else:
                # tasks_before goes in the creating write: a crash between two writes
                # left an iteration whose session counts restarted from zero
                meta = it.create(self.clock.now(), tasks_before=attrs.evolve(self.metadata.tasks))
            self._current = (it, meta, it.progress())
        return self._current[0], self._current[1]

    def save_iteration(self, meta: IterationMetadata) -> None:
        it, _ = self.iteration()
        it.save(meta)

    def tasks(self) -> list[progress.TaskLine]:
        self.iteration()
        return self._current[2]

    def marker(self, task_id: str) -> str:
        return next((t.marker for t in self.tasks() if t.id == task_id), progress.TODO)

    def record_plan(self, tasks: list[PlannedTask]) -> None:
        it, meta = self.iteration()
        self._current = (it, meta, it.write_plan(tasks))
        meta.tasks_defined = tasks
        meta.planning_completed_at = self.clock.now()
        it.save(meta)  # the commit point: planning is done once this is on disk
        self.save()

    def set_marker(self, task_id: str, marker: str, note: str | None = None) -> None:
        it, _ = self.iteration()
        for t in self.tasks():
            if t.id == task_id:
                t.marker, t.note = marker, note
        it.save_progress(self.tasks())
        if marker == progress.DONE:
            for observer in self.on_task_done:
                observer()
        self.save()

    def mark_in_progress(self, marker: str, note: str) -> None:
        """What becomes of [/] tasks when the session stops: [F] on abort, a note on pause."""
        it, _ = self.iteration()
        changed = [t for t in self.tasks() if t.marker == progress.IN_PROGRESS]
        for t in changed:
            t.marker, t.note = marker, note
        if changed:
            it.save_progress(self.tasks())

    def finish_iteration(self) -> None:
        it, meta = self.iteration()
        if meta.completed_at is None:
            meta.completed_at = self.clock.now()
            it.save(meta)

    def status_line(self, activity: str) -> str:
        tasks = self._current[2] if self._current else []
        finished = sum(t.marker in progress.FINISHED for t in tasks)
        return (f"{self.state} · iteration {self.metadata.iteration} · task {finished} of "
                f"{len(tasks)} done{' · ' + activity if activity else ''}")
