"""KNOWLEDGE_APPROVAL: decide what happens to the knowledge the Librarian staged.

`knowledge.approval`: auto promotes at once, skip keeps it staged, required waits for
an APPROVE or SKIP signal, or the timeout, which carries it forward to the next
iteration. The decision (iteration metadata `knowledge_decision`) is the commit point.
"""
from __future__ import annotations

from datetime import timedelta

from .context import Next, StateContext, Trigger


def run(ctx: StateContext) -> Next:
    it = ctx.iteration()
    approval, timeout = ctx.knowledge_policy()
    if it.knowledge_decision is None:
        if approval == "auto":
            ctx.promote_knowledge("knowledge.approval: auto")
        elif approval == "skip":
            ctx.keep_knowledge()
        elif stop := _await_decision(ctx, timeout):
            return stop
    elif approval == "required":
        # decided by a signal, then a crash cut the poll that took it short: what waited
        # behind it (another APPROVE or SKIP for this iteration) is taken now, as that
        # poll would have (with no effect), rather than left for a later iteration
        if stop := ctx.take_decision_signals():
            return stop
    ctx.finish_iteration()
    return Next(Trigger.NEXT_ITERATION, f"knowledge {it.knowledge_decision}")


def _await_decision(ctx: StateContext, timeout: float) -> Next | None:
    """Wait for APPROVE or SKIP; at the deadline (kept across restarts) carry it forward."""
    it = ctx.iteration()
    if it.knowledge_deadline is None:
        ctx.set_knowledge_deadline(ctx.now() + timedelta(seconds=timeout))
    deadline = it.knowledge_deadline
    ctx.say(f"knowledge staged in iteration {it.number}: waiting for "
            f"`ralph signal approve` or `ralph signal skip` until "
            f"{deadline.isoformat(timespec='seconds')}")
    while True:
        if stop := ctx.take_decision_signals():
            return stop
        if it.knowledge_decision is not None:
            return None
        if ctx.now() >= deadline:
            ctx.carry_knowledge()
            return None
        ctx.wait_until(deadline)
