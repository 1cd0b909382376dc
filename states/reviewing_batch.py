"""REVIEWING_BATCH: the Reviewer judges each task of the batch; once every batch is
reviewed, the Librarian stages what the iteration learned.

`review.done` is gated (it needs `tests: pass` and `build: pass`); `review.rejected`
sends the task, with the reason, to the next iteration's planning. A review file is
the commit point of a review: on resume, tasks with one are skipped.
"""
from __future__ import annotations

import os

from engine.attempts import run_until_outcome
from engine.driver_types import Next
from session_store import Rejection, progress


def run(engine) -> Next:
    it, meta = engine.iteration()
    batch = engine.metadata.batch
    for task in meta.tasks_of_batch(batch):
        if os.path.exists(it.path("reviews", f"{task.id}.md")):
            continue
        if engine.marker(task.id) != progress.DONE:
            _write_review(it, task, "not reviewed", "the task did not complete")
            continue
        verdict = run_until_outcome(
            engine, "reviewer", task,
            [{"topic": "review.request", "payload": {"id": task.id, "title": task.title,
                                                     "report": it.latest_report(task.id)}}],
            done=("review.done",), failed=("review.rejected",), blocked="review.blocked")
        if verdict.kind == "done":
            _write_review(it, task, "approved", verdict.event["payload"])
        else:
            # once per task: a crash between this write and the review file (the commit
            # point) reviews the task again, and must not record a second rejection
            meta.rejections = [r for r in meta.rejections if r.task != task.id]
            meta.rejections.append(Rejection(task.id, verdict.reason))
            engine.save_iteration(meta)
            _write_review(it, task, "rejected", verdict.reason)
        engine.checkpoint()
    if batch < max(meta.batches()):
        return Next("next_batch", f"batch {batch} reviewed")
    if not meta.librarian_done:
        engine.run_role("librarian")
        meta.knowledge_staged = bool(it.staged_knowledge())
        meta.librarian_done = True
        engine.save_iteration(meta)
    if meta.knowledge_staged:
        return Next("iteration_reviewed", f"knowledge staged: {', '.join(it.staged_knowledge())}")
    engine.finish_iteration()
    return Next("next_iteration", "iteration reviewed, no knowledge staged")


def _write_review(it, task, verdict: str, reason) -> None:
    it.write(f"reviews/{task.id}.md",
             f"# Review: {task.id} — {task.title}\n\nverdict: {verdict}\n\n{reason}\n", "review")
