"""COMPLETE: write the session's summary (once)."""
from __future__ import annotations

from .context import StateContext


def run(ctx: StateContext) -> None:
    ctx.close()
    m = ctx.metadata
    ctx.say(f"session {m.session_id} {m.status.value}: {m.tasks.completed}/{m.tasks.total} "
            f"tasks done, {m.tasks.failed} failed")
