"""REVIEWING_BATCH: the Reviewer reviews each completed task of the batch; after the
last batch the Librarian stages what the iteration learned.

`review.done` is gated (it needs `tests: pass` and `build: pass`); `review.rejected`
sends the task, with the reason, to the next iteration's planning. A review is the commit
point of a review: on resume, tasks with one are skipped.
"""
from __future__ import annotations

from session_store import Rejection, progress

from .context import Next, StateContext, Trigger


def run(ctx: StateContext) -> Next:
    it, meta = ctx.iteration()
    batch = ctx.metadata.batch
    for task in meta.tasks_of_batch(batch):
        if it.has_review(task.id):
            continue
        if ctx.marker(task.id) != progress.DONE:
            it.write_review(task.id, task.title, "not reviewed", "the task did not complete")
            continue
        verdict = ctx.run_until_outcome(
            "reviewer", task,
            [{"topic": "review.request", "payload": {"id": task.id, "title": task.title,
                                                     "report": it.latest_report(task.id)}}],
            done=("review.done",), failed=("review.rejected",), blocked="review.blocked")
        if isinstance(verdict, Next):
            return verdict
        if verdict.kind == "done":
            it.write_review(task.id, task.title, "approved", verdict.event["payload"])
        else:
            # once per task: a crash between this write and the review (the commit
            # point) reviews the task again, and must not record a second rejection
            meta.rejections = [r for r in meta.rejections if r.task != task.id]
            meta.rejections.append(Rejection(task.id, verdict.reason))
            ctx.save_iteration(meta)
            it.write_review(task.id, task.title, "rejected", verdict.reason)
        if stop := ctx.checkpoint():
            return stop
    if batch < max(meta.batches()):
        return Next(Trigger.NEXT_BATCH, f"batch {batch} reviewed")
    if not meta.librarian_done:
        ran = ctx.run_role("librarian")
        if isinstance(ran, Next):
            return ran
        meta.knowledge_staged = bool(it.knowledge.staged())
        meta.librarian_done = True
        if meta.knowledge_staged:
            ctx.save_iteration(meta)
    if meta.knowledge_staged:
        return Next(Trigger.ITERATION_REVIEWED,
                    f"knowledge staged: {', '.join(it.knowledge.staged())}")
    ctx.finish_iteration()   # with librarian_done: one write
    return Next(Trigger.NEXT_ITERATION, "iteration reviewed, no knowledge staged")
