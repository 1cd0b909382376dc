"""The engine's copy of a session's truth: its metadata and its current iteration (the
iteration's metadata and task markers), kept in memory and persisted through the store.

Every change the engine makes to the session goes through here, so the session's task
counts and usage are always derived the same way before they are written. Metadata is
written at the commit points (every transition, a question, a decision), not after each
agent run: what changes between them (usage, counts derived from the markers) goes into
the next one. The iteration's metadata is written at its own commit points, a marker or
an attempt among them.
"""
from __future__ import annotations

import attrs

from ralph.session_store import (Attempt, FailedRun, InterruptedRun, Iteration, IterationMetadata,
                           LastTransitionRecord, LimitWait, PauseKind, PlannedTask, Rejection,
                           Session, State, Status, progress)


class Tracker:
    def __init__(self, session: Session, clock):
        self.session = session
        self.clock = clock
        self._last_mono = clock.monotonic()
        self._current: tuple[Iteration, IterationMetadata] | None = None
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

    # --- the session's intents: each changes metadata; the caller's commit point saves

    def record_transition(self, source: State, dest: State, trigger: str,
                          reason: str | None, signal: str | None) -> None:
        """The machine changed state: the commit point of a transition (saved here)."""
        o = self.metadata.orchestrator
        o.previous_state, o.state = source, dest
        o.transitions += 1
        if signal is not None:
            o.last_signal = signal
        o.last_transition = LastTransitionRecord(
            n=o.transitions, trigger=trigger, source=source, dest=dest, reason=reason,
            at=self.clock.now())
        self.save()

    def begin_next_iteration(self) -> None:
        self.metadata.iteration += 1
        self.metadata.batch = 1
        observed = self.metadata.fallback  # the assessor's counters are per iteration
        observed.gates_passed = observed.gates_failed = observed.blockers_in_iteration = 0
        observed.errors, observed.error_unit = 0, None

    def begin_next_batch(self) -> None:
        self.metadata.batch += 1

    def set_paused(self, reason: str | None, kind: PauseKind) -> None:
        o = self.metadata.orchestrator
        o.pause_reason, o.pause_kind = reason, kind
        self.metadata.status = Status.PAUSED

    def set_active(self) -> None:
        o = self.metadata.orchestrator
        o.pause_reason = o.pause_kind = None
        self.metadata.status = Status.ACTIVE
        # the operator looked at it: failures from before the pause are no streak to report
        self.metadata.fallback.errors = 0

    def set_ended(self, status: Status) -> None:
        self.metadata.status = status
        self.metadata.completed_at = self.clock.now()

    def set_pending_question(self, qid: str | None) -> None:
        """The question the hold waits for (None: answered or timed out): saved at once,
        so a resume holds for it too."""
        self.metadata.pending_question = qid
        self.save()

    def set_limit_wait(self, wait: LimitWait | None) -> None:
        """A usage limit waited out (None: over); saved at once, so a resume waits too."""
        self.metadata.limit_wait = wait
        self.save()

    def add_usage(self, role: str, input_tokens: int, output_tokens: int, usd: float) -> None:
        """What a run spent; saved with the next commit point."""
        self.metadata.usage.add(role, input_tokens, output_tokens, usd)

    def add_quota_points(self, role: str, task: str | None, window: str,
                         points: float) -> None:
        """A run's share of a usage window; saved with the next commit point."""
        self.metadata.usage.add_quota(role, task, window, points)

    def note_account(self, account: str) -> None:
        """An account the session's agents spend (its windows show in `status`)."""
        if account not in self.metadata.accounts:
            self.metadata.accounts.append(account)
            self.save()

    def count_invocation(self) -> int:
        """A new agent run: its number (it names the run's logs)."""
        self.metadata.usage.agent_invocations += 1
        return self.metadata.usage.agent_invocations

    def set_interrupted(self, run: InterruptedRun | None) -> None:
        """The conversation a run cut short left (a limit, a pause), for its step's next
        run; saved with the next commit point."""
        self.metadata.interrupted = run

    def set_failed_run(self, failed: FailedRun | None) -> None:
        """The last failed agent run (None: its step has since run well); saved at once, so
        `status` and the page say why while the session goes on."""
        if failed != self.metadata.last_failure:
            self.metadata.last_failure = failed
            self.save()

    def _count_tasks(self) -> None:
        _, meta = self._current
        self.metadata.tasks = progress.session_counts(meta.tasks_before, meta.task_lines())

    # --- the current iteration ---

    def iteration(self) -> tuple[Iteration, IterationMetadata]:
        """(Iteration files, its metadata): created on first use, cached while current."""
        number = self.metadata.iteration
        if self._current is None or self._current[0].number != number:
            if self._current is not None:
                self._previous = self._current
            it = self.session.iteration(number)
            if it.exists():
                meta = it.load()
                it.settle(meta)
            else:
                # tasks_before goes with the iteration's first write: the session's counts
                # stand still until its plan, and are persisted by the transition into it
                meta = it.start(self.clock.now(), tasks_before=attrs.evolve(self.metadata.tasks))
            self._current = (it, meta)
            # run numbers name the logs: never reuse one a crash left unrecorded
            usage = self.metadata.usage
            usage.agent_invocations = max(usage.agent_invocations, it.last_run_seq())
        return self._current

    def earlier(self, number: int) -> tuple[Iteration, IterationMetadata] | None:
        """An earlier iteration's files and metadata (None if it never started); the one
        just left is kept in memory."""
        if self._previous is not None and self._previous[0].number == number:
            return self._previous
        it = self.session.iteration(number)
        if not it.exists():
            return None
        meta = it.load()
        it.settle(meta)
        return it, meta

    def tasks(self) -> list[progress.TaskLine]:
        _, meta = self.iteration()
        return meta.task_lines()

    def marker(self, task_id: str) -> str:
        _, meta = self.iteration()
        return meta.task_progress(task_id).marker

    def record_plan(self, tasks: list[PlannedTask]) -> None:
        it, meta = self.iteration()
        it.write_plan(tasks)
        meta.tasks_defined = tasks
        meta.planning_completed_at = self.clock.now()
        it.save(meta)  # the commit point: planning is done once this is on disk

    def record_nothing_left(self) -> None:
        it, meta = self.iteration()
        meta.planning_completed_at = self.clock.now()
        it.save(meta)

    def record_questioner_done(self) -> None:
        it, meta = self.iteration()
        meta.questioner_done = True
        it.save(meta)

    def record_attempt(self, attempt: Attempt) -> None:
        it, meta = self.iteration()
        it.record_attempt(meta, attempt)

    def record_review(self, task: PlannedTask, verdict: str, reason) -> None:
        it, meta = self.iteration()
        if verdict == "rejected":
            # once per task: a crash between this write and the review (the commit
            # point) reviews the task again, and must not record a second rejection
            meta.rejections = [r for r in meta.rejections if r.task != task.id]
            meta.rejections.append(Rejection(task.id, reason))
            it.save(meta)
        it.write_review(task.id, task.title, verdict, reason)

    def record_batch_failed(self, batch: int) -> None:
        it, meta = self.iteration()
        if batch not in meta.failed_batches:
            meta.failed_batches.append(batch)
            it.save(meta)

    def record_librarian_done(self) -> None:
        it, meta = self.iteration()
        meta.knowledge_staged = bool(it.knowledge.staged())
        meta.librarian_done = True
        if meta.knowledge_staged:   # otherwise finish_iteration writes it: one write
            it.save(meta)

    def record_knowledge_decision(self, decision: str, by: str | None) -> None:
        """promoted | skipped | carried, and the APPROVE/SKIP signal that decided (if one
        did): the commit point of KNOWLEDGE_APPROVAL, in one write."""
        it, meta = self.iteration()
        meta.knowledge_decision, meta.knowledge_decided_by = decision, by
        it.save(meta)

    def set_knowledge_deadline(self, deadline) -> None:
        it, meta = self.iteration()
        meta.knowledge_deadline = deadline
        it.save(meta)

    def set_marker(self, task_id: str, marker: str, note: str | None = None) -> None:
        """The iteration's metadata is the truth of markers (progress.md its view)."""
        it, meta = self.iteration()
        it.set_markers(meta, [task_id], marker, note)
        if marker == progress.DONE:
            for observer in self.on_task_done:
                observer()

    def mark_in_progress(self, marker: str, note: str) -> None:
        """What becomes of [/] tasks when the session stops: [F] on abort, a note on pause."""
        it, meta = self.iteration()
        changed = [t.id for t in meta.task_lines() if t.marker == progress.IN_PROGRESS]
        if changed:
            it.set_markers(meta, changed, marker, note)

    def finish_iteration(self) -> None:
        it, meta = self.iteration()
        if meta.completed_at is None:
            meta.completed_at = self.clock.now()
            it.save(meta)

    def status_line(self, activity: str) -> str:
        tasks = self._current[1].task_lines() if self._current else []
        finished = sum(t.marker in progress.FINISHED for t in tasks)
        return (f"{self.state} · iteration {self.metadata.iteration} · task {finished} of "
                f"{len(tasks)} done{' · ' + activity if activity else ''}")
