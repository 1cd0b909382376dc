"""PLANNING: the Planner defines the iteration's tasks, in batches, or says nothing is left.

Planning is done once per iteration: its commit point is the iteration's
`planning_completed_at`, so a resumed session never plans the same iteration twice.
"""
from __future__ import annotations

from engine.attempts import run_until_outcome
from engine.driver_types import Next
from engine.gates import COMPLETION
from session_store import BadInput, PauseKind, PlannedTask, check_id, progress, structure


def run(engine) -> Next:
    it, meta = engine.iteration()
    if meta.planning_completed_at is None:
        verdict = run_until_outcome(engine, "planner", None, _leftovers(engine),
                                    done=("plan.ready", COMPLETION))
        if verdict.kind != "done":
            return Next("pause", f"the planner produced no plan: {verdict.reason}",
                        PauseKind.FAILURE)
        if verdict.event["topic"] == COMPLETION:
            meta.planning_completed_at = engine.clock.now()
            engine.save_iteration(meta)
        else:
            try:
                tasks = _tasks_of(verdict.event)
            except BadInput as e:
                return Next("pause", f"the planner's plan is unusable: {e}", PauseKind.FAILURE)
            engine.record_plan(tasks, _plan_text(it.number, tasks))
    if not meta.tasks_defined:
        return Next("objective_met", "the planner says nothing is left")
    return Next("plan_ready", f"{len(meta.tasks_defined)} tasks in {len(meta.batches())} batches")


def _tasks_of(event: dict) -> list[PlannedTask]:
    payload = event["payload"]
    if not isinstance(payload, dict) or not isinstance(payload.get("tasks"), list):
        raise BadInput('plan.ready: $.tasks: expected {"tasks": [{"id", "title", ...}]}')
    tasks = []
    for i, raw in enumerate(payload["tasks"]):
        task = structure(raw, PlannedTask, f"plan.ready $.tasks[{i}]")
        check_id(task.id, f"plan.ready $.tasks[{i}].id")
        if task.batch < 1:
            raise BadInput(f"plan.ready $.tasks[{i}].batch: expected 1 or more")
        tasks.append(task)
    if not tasks:
        raise BadInput("plan.ready $.tasks: expected at least one task")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise BadInput("plan.ready $.tasks: task ids must be unique")
    return sorted(tasks, key=lambda t: t.batch)


def _plan_text(iteration: int, tasks: list[PlannedTask]) -> str:
    lines = [f"# Plan — iteration {iteration}", ""]
    for batch in sorted({t.batch for t in tasks}):
        lines += [f"## Batch {batch}", ""]
        lines += [f"- **{t.id}**: {t.title}" + (f" — {t.description}" if t.description else "")
                  for t in tasks if t.batch == batch]
        lines.append("")
    return "\n".join(lines)


def _leftovers(engine) -> list[dict]:
    """What the previous iteration left for the planner: failed tasks, rejected reviews."""
    number = engine.metadata.iteration - 1
    if number < 1:
        return []
    previous = engine.session.iteration(number)
    if not previous.exists():
        return []
    pending = [{"topic": "task.failed", "payload": {"task": t.id, "title": t.title,
                                                    "reason": t.note}}
               for t in previous.progress() if t.marker == progress.FAILED]
    pending += [{"topic": "review.rejected", "payload": {"task": r.task, "reason": r.reason}}
                for r in previous.load().rejections]
    return pending
