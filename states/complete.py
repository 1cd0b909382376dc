"""COMPLETE: write the session's summary (once) and its completed_at."""
from __future__ import annotations

import os

from session_store import write_atomic

SUMMARY_FILE = "summary.md"  # written last: until it exists, `resume` finishes the session


def run(engine) -> None:
    m = engine.metadata
    path = os.path.join(engine.session.dir, SUMMARY_FILE)
    if not os.path.exists(path):
        t, u = m.tasks, m.usage
        write_atomic(path, (
            f"# Session {m.session_id}: {m.status.value}\n\n"
            f"Objective: {m.objective}\n\n"
            f"- iterations: {m.iteration}\n"
            f"- tasks: {t.total} ({t.completed} done, {t.failed} failed, {t.pending} pending)\n"
            f"- agent invocations: {u.agent_invocations}\n"
            f"- runtime: {u.runtime_seconds:.1f}s, cost: ${u.cost_usd:.2f}\n"
            f"- created: {m.created_at.isoformat()}\n"
            f"- completed: {m.completed_at.isoformat() if m.completed_at else '-'}\n"), "summary")
    engine.say(f"session {m.session_id} {m.status.value}: {m.tasks.completed}/{m.tasks.total} "
               f"tasks done, {m.tasks.failed} failed")
