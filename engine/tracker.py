"""The engine's copy of a session's truth: its metadata and its current iteration (the
iteration's metadata and task markers), kept in memory and persisted through the store.

Every change the engine makes to the session goes through here, so the session's task
counts and usage are always derived the same way before they are written. Metadata is
written at the commit points (every transition, a question, a decision), not after each
agent run or marker: what changes between them (usage, counts derived from progress.md)
goes into the next one.
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
        self._previous: tuple[Iteration, IterationMetadata] | None = None   # the one before
        self.on_task_done = []   # callables run when a task reaches [x] (the assessor's)

    @property
    def metadata(self):
        return self.session.metadata

    @property
    def state(self) -> State:
        return self.metadata.orchestrator.state

    def tick(self) -> None:
        """Bring usage.runtime_seconds up to now (limits and the assessor read it)."""
        mono = self.clock.monotonic()
        usage = self.metadata.usage
        usage.runtime_seconds = round(usage.runtime_seconds + (mono - self._last_mono), 3)
        self._last_mono = mono

    def rest(self) -> None:
        """The time since the last tick was no work (a usage limit's wait): not counted."""
        self._last_mono = self.clock.monotonic()

    def save(self) -> None:
        """Persist metadata: usage, the session's task counts, a new revision."""
        self.tick()
        if self._current is not None and self._current[0].number == self.metadata.iteration:
            self._count_tasks()
        self.session.save(self.clock.now())

    def _count_tasks(self) -> None:
        _, meta, lines = self._current
        self.metadata.tasks = progress.session_counts(meta.tasks_before, lines)

    # --- the current iteration ---

    def iteration(self) -> tuple[Iteration, IterationMetadata]:
        """(Iteration files, its metadata): created on first use, cached while current."""
        number = self.metadata.iteration
        if self._current is None or self._current[0].number != number:
            if self._current is not None:
                self._previous = self._current[:2]
            it = self.session.iteration(number)
            if it.exists():
                meta = it.load()
                lines = it.rebuild_plan(meta)
            else:
                # tasks_before goes with the iteration's first write: the session's counts
                # stand still until its plan, and are persisted by the transition into it
                meta = it.start(self.clock.now(), tasks_before=attrs.evolve(self.metadata.tasks))
                lines = []
            self._current = (it, meta, lines)
            # run numbers name the logs: never reuse one a crash left unrecorded
            usage = self.metadata.usage
            usage.agent_invocations = max(usage.agent_invocations, it.last_run_seq())
        return self._current[0], self._current[1]

    def earlier(self, number: int) -> tuple[Iteration, IterationMetadata] | None:
        """An earlier iteration's files and metadata (None if it never started); the one
        just left is kept in memory."""
        if self._previous is not None and self._previous[0].number == number:
            return self._previous
        it = self.session.iteration(number)
        return (it, it.load()) if it.exists() else None

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

    def set_marker(self, task_id: str, marker: str, note: str | None = None) -> None:
        """progress.md is the truth of markers; a task in progress needs no fsync (lost to
        a power cut, it is simply run again)."""
        it, _ = self.iteration()
        for t in self.tasks():
            if t.id == task_id:
                t.marker, t.note = marker, note
        it.save_progress(self.tasks(), durable=marker != progress.IN_PROGRESS)
        if marker == progress.DONE:
            for observer in self.on_task_done:
                observer()

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
