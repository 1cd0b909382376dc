"""The session directory of DESIGN §4, behind a few verbs."""
from __future__ import annotations

import os
import re
import secrets
import shutil
from datetime import datetime

from . import _progress
from ._atomic import fsync_dir, make_dirs, read_nofollow, rename_durable, write_atomic
from ._errors import BadInput
from ._events import append_event, read_events
from ._metadata import IterationMetadata, Limits, SessionMetadata, Status
from ._schema import dump_yaml, parse_yaml, structure, unstructure

SESSIONS_DIR = ".ralph-sessions"
METADATA_FILE = "metadata.yaml"
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SESSION_SUBDIRS = ("signals/inputs", "signals/processed", "signals/rejected",
                   "questions", "answers", "iterations")
BOOKKEEPING = ("promoted.yaml", "carried_from.yaml")  # the engine's records in knowledge/
ITERATION_SUBDIRS = ("tasks", "reports", "reviews", "knowledge", "logs")


def check_id(value: str, what: str = "session id") -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise BadInput(f"{what} {value!r}: expected [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return value


def new_session_id(now: datetime) -> str:
    return f"{now.strftime('%y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def sessions_root(workspace: str) -> str:
    return os.path.join(os.path.abspath(workspace), SESSIONS_DIR)


class Iteration:
    """Files of `iterations/<N>/`."""

    def __init__(self, session_dir: str, number: int):
        self.number = number
        self.dir = os.path.join(session_dir, "iterations", str(number))

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    def exists(self) -> bool:
        return os.path.isfile(self.path(METADATA_FILE))

    def create(self, now: datetime, **fields) -> IterationMetadata:
        """Make the iteration's directories, then its metadata in one write (with `fields`,
        e.g. tasks_before), so a crash never leaves it half-initialised."""
        for sub in ITERATION_SUBDIRS:
            make_dirs(self.path(sub))
        meta = IterationMetadata(iteration=self.number, started_at=now, **fields)
        self.save(meta)
        return meta

    def load(self) -> IterationMetadata:
        path = self.path(METADATA_FILE)
        with open(path, "rb") as f:
            return structure(parse_yaml(f.read(), path), IterationMetadata, path)

    def save(self, meta: IterationMetadata) -> None:
        write_atomic(self.path(METADATA_FILE), dump_yaml(unstructure(meta)), "iteration-metadata")

    def write(self, relpath: str, text: str, kind: str = "iteration-file") -> str:
        path = self.path(relpath)
        make_dirs(os.path.dirname(path))
        write_atomic(path, text, kind)
        return path

    def progress(self) -> list[_progress.TaskLine]:
        try:
            with open(self.path("progress.md"), encoding="utf-8") as f:
                return _progress.parse(f.read())
        except FileNotFoundError:
            return []

    def save_progress(self, tasks: list[_progress.TaskLine]) -> None:
        write_atomic(self.path("progress.md"), _progress.render(self.number, tasks), "progress")

    def set_marker(self, task_id: str, marker: str, note: str | None = None) -> None:
        tasks = self.progress()
        for t in tasks:
            if t.id == task_id:
                t.marker, t.note = marker, note
        self.save_progress(tasks)

    def _report_path(self, task_id: str, attempt: int) -> str:
        suffix = "" if attempt == 1 else f"-r{attempt}"
        return self.path("reports", f"{task_id}-report{suffix}.md")

    def report_path(self, task_id: str, attempt: int) -> str | None:
        """reports/<TASK>-report.md for attempt 1, -report-r<N>.md after; None if absent."""
        path = self._report_path(task_id, attempt)
        return path if os.path.exists(path) else None

    def latest_report(self, task_id: str) -> str | None:
        attempt, latest = 1, None
        while (path := self.report_path(task_id, attempt)) is not None:
            latest, attempt = path, attempt + 1
        return latest

    def write_report(self, task_id: str, text: str) -> str:
        """A new report, one per attempt: -report.md, -report-r2.md, ..."""
        attempt = 1
        while os.path.exists(self._report_path(task_id, attempt)):
            attempt += 1
        path = self._report_path(task_id, attempt)
        write_atomic(path, text, "report")
        return path

    def staged_knowledge(self) -> list[str]:
        """Regular files under knowledge/ (a symlink is no knowledge: promoting it would
        put a link to anywhere into the docs; os.walk does not enter linked directories)."""
        root = self.path("knowledge")
        found = []
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                if name not in BOOKKEEPING and not name.startswith(".") and \
                        os.path.isfile(path) and not os.path.islink(path):
                    found.append(os.path.relpath(path, root))
        return sorted(found)


class Session:
    def __init__(self, workspace: str, session_id: str, metadata: SessionMetadata):
        self.workspace = os.path.abspath(workspace)
        self.id = session_id
        self.dir = os.path.join(sessions_root(workspace), session_id)
        self.metadata = metadata

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.dir, METADATA_FILE)

    def save(self, now: datetime) -> None:
        """Persist metadata: revision + 1, one atomic rewrite."""
        self.metadata.revision += 1
        self.metadata.updated_at = now
        write_atomic(self.metadata_path, dump_yaml(unstructure(self.metadata)), "metadata")

    def iteration(self, number: int | None = None) -> Iteration:
        return Iteration(self.dir, self.metadata.iteration if number is None else number)

    def append_event(self, topic: str, payload=None, *, source: str = "engine", ts=None) -> dict:
        m = self.metadata
        return append_event(self.dir, topic, payload, source=source, iteration=m.iteration,
                            state=m.orchestrator.state.value, ts=ts)

    def read_events(self, offset: int = 0):
        return read_events(self.dir, offset)

    def append_scratchpad(self, *notes: tuple[str, str | None]) -> None:
        """Append notes (text, mark) in one rewrite; a note whose mark is there already
        is skipped, so appending is idempotent by mark."""
        path = os.path.join(self.dir, "scratchpad.md")
        try:
            old = read_nofollow(path).decode("utf-8", errors="replace")
        except FileNotFoundError:
            old = "# Scratchpad\n"
        except OSError:   # a symlink planted in its place: not read, and replaced below
            old = "# Scratchpad\n"
        new = [text.rstrip("\n") for text, mark in notes if not (mark and mark in old)]
        if new:
            write_atomic(path, old.rstrip("\n") + "\n\n" + "\n".join(new) + "\n", "scratchpad")


