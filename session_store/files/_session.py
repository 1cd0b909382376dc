"""A session of DESIGN §4, behind a few verbs: its control plane (`dir`, out of the
agents' reach, see _places) and its work area (`work_dir`, in the workspace)."""
from __future__ import annotations

import errno
import os
import re
import shutil
from datetime import datetime
from typing import TYPE_CHECKING

from .._atomic import fsync_dir, make_dirs, read_nofollow, write_atomic
from .. import _diagnostics
from .._work import WorkArea
from .._codec import structure, unstructure
from .._errors import BadInput, StaleMetadata, UnknownSession
from .._events import (EventReader, OnceIndex, append_event, append_once, backwards,
                      events_after, last_event, last_seq, tail_events)
from .._iteration import METADATA_FILE, Iteration
from .._metadata import GitInfo, Limits, SessionMetadata
from .._faults import DiskFaults
from .._places import (StateDirInWorkspace, check_places, check_state_dir, control_root,
                      make_control_root, store_url, work_root)
from .._schema import dump_plain, parse_yaml
from .._types import Status

if TYPE_CHECKING:
    from .._interface import BusReader, Lease, Questions, Signals, Wakeups

CONFIG_SNAPSHOT = "config.yaml"
SUMMARY_FILE = "summary.md"
SCRATCHPAD_FILE = "scratchpad.md"
MAX_SCRATCHPAD_BYTES = 1 << 20    # what of it is read (agents may write it without end)
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SESSION_SUBDIRS = ("signals/inputs", "signals/processed", "signals/rejected",
                   "questions", "answers", "iterations")


