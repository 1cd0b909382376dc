"""session.lock: one engine per session, held with flock for the engine's lifetime.

The kernel drops a flock when its holder dies, so a killed engine's lock is reclaimed
by the next start without any staleness heuristics.
"""
from __future__ import annotations

import fcntl
import os
import time

from ._atomic import FILE_MODE
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


def _holder(fd: int) -> str:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text or "unknown"


def acquire(session_dir: str, session_id: str, wait_seconds: float = 0.2) -> int:
    """Take the lock or raise SessionLocked naming the holder's pid. Returns the fd to keep."""
    fd = _open(session_dir)
    deadline = time.monotonic() + wait_seconds  # a `status` probe holds it for microseconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                os.close(fd)
                raise SessionLocked(f"session {session_id} is locked by a running engine "
                                    f"(pid {holder})") from None
            time.sleep(0.01)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    os.fsync(fd)
    return fd


def release(fd: int) -> None:
    os.close(fd)


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
