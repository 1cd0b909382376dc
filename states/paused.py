"""PAUSED: nothing runs; the session waits, resumable, for `ralph session resume`."""
from __future__ import annotations

from ralph.session_store import PauseKind

from .context import StateContext


def run(ctx: StateContext) -> None:
    o = ctx.metadata.orchestrator
    ctx.say(f"paused in {o.previous_state}: {o.pause_reason}")
    ctx.say(f"resume with: {ctx.resume_command()}"
            + (" --max-iterations N (or --max-runtime S / --max-cost USD)"
               if o.pause_kind is PauseKind.LIMIT else ""))