def check_id(value: str, what: str = "session id") -> str:
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise BadInput(f"{what} {value!r}: expected [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return value


def new_session_id(now: datetime) -> str:
    return f"{now.strftime('%y%m%d-%H%M%S')}-{os.urandom(2).hex()}"


def fleet_store(workspace: str | None):
    """The PostgreSQL store's sessions (the store's URL says where), or None: files."""
    url = store_url()
    if url is None:
        return None
    from ..postgres import PostgresSessions
    return PostgresSessions(url, workspace)


def sessions_root(workspace: str) -> str:
    """Where the workspace's sessions' control planes are."""
    return control_root(workspace)


class Session(DiskFaults):
    """One session, behind verbs. `dir` is its control plane, the file backend's address of
    it (nothing above the store passes it back: `questions`, `signals` and the lease are
    verbs here); `work_dir` is its work area, which agents get (RALPH_SESSION_DIR).
    `machine`: where it runs, in a fleet's shared store (None: this one's files)."""

    machine: str | None = None

    def __init__(self, workspace: str, session_id: str, metadata: SessionMetadata):
        self.workspace = os.path.abspath(workspace)
        self.id = session_id
        self.dir = os.path.join(sessions_root(workspace), session_id)
        self.work_dir = os.path.join(work_root(workspace), session_id)
        self.metadata = metadata
        self._work: WorkArea | None = None
        self._once: OnceIndex | None = None   # the bus's dedupe keys, read as needed

    def runs_here(self) -> bool:
        """Whether its engine runs on this machine (its pid means a process here)."""
        return True

    @property
    def mailbox_dir(self) -> str | None:
        """What an agent's poll may list to see whether signals wait, without asking the
        engine (None where the mailbox is no directory: the poll then asks)."""
        return self.dir

    @property
    def work(self) -> WorkArea:
        """The engine's writer of the work area (every path walked without links)."""
        if self._work is None:
            self._work = WorkArea(self.work_dir)
        return self._work

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.dir, METADATA_FILE)

    def save(self, now: datetime) -> None:
        """Persist metadata: revision + 1, one atomic rewrite, only over the revision this
        handle read or wrote last (a compare-and-set: a database backend's `UPDATE ...
        WHERE revision = $1`); another writer's save in between: StaleMetadata."""
        on_disk = _revision_on_disk(self.metadata_path)
        if on_disk is not None and on_disk != self.metadata.revision:
            raise StaleMetadata(f"{self.metadata_path}: revision {on_disk} on disk, "
                                f"{self.metadata.revision} expected: another writer saved "
                                f"session {self.id}; nothing written")
        self.metadata.revision += 1
        self.metadata.updated_at = now
        write_atomic(self.metadata_path, dump_plain(unstructure(self.metadata)), "metadata")

    def iteration(self, number: int | None = None) -> Iteration:
        return Iteration(self.dir, self.metadata.iteration if number is None else number,
                         self.work)

    # --- its questions and signals, its run's lease ---

    @property
    def questions(self) -> "Questions":
        from ._handles import SessionQuestions
        return SessionQuestions(self)

    @property
    def signals(self) -> "Signals":
        from ._handles import SessionSignals
        return SessionSignals(self)

    def running_pid(self) -> int | None:
        """The pid of the engine running the session, or None when none does."""
        from .._lock import running_pid
        return running_pid(self.dir)

    def acquire_lease(self, wait_seconds: float = 0.2) -> "Lease":
        """One engine per session: held for the engine's lifetime, else SessionLocked."""
        from .._lock import acquire
        return acquire(self.dir, self.id, wait_seconds)

    # --- the bus ---

    def append_event(self, topic: str, payload=None, *, source: str = "engine", ts=None,
                     run: str | None = None, via: list | None = None) -> dict:
        m = self.metadata
        return append_event(self.dir, topic, payload, source=source, iteration=m.iteration,
                            state=m.orchestrator.state.value, ts=ts, run=run, via=via)

    def reader(self) -> "BusReader":
        """An incremental reader of what is appended from now on."""
        return EventReader(self.dir, None)

    def once(self, key: str, topic: str, payload=None, *, source: str = "engine", ts=None,
             run: str | None = None, via: list | None = None) -> bool:
        """Append this record with dedupe key `key` (a string the caller builds, e.g.
        f"human.timeout:{qid}") unless one with that key is on the bus already: True when
        it was appended now, False when it was there. Exactly once across processes and
        crashes (the key is in the record's own line; see _events for which side of a
        kill an effect outside the bus lands on). O(the lines appended since the last call)."""
        m = self.metadata
        return append_once(self.dir, self._once_index(), key, topic, payload, source=source,
                           iteration=m.iteration, state=m.orchestrator.state.value, ts=ts,
                           run=run, via=via) is not None

    def done(self, key: str) -> bool:
        """Whether a record with dedupe key `key` is on the bus (complete: a torn last
        line is not done)."""
        return self._once_index().done(key)

    def _once_index(self) -> OnceIndex:
        if self._once is None or self._once.dir != self.dir:   # created aside, renamed in
            self._once = OnceIndex(self.dir)
        return self._once

    def events_after(self, seq: int) -> list[dict]:
        """The records past `seq` (a reader's cursor), oldest first."""
        return events_after(self.dir, seq)

    def last_seq(self) -> int:
        return last_seq(self.dir)

    def tail(self, count: int) -> list[dict]:
        """The newest `count` records, oldest first."""
        return tail_events(self.dir, count)

    # --- wakeups (a database backend would use its own notifications) ---

    def subscribe(self, wakeup) -> "Wakeups":
        """Set `wakeup` when something the engine acts on lands: a signal, a question or
        an answer in the control plane (the inlet watches each open run's outbox).
        Calling the result stops it; its `failed` says why no watcher works (it polls
        every second then)."""
        from ._changes import engine_watch_paths
        from .._watch import watch
        paths, trees = engine_watch_paths(self.dir)
        return watch(paths, wakeup, trees=trees)

    def follow(self, wakeup) -> "Wakeups":
        """Set `wakeup` when the bus grows (and at other writes beside it)."""
        from .._watch import watch
        return watch([self.dir], wakeup)

    def last_event(self, match) -> dict | None:
        """The newest record for which `match(record)` holds, read from the end back."""
        return last_event(self.dir, match)

    def events_backwards(self):
        """The records, newest first, read from the end back as they are taken (a reader
        that stops early reads no further)."""
        return backwards(self.dir)

    # --- notes ---

    def append_scratchpad(self, *notes: tuple[str, str | None]) -> None:
        """Append notes (text, mark) in one rewrite; a note whose mark is there already
        is skipped, so appending is idempotent by mark. Not `once`: the note is the effect,
        in a file the agents read and write; a bus key beside it could not share its write."""
        old = self.scratchpad() or "# Scratchpad\n"
        new = [text.rstrip("\n") for text, mark in notes if not (mark and mark in old)]
        if new:
            self.work.write(SCRATCHPAD_FILE, old.rstrip("\n") + "\n\n" + "\n".join(new)
                            + "\n", "scratchpad")

    def scratchpad(self) -> str | None:
        """The scratchpad, in the work area (agents keep notes there): prompts' reading."""
        try:
            return read_nofollow(os.path.join(self.work_dir, SCRATCHPAD_FILE),
                                 MAX_SCRATCHPAD_BYTES).decode("utf-8", errors="replace")
        except OSError:   # none, or a symlink planted in its place: not read
            return None

    # --- a hook run's log (descriptor, path), diagnostics: see _diagnostics ---

    def open_hook_log(self, name: str, now: datetime) -> tuple[int, str]:
        path = _diagnostics.hook_log(self.work_dir, name, now)
        return self.work.open_file(path), path

    def append_diagnostics(self, records: list[dict]) -> None:
        _diagnostics.append(self.dir, records)

    def diagnostics(self) -> list[dict]:
        return _diagnostics.read(self.dir)

    # --- the config it started with, its end ---

    def config_snapshot(self) -> tuple[bytes, str]:
        """(the config text the session started with, its path for error messages). A
        snapshot that is missing, empty or unreadable is refused: the session is never
        resumed on defaults it did not start with."""
        path = os.path.join(self.dir, CONFIG_SNAPSHOT)
        try:
            text = read_nofollow(path)
        except OSError as e:
            raise BadInput(f"{path}: the session's config snapshot cannot be read "
                           f"({e.strerror}); the session is not resumed without it") from None
        if not text.strip():
            raise BadInput(f"{path}: the session's config snapshot is empty; the session "
                           f"is not resumed without it")
        return text, path

    def has_summary(self) -> bool:
        """Written last: until it exists, a finished session's closing work is not done."""
        return os.path.exists(os.path.join(self.dir, SUMMARY_FILE))

    def write_summary(self) -> None:
        m = self.metadata
        t, u = m.tasks, m.usage
        write_atomic(os.path.join(self.dir, SUMMARY_FILE), (
            f"# Session {m.session_id}: {m.status.value}\n\n"
            f"Objective: {m.objective}\n\n"
            f"- iterations: {m.iteration}\n"
            f"- tasks: {t.total} ({t.completed} done, {t.failed} failed, {t.pending} pending)\n"
            f"- agent invocations: {u.agent_invocations}\n"
            f"- runtime: {u.runtime_seconds:.1f}s, cost: ${u.cost_usd:.2f}\n"
            f"- created: {m.created_at.isoformat()}\n"
            f"- completed: {m.completed_at.isoformat() if m.completed_at else '-'}\n"),
            "summary")


