"""What a human channel (the Telegram bot, the web view) sees of a workspace's sessions in
the file store: `Sessions`, addressed by id, and `ChannelFiles`, its own files beside them.

A channel never builds a session's path nor keeps a byte offset of a bus: it names a
session by id, follows a bus by seq (the cursor a database backend would keep too), and
is woken by `Sessions.watch` with what changed (a `Change`), not with a path to parse.
"""
from __future__ import annotations

import fcntl
import os
from typing import TYPE_CHECKING, Callable, NamedTuple

from .._atomic import make_dirs, read_nofollow, write_atomic
from .._channel import Channel
from .._events import events_after, last_seq
from .._ids import check_id
from .._interface import Change
from .._places import check_places, make_control_root
from .._session import sessions_root
from ._changes import change_at, watch_paths
from ._handles import SessionQuestions
from ._session import FileSession, list_ids, load

if TYPE_CHECKING:
    from .._interface import Held


class Sessions:
    """A workspace's sessions, by id."""

    shared = False   # its changes are the files' (a database's are heard from it)

    def __init__(self, workspace: str):
        self.workspace = workspace
        self._root = sessions_root(workspace)
        check_places(workspace)

    def _dir(self, sid: str) -> str:
        return os.path.join(self._root, check_id(sid))

    def ids(self) -> list[str]:
        return list_ids(self.workspace)

    def load(self, sid: str) -> FileSession:
        return load(self.workspace, sid)

    # --- the bus, by seq ---

    def events_after(self, sid: str, seq: int) -> list[dict]:
        """The complete records past `seq`, oldest first."""
        return events_after(self._dir(sid), seq)

    def last_seq(self, sid: str) -> int:
        """The seq of the bus's last complete record (0: none yet)."""
        return last_seq(self._dir(sid))

    def questions(self, sid: str) -> SessionQuestions:
        """The session's questions (the handle's verbs), without loading its metadata."""
        return SessionQuestions(_Address(self._dir(sid)))

    # --- wakeups ---

    def watch(self, notify: Callable[[Change], None]) -> "SessionsWatch":
        """Call `notify(change)` (from the watcher's thread) for each session that appears,
        bus appended to and question written or marked, in the sessions there now; a
        session that appears later is followed once `add` is called with it."""
        make_control_root(self.workspace)

        def changed(path: str) -> None:
            change = change_at(self._root, path)
            if change is not None:
                notify(change)
        from .._watch import watch
        paths = [self._root] + [p for sid in self.ids() for p in watch_paths(self._dir(sid))
                                if os.path.isdir(p)]
        return SessionsWatch(watch(paths, None, notify=changed), self)


class _Address(NamedTuple):
    """What a handle's verbs need of a session: its address in the store."""
    dir: str


class SessionsWatch:
    """A running `Sessions.watch`: calling it stops it."""

    def __init__(self, watching, sessions: Sessions):
        self._watching, self._sessions = watching, sessions

    def add(self, sid: str) -> None:
        """Follow a session that appeared. OSError: gone again, or no watch left."""
        for path in watch_paths(self._sessions._dir(sid)):
            self._watching.add(path)

    def __call__(self) -> None:
        self._watching()


class ChannelFiles(Channel):
    """A channel's state and lock as files beside its folder (`.<channel>/` and
    `.<channel>.lock`): the lock lets one process run it per workspace."""

    STATE_FILE = "state.yaml"   # JSON, which YAML readers read too

    def __init__(self, workspace: str, channel: str):
        super().__init__(workspace, channel)
        self._lock = self.dir + ".lock"
        self.state_path = os.path.join(self.dir, self.STATE_FILE)   # (named in messages)

    def read_state(self) -> bytes | None:
        """A symlink in its place is refused (OSError)."""
        try:
            return read_nofollow(self.state_path)
        except FileNotFoundError:
            return None

    def write_state(self, text: str, kind: str) -> None:
        make_dirs(self.dir)
        write_atomic(self.state_path, text, kind)

    def try_lock(self) -> "Held | None":
        """It names the holder's pid."""
        make_control_root(self._workspace)
        fd = os.open(self._lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return HeldLock(fd)

    def lock_holder(self) -> str:
        try:
            with open(self._lock, encoding="utf-8", errors="replace") as f:
                return f.read(32).strip() or "unknown"
        except OSError:
            return "unknown"


class HeldLock:
    """A channel's lock, held: a flock on an open file (closing it lets go)."""

    def __init__(self, fd: int):
        self._fd = fd

    def release(self) -> None:
        os.close(self._fd)
