"""What a change that a file-system watcher reports under the sessions root is about (a
`Change`, as the database's notifications say it too).

The store owns the layout, so a watcher of the sessions (the Telegram outbox) asks here
what to watch and what a changed path means, instead of parsing paths itself."""
from __future__ import annotations

import os
from .._errors import BadInput
from .._events import EVENTS_FILE
from .._ids import check_id
from .._interface import Change
from .._questions import question_id

QUESTIONS_DIR = "questions"
ANSWERS_DIR = "answers"
SIGNALS_DIR = "signals"


def engine_watch_paths(session_dir: str) -> tuple[list[str], list[str]]:
    """What wakes the engine that runs a session: (directories, trees) to watch: answers,
    questions and the mailbox in the control plane. (Each open run's outbox is watched as
    its file by the engine's inlet, from when it opens the run.)"""
    return ([os.path.join(session_dir, ANSWERS_DIR), os.path.join(session_dir, QUESTIONS_DIR)],
            [os.path.join(session_dir, SIGNALS_DIR)])


def watch_paths(session_dir: str) -> list[str]:
    """The directories to watch (not recursively) for a session's bus and questions."""
    return [session_dir, os.path.join(session_dir, QUESTIONS_DIR)]


def change_at(root: str, path: str) -> Change | None:
    """The change at `path` (under `root`, the sessions root, or in a directory of
    `watch_paths`), or None when it is nothing a channel follows (metadata, temp files,
    the root's own dot-files)."""
    parts = os.path.relpath(path, root).split(os.sep)
    try:
        session = check_id(parts[0])
    except BadInput:   # "..", ".telegram", ".creating-...": not a session
        return None
    if len(parts) == 1:
        return Change(session, "session")
    if len(parts) == 2 and parts[1] == EVENTS_FILE:
        return Change(session, "events")
    if len(parts) == 3 and parts[1] == QUESTIONS_DIR:
        qid = question_id(parts[2])
        if qid is not None:
            return Change(session, "question", qid)
    return None