def _revision_on_disk(path: str) -> int | None:
    """The saved metadata's revision; None when there is none (being created) or it cannot
    be read (the rewrite then replaces it whole, as before)."""
    try:
        revision = parse_yaml(read_nofollow(path), path).get("revision")
    except (OSError, BadInput, AttributeError):
        return None
    return revision if isinstance(revision, int) else None


def create(workspace: str, objective: str, *, now: datetime, session_id: str | None = None,
           limits: Limits | None = None, config_path: str | None = None,
           config_snapshot: str | None = None, git: GitInfo | None = None) -> Session:
    """Make a session directory whole, or not at all: built aside, then renamed in."""
    database = fleet_store(workspace)
    if database is not None:
        return database.create(objective, now=now, session_id=session_id, limits=limits,
                               config_path=config_path, config_snapshot=config_snapshot,
                               git=git)
    session_id = check_id(session_id) if session_id else new_session_id(now)
    try:
        check_state_dir(workspace)
    except StateDirInWorkspace as e:
        raise BadInput(str(e)) from None
    root = make_control_root(workspace)
    _record_workspace(workspace)
    final = os.path.join(root, session_id)
    if os.path.lexists(final):
        raise BadInput(f"session {session_id} already exists in {root}")
    staging = os.path.join(root, f".creating-{session_id}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    make_dirs(*(os.path.join(staging, sub) for sub in SESSION_SUBDIRS))
    meta = SessionMetadata(session_id=session_id, objective=objective, created_at=now,
                           updated_at=now, limits=limits or Limits(), config_path=config_path,
                           git=git)
    session = Session(workspace, session_id, meta)
    session.dir = staging
    try:
        session.work.start_fresh()
        session.work.write(SCRATCHPAD_FILE, "# Scratchpad\n", "scratchpad")
        if config_snapshot is not None:
            write_atomic(os.path.join(staging, CONFIG_SNAPSHOT), config_snapshot,
                         CONFIG_SNAPSHOT)
        Iteration(staging, 1, session.work).create(now)
        session.save(now)
        session.append_event("session.created", {"objective": objective},
                             ts=now.isoformat())
        os.rename(staging, final)
    except FileExistsError:
        raise BadInput(f"session {session_id} already exists in {root}") from None
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        raise BadInput(f"session {session_id} already exists in {root}") from None
    finally:
        if os.path.lexists(staging):   # not renamed in: nothing half-made is left
            shutil.rmtree(staging, ignore_errors=True)
    fsync_dir(root)
    session.dir = final
    return session


def _record_workspace(workspace: str) -> None:
    """The workspace's path beside its sessions (the state directory names it by a hash)."""
    path = os.path.join(os.path.dirname(sessions_root(workspace)), "workspace")
    if not os.path.exists(path):
        write_atomic(path, os.path.realpath(workspace) + "\n", "workspace")


def load(workspace: str, session_id: str) -> Session:
    """Read and validate a session's metadata (strict: a bad file is BadInput, untouched)."""
    check_id(session_id)
    database = fleet_store(workspace)
    if database is not None:
        return database.load(session_id)
    path = os.path.join(sessions_root(workspace), session_id, METADATA_FILE)
    if os.path.islink(os.path.dirname(path)):   # planted: every read would leave the workspace
        raise BadInput(f"{os.path.dirname(path)}: a symlink, not a session; refused")
    check_places(workspace, session_id)
    try:
        text = read_nofollow(path)
    except FileNotFoundError:
        raise UnknownSession(f"unknown session {session_id!r} in {sessions_root(workspace)}") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror}; symlinks are refused)") from None
    meta = structure(parse_yaml(text, path), SessionMetadata, path)
    if meta.session_id != session_id:
        raise BadInput(f"{path}: $.session_id: expected {session_id!r}, got {meta.session_id!r}")
    return Session(workspace, session_id, meta)


def load_work_area(work_dir: str) -> Session:
    """The session whose work area is `work_dir` (as `work_root` names it)."""
    root, session_id = os.path.split(os.path.abspath(work_dir))
    return load(os.path.dirname(root), session_id)


def list_ids(workspace: str) -> list[str]:
    database = fleet_store(workspace)
    if database is not None:   # the fleet's: every machine's sessions
        return database.ids()
    check_places(workspace)
    root = sessions_root(workspace)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if ID_PATTERN.fullmatch(n)
                  and not os.path.islink(os.path.join(root, n))
                  and os.path.isfile(os.path.join(root, n, METADATA_FILE)))


def _saved_at(workspace: str, sid: str) -> float:
    if store_url() is None:
        return os.path.getmtime(os.path.join(sessions_root(workspace), sid, METADATA_FILE))
    try:
        return load(workspace, sid).metadata.updated_at.timestamp()
    except BadInput:
        return 0.0


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
        return max(list_ids(workspace), key=lambda sid: _saved_at(workspace, sid))
    if not open_ids:
        where = sessions_root(workspace) if store_url() is None else "the store"
        raise BadInput(f"no open session in {where}; name one with --session")
    raise BadInput(f"several open sessions ({', '.join(open_ids)}); name one with --session")
