"""session.lock: one engine per session, held with flock for the engine's lifetime.

The kernel drops a flock when its holder dies, so a killed engine's lock is reclaimed
by the next start without any staleness heuristics.

The file says who holds it and which agent run is open: `<pid>[ <run>]`. An agent's
event is taken only from the open run of a live engine; the engine rewrites the run
under the bus's lock, which every append holds too, so a run once closed (or an engine
once dead) is heard no more.
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


def _content(fd: int) -> list[str]:
    """The words of the first line (the rest may be an older, longer line's tail)."""
    return os.pread(fd, 256, 0).split(b"\n")[0].decode(errors="replace").split()


def _holder(fd: int) -> str:
    words = _content(fd)
    return words[0] if words else "unknown"


class Lease:
    """The engine's hold on its session, for its lifetime, and the agent run it has open."""

    def __init__(self, session_dir: str, fd: int):
        self.session_dir = session_dir
        self._fd = fd

    def open_run(self, run: str) -> None:
        """From now on, events of `run` are taken (and of no other run)."""
        self._write(f"{os.getpid()} {run}\n")

    def close_run(self) -> None:
        """The run is over: once this returns, nothing it emits lands on the bus."""
        self._write(f"{os.getpid()}\n")

    def _write(self, text: str, durable: bool = False) -> None:
        from ._atomic import disk, fsync
        from ._events import locked
        with locked(self.session_dir, wait_seconds=5), \
                disk(os.path.join(self.session_dir, LOCK_FILE)):
            data = text.encode()
            os.pwrite(self._fd, data, 0)   # a reader sees the old first line or the new one
            os.ftruncate(self._fd, len(data))
            if durable:   # the holder's pid; a run needs none: a crash ends it with the engine
                fsync(self._fd)

    def release(self) -> None:
        os.close(self._fd)


def run_over(session_dir: str, run: str) -> str | None:
    """Why an event of agent run `run` is not taken now (None: it is). The caller holds
    the bus's lock."""
    try:
        fd = os.open(os.path.join(session_dir, LOCK_FILE),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return f"run {run} is over: no engine runs this session"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return f"run {run} is over: no engine runs this session (it stopped or died)"
        except BlockingIOError:
            words = _content(fd)
        open_run = words[1] if len(words) > 1 else None
        if open_run != run:
            return f"run {run} is over (the engine stopped it or it finished); " \
                   f"{'run ' + open_run + ' is running now' if open_run else 'no run is open'}"
        return None
    finally:
        os.close(fd)


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
    lease = Lease(session_dir, fd)
    try:
        # under the bus's lock, like every rewrite: an emitter checking its run between
        # the flock and this rewrite would read a dead engine's open run
        lease._write(f"{os.getpid()}\n", durable=True)
    except BaseException:
        os.close(fd)
        raise
    return lease


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
