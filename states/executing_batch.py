"""EXECUTING_BATCH: the Executor runs each task of the current batch, one after another.

A task is marked [/] before its runs and [x] or [F] after, in progress.md; a task found
[/] on resume was interrupted and runs again. Each attempt leaves a report, whose
outcome line also lets a resumed session keep counting blocked and empty runs.
`build.done` is gated: without passing evidence it comes back as `build.blocked`.
Signals are polled between tasks. A batch in which every task failed pauses the session.
"""
from __future__ import annotations

import re

from engine import fallback
from engine.attempts import Streaks, run_until_outcome
from engine.driver_types import Next
from session_store import PauseKind, progress

_OUTCOME = re.compile(r"^- outcome: (\w+)", re.MULTILINE)


def run(engine) -> Next:
    it, meta = engine.iteration()
    batch = engine.metadata.batch
    for task in meta.tasks_of_batch(batch):
        if engine.marker(task.id) in progress.FINISHED:
            continue
        fallback.check_in(engine, task)  # collaborative mode asks before each task
        engine.hold_for_human()
        engine.set_marker(task.id, progress.IN_PROGRESS)
        verdict = run_until_outcome(
            engine, "executor", task,
            [{"topic": "task.start", "payload": {"id": task.id, "title": task.title,
                                                 "description": task.description}}],
            done=("build.done",), failed=("task.failed",), blocked="build.blocked",
            streaks=_streaks(it, task.id),
            after_each=lambda ran, attempt, task=task: it.write_report(
                task.id, _report(task, ran, attempt)))
        if verdict.kind == "done":
            engine.set_marker(task.id, progress.DONE)
        else:
            engine.set_marker(task.id, progress.FAILED, verdict.reason)
        engine.checkpoint()
    tasks = [t for t in engine.tasks() if t.batch == batch]
    done = sum(t.marker == progress.DONE for t in tasks)
    if done == 0 and batch not in meta.failed_batches:
        meta.failed_batches.append(batch)
        engine.save_iteration(meta)
        reasons = "; ".join(f"{t.id}: {t.note}" for t in tasks)
        return Next("pause", f"every task of batch {batch} failed ({reasons})", PauseKind.FAILURE)
    return Next("batch_done", f"batch {batch}: {done} done, {len(tasks) - done} failed")


def _streaks(it, task_id: str) -> Streaks:
    """Consecutive blocked and empty attempts at the end of this task's reports."""
    outcomes = []
    attempt = 1
    while (path := it.report_path(task_id, attempt)) is not None:
        with open(path, encoding="utf-8") as f:
            found = _OUTCOME.search(f.read())
        outcomes.append(found.group(1) if found else "")
        attempt += 1
    blocked = empty = 0
    for outcome in reversed(outcomes):
        if outcome == "blocked" and not empty:
            blocked += 1
        elif outcome == "empty" and not blocked:
            empty += 1
        else:
            break
    return Streaks(blocked, empty)


def _report(task, ran, attempt: str) -> str:
    o = ran.outcome
    events = "\n".join(f"- {e['topic']}: {e['payload']}" for e in ran.events) or "(none)"
    tail = "\n".join(o.stdout.splitlines()[-40:])
    return (f"# Report: {task.id} — {task.title}\n\n"
            f"- outcome: {attempt}\n"
            f"- exit code: {o.exit_code}{' (timed out)' if o.timed_out else ''}\n"
            f"- duration: {o.duration:.2f}s\n\n"
            f"## Events (as gated)\n\n{events}\n\n## Output (last lines)\n\n```\n{tail}\n```\n")
