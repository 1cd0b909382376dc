"""What the page shows, as plain data, read through the store and engine/views.py only.

Every function here is synchronous (file reads): the routes run them in a worker thread.
A session id, question id, iteration or log name from a URL is checked before it reaches
the store, and the store turns only names it lists itself into paths.
"""
from __future__ import annotations

import json
import math

from session_store import BadInput, EventReader, check_id, load, signals, tail_events

from ...diagram import INSTALL_HINT, render, session_path
from ...views import list_views, session_view

LAST_EVENTS = 200          # the events a page starts with; it follows the rest live
LOG_TAIL = 256 * 1024      # bytes of an agent log a page shows (the end of it)


class Problem(Exception):
    """A request that cannot be served: an HTTP status and one line saying why."""

    def __init__(self, status: int, message: str, **extra):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def dumps(data) -> str:
    """JSON a browser parses: a NaN or an infinity an agent put on the bus becomes text."""
    try:
        return json.dumps(data, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(data), ensure_ascii=False, allow_nan=False)


def _finite(data):
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data


def open_session(workspace: str, session_id: str):
    """The session, or a 404 (an id that is no session id never touches the disk)."""
    try:
        return load(workspace, check_id(session_id))
    except BadInput:
        raise Problem(404, f"no session {session_id[:80]!r} in this workspace") from None


def sessions(workspace: str) -> list[dict]:
    return list_views(workspace)


def snapshot(workspace: str, session_id: str) -> dict:
    """Where a session stands (`ralph session status --json`), its scratchpad and the
    guidance waiting for a role's next run."""
    session = open_session(workspace, session_id)
    try:
        view = session_view(workspace, session.id, last_events=0)
    except BadInput as e:
        raise Problem(404, str(e)) from None
    return {"view": view, "scratchpad": session.scratchpad() or "",
            "guidance": signals.guidance(session.dir)}


def first_events(workspace: str, session_id: str) -> tuple[list[dict], EventReader]:
    """The last events, and a reader for every one after them. The reader is placed
    first, so a record appended in between is in both (the page drops repeated seqs)."""
    session = open_session(workspace, session_id)
    reader = session.events_after(None)
    return tail_events(session.dir, LAST_EVENTS), reader


def iterations(workspace: str, session_id: str) -> list[dict]:
    """Each iteration: when it ran, its tasks with their markers, and its agent runs."""
    session = open_session(workspace, session_id)
    found = []
    for number in range(1, session.metadata.iteration + 1):
        it = session.iteration(number)
        if not it.exists():
            continue
        try:
            meta = it.load()
        except BadInput as e:
            found.append({"iteration": number, "error": str(e), "tasks": [], "runs": []})
            continue
        found.append({
            "iteration": number, "started_at": meta.started_at.isoformat(),
            "completed_at": meta.completed_at.isoformat() if meta.completed_at else None,
            "knowledge": meta.knowledge_decision,
            "tasks": [{"id": t.id, "title": t.title, "batch": t.batch, "marker": t.marker,
                       "note": t.note} for t in it.progress()],
            "runs": it.runs()})
    return found


def run_log(workspace: str, session_id: str, number: int, name: str) -> dict:
    session = open_session(workspace, session_id)
    if not 1 <= number <= session.metadata.iteration:
        raise Problem(404, f"session {session.id} has no iteration {number}")
    found = session.iteration(number).run_log(name, LOG_TAIL)
    if found is None:
        raise Problem(404, f"iteration {number} of session {session.id} has no log "
                           f"{name[:80]!r}")
    text, size = found
    return {"name": name, "text": text, "size": size, "truncated": size > LOG_TAIL}


def diagram(workspace: str, session_id: str) -> dict:
    """The machine as `ralph diagram --session ID --format svg` draws it: the current
    state and the path taken highlighted. Without Graphviz, its mermaid source."""
    session = open_session(workspace, session_id)
    current, taken = session_path(workspace, session.id)
    try:
        return {"svg": render("svg", current, taken).decode(), "state": current.value}
    except BadInput:
        return {"mermaid": render("mermaid", current, taken).decode(), "note": INSTALL_HINT,
                "state": current.value}
