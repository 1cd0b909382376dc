"""PLANNING: the Planner defines the iteration's tasks, in batches, or says nothing is left.

Planning is done once per iteration: its commit point is the iteration's
`planning_completed_at`, so a resumed session never plans the same iteration twice.
"""
from __future__ import annotations

from ralph.session_store import BadInput, PauseKind, PlannedTask, check_id, progress, structure

from .context import COMPLETION, Next, StateContext, Trigger


def run(ctx: StateContext) -> Next:
    it = ctx.iteration()
    if ctx.role_enabled("questioner") and not it.questioner_done \
            and not it.planning_completed:
        # the Questioner turns what is ambiguous into human questions before the plan
        ran = ctx.run_role("questioner")
        if isinstance(ran, Next):
            return ran
        ctx.record_questioner_done()
    if not it.planning_completed:
        clarified = [{"topic": "human.response", "payload": {"question": q, "answer": a}}
                     for q, a in ctx.human_answers("questioner")]
        verdict = ctx.run_until_outcome("planner", None, _leftovers(ctx) + clarified,
                                        done=("plan.ready", COMPLETION),
                                        blocked="plan.blocked")
        if isinstance(verdict, Next):
            return verdict
        if verdict.kind != "done":
            return Next(Trigger.PAUSE, f"the planner produced no plan: {verdict.reason}",
                        PauseKind.FAILURE)
        if verdict.event["topic"] == COMPLETION:
            ctx.record_nothing_left()
        else:
            try:
                tasks = _tasks_of(verdict.event)
            except BadInput as e:
                return Next(Trigger.PAUSE, f"the planner's plan is unusable: {e}",
                            PauseKind.FAILURE)
            ctx.record_plan(tasks)
    if not it.tasks_defined:
        return Next(Trigger.OBJECTIVE_MET, "the planner says nothing is left")
    tasks, batches = len(it.tasks_defined), len(it.batches())
    return Next(Trigger.PLAN_READY, f"{tasks} task{'s' * (tasks != 1)} in {batches} "
                                    f"batch{'es' * (batches != 1)}")


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


def _leftovers(ctx: StateContext) -> list[dict]:
    """What the previous iteration left for the planner: failed tasks, rejected reviews."""
    number = ctx.iteration().number
    previous = ctx.earlier_iteration(number - 1) if number > 1 else None
    if previous is None:
        return []
    pending = [{"topic": "task.failed", "payload": {"task": t.id, "title": t.title,
                                                    "reason": t.note}}
               for t in previous.progress() if t.marker == progress.FAILED]
    pending += [{"topic": "review.rejected", "payload": {"task": r.task, "reason": r.reason}}
                for r in previous.rejections]
    return pending
