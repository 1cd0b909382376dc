"""The file backend's session: its control plane as files in `dir` (metadata.yaml, the
bus, questions, signals, the lease), and making, loading and listing a workspace's
sessions."""
from __future__ import annotations

import errno
import os
import shutil
from datetime import datetime
from typing import TYPE_CHECKING

from .._atomic import fsync_dir, make_dirs, read_nofollow, write_atomic
from .._codec import structure, unstructure
from .._errors import BadInput, StaleMetadata, UnknownSession
from .._events import (EventReader, OnceIndex, append_event, append_once, backwards,
                       events_after, last_event, last_seq, tail_events)
from .._ids import ID_PATTERN, check_id, new_session_id
from .._iteration import METADATA_FILE, Iteration
from .._metadata import GitInfo, Limits, SessionMetadata
from .._places import StateDirInWorkspace, check_places, check_state_dir, make_control_root
from .._schema import dump_plain, parse_yaml
from .._session import SCRATCHPAD_FILE, Session, sessions_root

if TYPE_CHECKING:
    from .._interface import BusReader, Lease, Questions, Signals, Wakeups

CONFIG_SNAPSHOT = "config.yaml"
SESSION_SUBDIRS = ("signals/inputs", "signals/processed", "signals/rejected",
                   "questions", "answers", "iterations")


class FileSession(Session):
    """A session whose control plane is files in `dir`."""

    def __init__(self, workspace: str, session_id: str, metadata: SessionMetadata):
        super().__init__(workspace, session_id, metadata)
        self._once: OnceIndex | None = None   # the bus's dedupe keys, read as needed

    @property
    def mailbox_dir(self) -> str | None:
        return self.dir

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.dir, METADATA_FILE)

    def save(self, now: datetime) -> None:
        """One atomic rewrite (the compare-and-set of a database's `UPDATE ... WHERE
        revision = $1`, over the revision read back from the file)."""
        on_disk = _revision_on_disk(self.metadata_path)
        if on_disk is not None and on_disk != self.metadata.revision:
            raise StaleMetadata(f"{self.metadata_path}: revision {on_disk} on disk, "
                                f"{self.metadata.revision} expected: another writer saved "
                                f"session {self.id}; nothing written")
        self.metadata.revision += 1
        self.metadata.updated_at = now
        write_atomic(self.metadata_path, dump_plain(unstructure(self.metadata)), "metadata")

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
        from .._lock import running_pid
        return running_pid(self.dir)

    def acquire_lease(self, wait_seconds: float = 0.2) -> "Lease":
        from .._lock import acquire
        return acquire(self.dir, self.id, wait_seconds)

    # --- the bus ---

    def append_event(self, topic: str, payload=None, *, source: str = "engine", ts=None,
                     run: str | None = None, via: list | None = None) -> dict:
        m = self.metadata
        return append_event(self.dir, topic, payload, source=source, iteration=m.iteration,
                            state=m.orchestrator.state.value, ts=ts, run=run, via=via)

    def reader(self) -> "BusReader":
        return EventReader(self.dir, None)

    def once(self, key: str, topic: str, payload=None, *, source: str = "engine", ts=None,
             run: str | None = None, via: list | None = None) -> bool:
        """The key is in the record's own line (see _events for which side of a kill an
        effect outside the bus lands on). O(the lines appended since the last call)."""
        m = self.metadata
        return append_once(self.dir, self._once_index(), key, topic, payload, source=source,
                           iteration=m.iteration, state=m.orchestrator.state.value, ts=ts,
                           run=run, via=via) is not None

    def done(self, key: str) -> bool:
        return self._once_index().done(key)

    def _once_index(self) -> OnceIndex:
        if self._once is None or self._once.dir != self.dir:   # created aside, renamed in
            self._once = OnceIndex(self.dir)
        return self._once

    def events_after(self, seq: int) -> list[dict]:
        return events_after(self.dir, seq)

    def last_seq(self) -> int:
        return last_seq(self.dir)

    def tail(self, count: int) -> list[dict]:
        return tail_events(self.dir, count)

    # --- wakeups: a watcher of the control plane's directories ---

    def subscribe(self, wakeup) -> "Wakeups":
        from .._watch import watch
        from ._changes import engine_watch_paths
        paths, trees = engine_watch_paths(self.dir)
        return watch(paths, wakeup, trees=trees)

    def follow(self, wakeup) -> "Wakeups":
        from .._watch import watch
        return watch([self.dir], wakeup)

    def last_event(self, match) -> dict | None:
        return last_event(self.dir, match)

    def events_backwards(self):
        return backwards(self.dir)

    def config_snapshot(self) -> tuple[bytes, str]:
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
           config_snapshot: str | None = None, git: GitInfo | None = None) -> FileSession:
    """Make a session directory whole, or not at all: built aside, then renamed in."""
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
    session = FileSession(workspace, session_id, meta)
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


def load(workspace: str, session_id: str) -> FileSession:
    """Read and validate a session's metadata (strict: a bad file is BadInput, untouched)."""
    check_id(session_id)
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
    return FileSession(workspace, session_id, meta)


def list_ids(workspace: str) -> list[str]:
    check_places(workspace)
    root = sessions_root(workspace)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if ID_PATTERN.fullmatch(n)
                  and not os.path.islink(os.path.join(root, n))
                  and os.path.isfile(os.path.join(root, n, METADATA_FILE)))
