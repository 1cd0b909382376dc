"""COMPLETE: write the session's summary (once)."""
from __future__ import annotations

from .context import StateContext


def run(ctx: StateContext) -> None:
    ctx.close()
    m = ctx.metadata
    ctx.say(f"session {m.session_id} {m.status.value}: {m.tasks.completed}/{m.tasks.total} "
            f"tasks done, {m.tasks.failed} failed")
    if m.git is not None:
        back = m.git.started_from or m.git.base[:12]
        ctx.say(f"its commits are on branch {m.git.branch}: to keep them, `git switch {back}"
                f" && git merge {m.git.branch}`; `ralph session clean {m.session_id}` removes "
                f"the branch")
