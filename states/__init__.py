"""The six states of a session and the work done in each, one module per state.

A state's `run(ctx)` does its work through the small context of `states.context` and
returns the `Next` trigger to fire. States know the store's data and nothing of the
engine: the engine implements the context.
"""
from ralph.session_store import State

from . import (complete, executing_batch, knowledge_approval, paused, planning,
               reviewing_batch)
from .context import COMPLETION, Next, StateContext, Trigger

WORK = {
    State.PLANNING: planning.run,
    State.EXECUTING_BATCH: executing_batch.run,
    State.REVIEWING_BATCH: reviewing_batch.run,
    State.KNOWLEDGE_APPROVAL: knowledge_approval.run,
    State.PAUSED: paused.run,
    State.COMPLETE: complete.run,
}

__all__ = ["COMPLETION", "Next", "State", "StateContext", "Trigger", "WORK"]
