"""What the page shows, as plain data, read through the store and engine/views.py only.

Every function here is synchronous (file reads): the routes run them in a worker thread.
A session id, question id, iteration or log name from a URL is checked before it reaches
the store, and the store turns only names it lists itself into paths.
"""
from __future__ import annotations

import json
import math
import threading

from ralph.session_store import BadInput, Session, State, check_id, load

from ... import diagram_svg
from ...diagram import transition_steps
from ...session_list import list_views
from ...views import session_view

LOG_TAIL = 256 * 1024        # bytes of an agent log a page shows (the end of it)
SCRATCHPAD_TAIL = 64 * 1024  # characters of the scratchpad a page shows (the end of it)
# What a page is sent of the bus at once (the last events at first, then the new ones):
# at most EVENT_BATCH events within EVENT_CHARACTERS, each cut to about MAX_EVENT. The
# page shows 300 characters of a payload; `ralph session tail` shows it all.
EVENT_BATCH = 200
EVENT_CHARACTERS = 256 * 1024
MAX_EVENT = 4 * 1024
EVENT_FIELDS = ("seq", "ts", "topic", "source", "iteration", "state", "run")


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
    """Where a session stands (`ralph session status --json`), the end of its scratchpad
    and the guidance waiting for a role's next run."""
    session = open_session(workspace, session_id)
    try:
        view = session_view(workspace, session.id, last_events=0)
    except BadInput as e:
        raise Problem(404, str(e)) from None
    # the diagram rides in the snapshot: the page draws the header and the picture from
    # the same read, so they never disagree
    return {"view": view, "scratchpad": _tail(session.scratchpad() or "", SCRATCHPAD_TAIL),
            "guidance": session.signals.guidance(),
            "diagram": _drawing(session, State(view["state"]))}


def _tail(text: str, most: int) -> str:
    if len(text) <= most:
        return text
    return f"[… {len(text) - most} characters before these]\n" + text[-most:]


def first_events(workspace: str, session_id: str) -> tuple[Session, list[dict]]:
    """The session and its last events (what a page starts with)."""
    session = open_session(workspace, session_id)
    return session, events_since(session, 0)[0]


def events_since(session: Session, after: int) -> tuple[list[dict], bool]:
    """The events whose seq is above `after`, oldest first, read from the end of the bus
    back (a long bus costs nothing): the newest that fit in one batch, each fitted; and
    whether older ones above `after` were left out."""
    kept, size = [], 0
    for record in session.events_backwards():
        seq = record["seq"]
        if type(seq) is not int:   # not a record of the store's: nothing to order it by
            continue
        if seq <= after:
            break
        record = fitted(record)
        size += len(dumps(record))
        if len(kept) == EVENT_BATCH or size > EVENT_CHARACTERS:
            return kept[::-1], True
        kept.append(record)
    return kept[::-1], False


def fitted(record: dict) -> dict:
    """The event as a page is sent it: whole when it is short; else its fields, each
    short, and the start of its payload, marked `truncated`."""
    try:
        if len(dumps(record)) <= MAX_EVENT:
            return record
        payload = record.get("payload")
        text = payload if isinstance(payload, str) else dumps(payload)
    except RecursionError:
        text = "(nested too deep to show)"
    cut = {k: _short(record[k]) for k in EVENT_FIELDS if k in record}
    most = MAX_EVENT // 2
    cut["payload"] = text if len(text) <= most else \
        f"{text[:most]} [… {len(text)} characters in all: `ralph session tail` shows them]"
    cut["truncated"] = True
    return cut


def _short(value):
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "…"
    return "(not shown)"


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
                       "note": t.note} for t in meta.task_lines()],
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
    """The machine with the session on it, as the page draws it (engine/diagram_svg.py:
    no Graphviz needed)."""
    session = open_session(workspace, session_id)
    return _drawing(session, session.metadata.orchestrator.state)


def _drawing(session: Session, current: State) -> dict:
    return {"svg": diagram_svg.svg(current, _PATHS.steps(session)), "state": current.value}


class _Paths:
    """The transitions each session took, read once and then from where the last read
    ended (a page's every snapshot would otherwise read the whole bus again)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._known: dict[str, tuple[int, list[tuple[str, str, str]]]] = {}

    def steps(self, session: Session) -> list[tuple[str, str, str]]:
        with self._lock:
            seq, steps = self._known.get(session.id, (0, []))
            if session.last_seq() < seq:   # not the bus that was read: read it afresh
                seq, steps = 0, []
            new = session.events_after(seq)
            if new:
                seq, steps = new[-1]["seq"], steps + transition_steps(new)
                self._known[session.id] = (seq, steps)
            return steps


_PATHS = _Paths()
