"""EXECUTING_BATCH: the Executor runs each task of the current batch, one after another
(or, with event_loop.parallel, up to N at once: the context runs them).

A task is marked [/] before its runs and [x] or [F] after (data of the store's; progress.md
is their view); a task found [/] on resume was interrupted and runs again. In a git
workspace a done task is committed before its [x]. Each attempt is recorded (its outcome
lets a resumed session keep counting blocked and empty runs). `build.done` is gated: without
passing evidence it comes back as `build.blocked`. Signals are polled between tasks. A
batch in which every task failed pauses the session.
"""
from __future__ import annotations

from ralph.session_store import PauseKind, progress

from .context import Next, RoleRun, StateContext, Streaks, Trigger


def run(ctx: StateContext) -> Next:
    it = ctx.iteration()
    batch = ctx.metadata.batch
    todo = [t for t in it.tasks_of_batch(batch) if ctx.marker(t.id) not in progress.FINISHED]
    if stop := ctx.run_tasks(todo, execute):
        return stop
    tasks = [t for t in ctx.tasks() if t.batch == batch]
    done = sum(t.marker == progress.DONE for t in tasks)
    if done == 0 and batch not in it.failed_batches:
        ctx.record_batch_failed(batch)
        reasons = "; ".join(f"{t.id}: {t.note}" for t in tasks)
        return Next(Trigger.PAUSE, f"every task of batch {batch} failed ({reasons})",
                    PauseKind.FAILURE)
    return Next(Trigger.BATCH_DONE, f"batch {batch}: {done} done, {len(tasks) - done} failed")


def execute(ctx: StateContext, task) -> Next | None:
    """One task: [/], the executor until an outcome, then accepted or [F]."""
    ctx.set_marker(task.id, progress.IN_PROGRESS)

    def record(ran: RoleRun, outcome: str) -> None:
        ctx.record_attempt(task, ran, outcome)

    verdict = ctx.run_until_outcome(
        "executor", task,
        [{"topic": "task.start", "payload": {"id": task.id, "title": task.title,
                                             "description": task.description}}],
        done=("build.done",), failed=("task.failed",), blocked="build.blocked",
        streaks=streaks(ctx.iteration().attempt_outcomes(task.id)), after_each=record)
    if isinstance(verdict, Next):
        return verdict
    if verdict.kind == "done":
        return ctx.accept_task(task)
    ctx.set_marker(task.id, progress.FAILED, verdict.reason)
    return None


def streaks(outcomes: tuple[str, ...]) -> Streaks:
    """Consecutive blocked and empty attempts at the end of a task's attempts."""
    blocked = empty = 0
    for outcome in reversed(outcomes):
        if outcome == "blocked" and not empty:
            blocked += 1
        elif outcome == "empty" and not blocked:
            empty += 1
        else:
            break
    return Streaks(blocked, empty)
