"""What a state's work sees: a small typed context, and the values it returns.

Every call that may be preempted (a PAUSE or ABORT taken from the mailbox, a limit, a
human's timeout policy) returns a `Next` instead of raising: the state returns it as is.
"""
from __future__ import annotations

import enum
from datetime import datetime
from typing import Callable, NamedTuple, Protocol

from ralph.session_store import (Iteration, IterationMetadata, PauseKind, PlannedTask, Rejection,
                           SessionMetadata, progress)

COMPLETION = "LOOP_COMPLETE"   # the planner's "nothing is left" (DESIGN §5 role contract)


class Trigger(str, enum.Enum):
    """The machine's triggers (DESIGN §5); their rows are engine/machine/table.py."""
    PLAN_READY = "plan_ready"
    OBJECTIVE_MET = "objective_met"
    BATCH_DONE = "batch_done"
    NEXT_BATCH = "next_batch"
    ITERATION_REVIEWED = "iteration_reviewed"
    NEXT_ITERATION = "next_iteration"
    PAUSE = "pause"
    RESUME = "resume"
    ABORT = "abort"

    def __str__(self) -> str:
        return self.value


class Next(NamedTuple):
    """The trigger to fire and why."""
    trigger: Trigger
    reason: str | None = None
    kind: PauseKind | None = None   # for pause: why, which decides the exit code
    signal: object | None = None    # the PAUSE/ABORT signal that asked for it


class RoleRun(NamedTuple):
    """One agent run as a state sees it: how the process ended and what it emitted (as
    gated)."""
    role: str
    events: list[dict]
    exit_code: int | None
    timed_out: bool
    duration: float
    output: str          # what it printed (its final answer where the CLI has one)
    stderr_tail: str = ""  # its last stderr line: why a failing CLI failed

    def last(self, *topics: str) -> dict | None:
        return next((e for e in reversed(self.events) if e["topic"] in topics), None)


class Verdict(NamedTuple):
    """How running a role until an outcome ended."""
    kind: str              # done | failed | thrashing | no_progress | timed_out
    event: dict | None     # the outcome event, when there is one
    reason: str | None


class Streaks(NamedTuple):
    """Consecutive blocked and empty attempts so far (kept across a resume)."""
    blocked: int = 0
    empty: int = 0


AfterEach = Callable[[RoleRun, str], None]


class IterationView:
    """An iteration as a state reads it: read-only, its lists as tuples. A state changes
    it only through the context's intents (`record_attempt`, `record_review`, ...), which
    the engine's tracker carries out and persists."""
    __slots__ = ("_files", "_meta")

    def __init__(self, files: Iteration, meta: IterationMetadata):
        self._files, self._meta = files, meta

    @property
    def number(self) -> int:
        return self._files.number

    @property
    def tasks_defined(self) -> tuple[PlannedTask, ...]:
        return tuple(self._meta.tasks_defined)

    @property
    def planning_completed(self) -> bool:
        """Planning's commit point is passed (a plan, or the planner's "nothing left")."""
        return self._meta.planning_completed_at is not None

    @property
    def questioner_done(self) -> bool:
        return self._meta.questioner_done

    @property
    def librarian_done(self) -> bool:
        return self._meta.librarian_done

    @property
    def knowledge_staged(self) -> bool:
        return self._meta.knowledge_staged

    @property
    def knowledge_decision(self) -> str | None:
        return self._meta.knowledge_decision

    @property
    def knowledge_deadline(self) -> datetime | None:
        return self._meta.knowledge_deadline

    @property
    def failed_batches(self) -> tuple[int, ...]:
        return tuple(self._meta.failed_batches)

    @property
    def rejections(self) -> tuple[Rejection, ...]:
        return tuple(self._meta.rejections)

    def batches(self) -> list[int]:
        return self._meta.batches()

    def tasks_of_batch(self, batch: int) -> list[PlannedTask]:
        return self._meta.tasks_of_batch(batch)

    def progress(self) -> list[progress.TaskLine]:
        return self._meta.task_lines()

    def attempt_outcomes(self, task_id: str) -> tuple[str, ...]:
        return tuple(self._meta.task_progress(task_id).attempts)

    def latest_report(self, task_id: str) -> str | None:
        return self._files.latest_report(self._meta, task_id)

    def has_review(self, task_id: str) -> bool:
        return self._files.has_review(task_id)

    def staged_knowledge(self) -> list[str]:
        return self._files.knowledge.staged()


