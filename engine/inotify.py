"""A wakeup on every write to one file, through Linux's inotify on that file alone.

watchdog watches a file through its directory: every write beside it reaches Python,
through two of its threads, before being found to be about another file. The engine
follows the bus while agents run, and the bus sits beside the files the engine itself
rewrites at every step (metadata, the run lease): through watchdog that cost more CPU
per transition than the transition's own work (bench 1)."""
from __future__ import annotations

import ctypes
import os
import select
import threading

IN_MODIFY = 0x2
IN_LANDED = 0x8 | 0x80   # IN_CLOSE_WRITE | IN_MOVED_TO: a file written, or renamed in


class FileWatch(threading.Thread):
    """Sets `wakeup` after each write to `path` (or, with `mask`, each event it names: on
    a directory, IN_LANDED); `stop()` ends it. Raises OSError when inotify cannot watch
    it (then the caller watches some other way)."""

    def __init__(self, path: str, wakeup: threading.Event, mask: int = IN_MODIFY):
        super().__init__(name="watch-file", daemon=True)
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if fd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_init1: {os.strerror(ctypes.get_errno())}")
        if libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
            errno = ctypes.get_errno()
            os.close(fd)
            raise OSError(errno, f"inotify_add_watch {path}: {os.strerror(errno)}")
        self._fd, self._wakeup = fd, wakeup
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)

    def run(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                while os.read(self._fd, 4096):   # drain: one wakeup for a burst
                    pass
            except BlockingIOError:
                pass
            self._wakeup.set()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        if self.is_alive():
            self.join(timeout=2)
        for fd in (self._fd, self._stop_r, self._stop_w):
            os.close(fd)
