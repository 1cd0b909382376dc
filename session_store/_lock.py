"""session.lock: one engine per session, held with flock for the engine's lifetime.

The kernel drops a flock when its holder dies, so a killed engine's lock is reclaimed
by the next start without any staleness heuristics.

The file says who holds it: `<pid>`. (Which agent run is open is the outbox's header,
in the work area: see _outbox.)
"""
from __future__ import annotations

import fcntl
import os
import time

from ._atomic import FILE_MODE, disk, fsync
from ._errors import BadInput, SessionLocked

LOCK_FILE = "session.lock"


def _open(session_dir: str) -> int:
    path = os.path.join(session_dir, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as e:
        raise BadInput(f"{path}: cannot open the session lock ({e.strerror}); "
                       f"a symlink or a file of another user is refused") from None
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        os.close(fd)
        raise BadInput(f"{path}: the session lock belongs to another user (uid {st.st_uid})")
    return fd


def _content(fd: int) -> list[str]:
    """The words of the first line (the rest may be an older, longer line's tail)."""
    return os.pread(fd, 256, 0).split(b"\n")[0].decode(errors="replace").split()


def _holder(fd: int) -> str:
    words = _content(fd)
    return words[0] if words else "unknown"


class Lease:
    """The engine's hold on its session, for its lifetime."""

    def __init__(self, session_dir: str, fd: int):
        self.session_dir = session_dir
        self._fd = fd

    def keep(self) -> None:
        """A flock ends only with its holder: still held."""

    def release(self) -> None:
        os.close(self._fd)


def flock_within(fd: int, seconds: float) -> bool:
    """An exclusive flock on `fd`, waited for at most `seconds`; False when not had."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def acquire(session_dir: str, session_id: str, wait_seconds: float = 0.2) -> Lease:
    """Take the lock or raise SessionLocked naming the holder's pid."""
    fd = _open(session_dir)
    # a `status` probe holds it for microseconds
    if not flock_within(fd, wait_seconds):
        holder = _holder(fd)
        os.close(fd)
        raise SessionLocked(f"session {session_id} is locked by a running engine "
                            f"(pid {holder})")
    try:
        with disk(os.path.join(session_dir, LOCK_FILE)):
            data = f"{os.getpid()}\n".encode()
            os.pwrite(fd, data, 0)   # a reader sees the old first line or the new one
            os.ftruncate(fd, len(data))
            fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return Lease(session_dir, fd)


def running_pid(session_dir: str) -> int | None:
    """The pid of the engine holding the lock, or None when no engine runs the session."""
    path = os.path.join(session_dir, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        return int(holder) if holder.isdigit() else -1
    os.close(fd)
    return None
