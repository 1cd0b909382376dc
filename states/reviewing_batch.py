"""REVIEWING_BATCH: the Reviewer reviews each completed task of the batch; after the
last batch the Librarian stages what the iteration learned.

`review.done` is gated (it needs `tests: pass` and `build: pass`); `review.rejected`
sends the task, with the reason, to the next iteration's planning. A review of what is
not code (docs, a design) says the same with seed 002's quality report instead:
`verify.passed` (gated: tests, lint, audit pass, coverage >= 80, mutation >= 70,
complexity <= 10; a failing one comes back as verify.failed, to retry) approves, and the
reviewer's own `verify.failed` rejects. A review is the commit
point of a review: on resume, tasks with one are skipped.
"""
from __future__ import annotations

from ralph.session_store import progress

from .context import Next, StateContext, Trigger


def run(ctx: StateContext) -> Next:
    it = ctx.iteration()
    batch = ctx.metadata.batch
    for task in it.tasks_of_batch(batch):
        if it.has_review(task.id):
            continue
        if ctx.marker(task.id) != progress.DONE:
            ctx.record_review(task, "not reviewed", "the task did not complete")
            continue
        verdict = ctx.run_until_outcome(
            "reviewer", task,
            [{"topic": "review.request", "payload": {"id": task.id, "title": task.title,
                                                     "report": it.latest_report(task.id)}}],
            done=("review.done", "verify.passed"), failed=("review.rejected", "verify.failed"),
            blocked="review.blocked")
        if isinstance(verdict, Next):
            return verdict
        if verdict.kind == "done":
            ctx.record_review(task, "approved", verdict.event["payload"])
        else:
            ctx.record_review(task, "rejected", verdict.reason)
        if stop := ctx.checkpoint():
            return stop
    if batch < max(it.batches()):
        return Next(Trigger.NEXT_BATCH, f"batch {batch} reviewed")
    if not it.librarian_done:
        ran = ctx.run_role("librarian")
        if isinstance(ran, Next):
            return ran
        ctx.record_librarian_done()
    if it.knowledge_staged:
        return Next(Trigger.ITERATION_REVIEWED,
                    f"knowledge staged: {', '.join(it.staged_knowledge())}")
    ctx.finish_iteration()   # with librarian_done: one write
    return Next(Trigger.NEXT_ITERATION, "iteration reviewed, no knowledge staged")