class StateContext(Protocol):
    """The engine, as the states see it."""

    @property
    def metadata(self) -> SessionMetadata:
        """The session's truth (read it; the engine changes it)."""

    def now(self) -> datetime: ...

    def say(self, text: str) -> None: ...

    def resume_command(self) -> str:
        """The command that resumes this session, as the human can run it where they are."""

    # --- the current iteration ---

    def iteration(self) -> IterationView: ...

    def earlier_iteration(self, number: int) -> IterationView | None:
        """An earlier iteration (its leftovers): None if it never started."""

    def tasks(self) -> list[progress.TaskLine]: ...

    def marker(self, task_id: str) -> str: ...

    def set_marker(self, task_id: str, marker: str, note: str | None = None) -> None: ...

    def record_plan(self, tasks: list[PlannedTask]) -> None:
        """The plan's files, then planning_completed_at: the commit point of planning."""

    def record_nothing_left(self) -> None:
        """The planner says nothing is left: planning's commit point, with no tasks."""

    def record_questioner_done(self) -> None: ...

    def record_attempt(self, task: PlannedTask, ran: RoleRun, outcome: str) -> None:
        """One attempt at a task: its report (one per attempt), then its outcome counted."""

    def record_review(self, task: PlannedTask, verdict: str, reason) -> None:
        """approved | rejected | not reviewed: the review is the commit point of a review;
        a rejection (recorded once per task) reaches the next iteration's planning."""

    def record_batch_failed(self, batch: int) -> None:
        """Every task of `batch` failed: the session pauses (once per batch)."""

    def record_librarian_done(self) -> None:
        """The Librarian ran: whether it staged knowledge is now known."""

    def set_knowledge_deadline(self, deadline: datetime) -> None:
        """When an undecided approval carries the knowledge forward (kept across restarts)."""

    def accept_task(self, task: PlannedTask) -> Next | None:
        """A task whose outcome is done: in a git workspace its changes as one commit (a
        crash in between commits nothing twice), then [x] (a parallel batch's lane: [x]
        once its branch is merged, in plan order)."""

    def run_tasks(self, tasks: list[PlannedTask],
                  execute: Callable[["StateContext", PlannedTask], Next | None]) -> Next | None:
        """`execute(ctx, task)` for each task: one after another in plan order, with the
        hold before each and the mailbox after; with event_loop.parallel, up to N at once,
        each on a context of its own (its worktree). The first decision that stops the
        work comes back."""

    def finish_iteration(self) -> None: ...

    # --- agents ---

    def role_enabled(self, role: str) -> bool:
        """The questioner runs only when switched on."""

    def human_answers(self, role: str) -> list[tuple[str, str]]:
        """(question, answer) of the questions `role` asked in this iteration and a human
        answered."""

    def run_role(self, role: str, task: PlannedTask | None = None) -> RoleRun | Next: ...

    def run_until_outcome(self, role: str, task: PlannedTask | None, pending: list[dict], *,
                          done: tuple[str, ...], failed: tuple[str, ...] = (),
                          blocked: str | None = None, streaks: Streaks = Streaks(),
                          after_each: AfterEach | None = None) -> Verdict | Next: ...

    # --- humans and the mailbox ---

    def checkpoint(self) -> Next | None:
        """Between tasks and reviews: take what the mailbox holds."""

    def before_task(self, task: PlannedTask) -> Next | None:
        """A check-in in collaborative mode, and the hold while a question is pending."""

    # --- knowledge (KNOWLEDGE_APPROVAL) ---

    def knowledge_policy(self) -> tuple[str, float]:
        """(approval: auto | required | skip, timeout_seconds)."""

    def promote_knowledge(self, why: str) -> None: ...

    def keep_knowledge(self) -> None: ...

    def carry_knowledge(self) -> None: ...

    def take_decision_signals(self) -> Next | None:
        """Take APPROVE / SKIP (which decide through the knowledge verbs) and the rest."""

    def wait_until(self, deadline: datetime) -> None:
        """Sleep until `deadline` or until something lands in the session."""

    # --- the end ---

    def close(self) -> None:
        """The summary of a finished session (once)."""
