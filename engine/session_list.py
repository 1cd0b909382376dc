"""What `ralph session list` shows (and the web page's and Telegram's lists): each
session of the workspace in a line, who waits on a human first."""
from __future__ import annotations

from datetime import datetime, timezone

from ralph.session_store import BadInput, Status, list_ids, load, unstructure

from .safe_text import field, printable
from .views import (age_text, engine_stopped, limit_view, place_view, resume_command, standing,
                    standing_on_disk)


def list_views(workspace: str) -> list[dict]:
    now = datetime.now(timezone.utc)
    views = []
    for sid in list_ids(workspace):
        try:
            session = load(workspace, sid)
        except BadInput as e:
            views.append({"session_id": sid, "error": str(e)})
            continue
        m = session.metadata
        previous = m.orchestrator.previous_state
        pid = session.running_pid()
        status, reason = standing_on_disk(session, pid)
        views.append({
            "session_id": sid, "state": m.orchestrator.state.value, "status": status,
            "previous_state": previous.value if previous else None,
            "running": pid is not None, "engine_stopped": engine_stopped(session, pid),
            "iteration": m.iteration, "pause_reason": reason, **limit_view(m),
            "tasks": unstructure(m.tasks), "usage": unstructure(m.usage),
            "updated_at": m.updated_at.isoformat(),
            "age_seconds": round((now - m.updated_at).total_seconds()),
            "objective": m.objective.splitlines()[0] if m.objective else "",
            "resume_command": resume_command(sid, workspace)
            if pid is None and m.status in (Status.PAUSED, Status.ACTIVE) else None,
            **_human_wait(session, now), **place_view(session)})
    # who waits on a human first (longest wait first), then paused ones, then the rest;
    # newest first within each group
    views.sort(key=lambda v: (not v.get("questions_pending"),
                              -(v.get("oldest_question_age_seconds") or 0),
                              v.get("status") != "paused", v.get("age_seconds", 0)))
    return views


def _human_wait(session, now: datetime) -> dict:
    """How many questions wait on a human, and since when the oldest has waited."""
    pending = session.questions.pending()
    oldest = min((q.asked_at for q in pending), default=None)
    return {"questions_pending": len(pending),
            "oldest_question_asked_at": oldest.isoformat() if oldest else None,
            "oldest_question_age_seconds":
                round((now - oldest).total_seconds()) if oldest else None}


def _waiting_text(v: dict) -> str:
    """"2 questions waiting, the oldest for 5m" ('' when none waits)."""
    n = v.get("questions_pending")
    if not n:
        return ""
    return (f"{n} question{'s' if n > 1 else ''} waiting, the oldest for "
            f"{age_text(v['oldest_question_age_seconds'])}")


def list_text(views: list[dict]) -> str:
    """One line a session under a header, in aligned columns; what else there is to say
    (the engine, where it runs, why it paused or waits) in the last column."""
    if not views:
        return "no sessions"
    width = max(len("SESSION"), *(len(v["session_id"]) for v in views))
    lines = [f"{'SESSION':<{width}}  {'STATUS':<11} {'STATE':<18} {'ITER':>4} {'AGE':>6}  NOTES"]
    for v in views:
        if "error" in v:
            lines.append(f"{v['session_id']:<{width}}  unreadable: {printable(v['error'])}")
            continue
        status, _, state = standing(v).partition(" in ")
        state = state or v["state"]
        notes = [note for note in (
            "engine stopped" if v.get("engine_stopped") else "running" if v["running"] else "",
            f"{field(v['machine'])}:{field(v['workspace'])}" if v.get("machine") else "",
            printable(v["pause_reason"]) if v["pause_reason"] else "",
            printable(v["waiting"]) if v["waiting"] else "",
            _waiting_text(v),
            f"resume: {v['resume_command']}" if status == "interrupted"
            else "") if note]
        lines.append(f"{v['session_id']:<{width}}  {status:<11} {state:<18} "
                     f"{v['iteration']:>4} {age_text(v['age_seconds']):>6}  {'; '.join(notes)}"
                     .rstrip())
    return "\n".join(lines)
