"""What a state's work sees: a small typed context, and the values it returns.

Every call that may be preempted (a PAUSE or ABORT taken from the mailbox, a limit, a
human's timeout policy) returns a `Next` instead of raising: the state returns it as is.
"""
from __future__ import annotations

import enum
from datetime import datetime
from typing import Callable, NamedTuple, Protocol

from session_store import (Iteration, IterationMetadata, PauseKind, PlannedTask,
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


class StateContext(Protocol):
    """The engine, as the states see it."""

    @property
    def metadata(self) -> SessionMetadata:
        """The session's truth (read it; the engine changes it)."""

    def now(self) -> datetime: ...

    def say(self, text: str) -> None: ...

    # --- the current iteration ---

    def iteration(self) -> tuple[Iteration, IterationMetadata]: ...

    def save_iteration(self, meta: IterationMetadata) -> None: ...

    def earlier_iteration(self, number: int) -> tuple[Iteration, IterationMetadata] | None:
        """An earlier iteration (its leftovers): None if it never started."""

    def tasks(self) -> list[progress.TaskLine]: ...

    def marker(self, task_id: str) -> str: ...

    def set_marker(self, task_id: str, marker: str, note: str | None = None) -> None: ...

    def record_plan(self, tasks: list[PlannedTask]) -> None:
        """The plan's files, then planning_completed_at: the commit point of planning."""

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
