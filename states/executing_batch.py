"""EXECUTING_BATCH: the Executor runs each task of the current batch, one after another.

A task is marked [/] before its run and [x] or [F] after, in progress.md; a task found
[/] on resume was interrupted and runs again. Signals are polled between tasks.
"""
from __future__ import annotations

from engine.driver_types import Next
from session_store import progress


def run(engine) -> Next:
    it, meta = engine.iteration()
    batch = engine.metadata.batch
    for task in meta.tasks_of_batch(batch):
        if engine.marker(task.id) in progress.FINISHED:
            continue
        engine.set_marker(task.id, progress.IN_PROGRESS)
        executed = engine.run_role("executor", task, pending=[
            {"topic": "task.start", "payload": {"id": task.id, "title": task.title,
                                                "description": task.description}}])
        marker, note = _verdict(executed)
        it.write_report(task.id, _report(task, executed, marker, note))
        engine.set_marker(task.id, marker, note)
        engine.checkpoint()
    tasks = [t for t in engine.tasks() if t.batch == batch]
    done = sum(t.marker == progress.DONE for t in tasks)
    return Next("batch_done", f"batch {batch}: {done} done, {len(tasks) - done} failed")


def _verdict(executed) -> tuple[str, str | None]:
    outcome = executed.outcome
    if outcome.timed_out:
        return progress.FAILED, "the executor timed out"
    final = executed.last("build.done", "build.blocked", "task.failed")
    if final is not None and final["topic"] == "build.done":
        return progress.DONE, None
    if final is not None:
        return progress.FAILED, f"{final['topic']}: {final['payload']}"
    if outcome.exit_code:
        return progress.FAILED, f"the executor exited with {outcome.exit_code}"
    return progress.FAILED, "the executor reported no outcome"


def _report(task, executed, marker: str, note: str | None) -> str:
    o = executed.outcome
    events = "\n".join(f"- {e['topic']}: {e['payload']}" for e in executed.events) or "(none)"
    tail = "\n".join(o.stdout.splitlines()[-40:])
    return (f"# Report: {task.id} — {task.title}\n\n"
            f"- result: [{marker}]{' ' + note if note else ''}\n"
            f"- exit code: {o.exit_code}\n- duration: {o.duration:.2f}s\n\n"
            f"## Events\n\n{events}\n\n## Output (last lines)\n\n```\n{tail}\n```\n")