def create(workspace: str, objective: str, *, now: datetime, session_id: str | None = None,
           limits: Limits | None = None, config_path: str | None = None,
           files: dict[str, str] | None = None) -> Session:
    """Make a session directory whole, or not at all: built aside, then renamed in."""
    session_id = check_id(session_id) if session_id else new_session_id(now)
    root = sessions_root(workspace)
    make_dirs(root)
    final = os.path.join(root, session_id)
    if os.path.lexists(final):
        raise BadInput(f"session {session_id} already exists in {root}")
    staging = os.path.join(root, f".creating-{session_id}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    for sub in SESSION_SUBDIRS:
        make_dirs(os.path.join(staging, sub))
    meta = SessionMetadata(session_id=session_id, objective=objective, created_at=now,
                           updated_at=now, limits=limits or Limits(), config_path=config_path)
    session = Session(workspace, session_id, meta)
    session.dir = staging
    write_atomic(os.path.join(staging, "scratchpad.md"), "# Scratchpad\n", "scratchpad")
    for name, text in (files or {}).items():
        write_atomic(os.path.join(staging, name), text, name)
    Iteration(staging, 1).create(now)
    session.save(now)
    session.append_event("session.created", {"objective": objective}, ts=now.isoformat())
    try:
        os.rename(staging, final)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        raise BadInput(f"session {session_id} already exists in {root}") from None
    fsync_dir(root)
    session.dir = final
    return session


def load(workspace: str, session_id: str) -> Session:
    """Read and validate a session's metadata (strict: a bad file is BadInput, untouched)."""
    check_id(session_id)
    path = os.path.join(sessions_root(workspace), session_id, METADATA_FILE)
    try:
        text = read_nofollow(path)
    except FileNotFoundError:
        raise BadInput(f"unknown session {session_id!r} in {sessions_root(workspace)}") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror}; symlinks are refused)") from None
    meta = structure(parse_yaml(text, path), SessionMetadata, path)
    if meta.session_id != session_id:
        raise BadInput(f"{path}: $.session_id: expected {session_id!r}, got {meta.session_id!r}")
    return Session(workspace, session_id, meta)


def list_ids(workspace: str) -> list[str]:
    root = sessions_root(workspace)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if ID_PATTERN.fullmatch(n)
                  and os.path.isfile(os.path.join(root, n, METADATA_FILE)))


def resolve_id(workspace: str, session_id: str | None, newest_if_none_open: bool = False) -> str:
    """--session, else $RALPH_SESSION_ID, else the one session neither completed nor aborted
    (else, for read-only views, the newest session)."""
    session_id = session_id or os.environ.get("RALPH_SESSION_ID")
    if session_id:
        return check_id(session_id)
    open_ids = []
    for sid in list_ids(workspace):
        try:
            if load(workspace, sid).metadata.status not in (Status.COMPLETED, Status.ABORTED):
                open_ids.append(sid)
        except BadInput:
            continue
    if len(open_ids) == 1:
        return open_ids[0]
    if not open_ids and newest_if_none_open and list_ids(workspace):
        return max(list_ids(workspace), key=lambda sid: os.path.getmtime(
            os.path.join(sessions_root(workspace), sid, METADATA_FILE)))
    if not open_ids:
        raise BadInput(f"no open session in {sessions_root(workspace)}; name one with --session")
    raise BadInput(f"several open sessions ({', '.join(open_ids)}); name one with --session")


def move_file(src: str, dst: str, kind: str = "rename") -> None:
    make_dirs(os.path.dirname(dst))
    rename_durable(src, dst, kind)
