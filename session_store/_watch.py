"""Wakeups: what tells a reader that something landed in the store, so nothing polls.

For files: inotify through watchdog on directories (a polling observer where inotify is
unavailable, a one-second ticker where no watcher works), and inotify on one file alone
(`FileWatch`): watchdog watches a file through its directory, and every write beside it
reaches Python, through two of its threads, before being found to be about another file.
The engine follows the bus while agents run, and the bus sits beside the files the engine
itself rewrites at every step (metadata, the run lease): through watchdog that cost more
CPU per transition than the transition's own work (bench 1). A database backend would
wake its readers with its own notifications behind the same verbs (`Session.subscribe`,
`Sessions.watch`, `inbox_watch`).

Stdlib at import: watchdog is imported by `watch` only (agents' tools use `FileWatch`).
"""
from __future__ import annotations

import ctypes
import os
import select
import threading
from typing import Callable, Sequence

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


def watch(paths: Sequence[str], wakeup: threading.Event | None, trees: Sequence[str] = (),
          notify: Callable[[str], None] | None = None,
          files: Sequence[str] = ()) -> "Watching":
    """Wake the engine when a file lands in one of `paths`, or anywhere under `trees`
    (inotify through watchdog; a polling observer where no watcher works), or when one
    of `files` is written (inotify on the file alone; its directory where that fails).
    `notify`, if given, is called with every changed path (both of a move), from the
    watcher's thread. Returns a function that stops it (and whose `add` watches one more
    directory).

    A file renamed out of a watched directory into an unwatched one leaves watchdog
    holding the move half-paired for 0.5 s, and every event behind it too: so the
    mailbox is watched as the whole `signals/` tree, where a take is one paired move."""
    import logging

    from watchdog import events as ev
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    # watchdog logs a harmless race at shutdown as an error; nothing of it is ours to show
    logging.getLogger("watchdog").setLevel(logging.CRITICAL)

    # what wakes a watcher: writes. Opens and reads are left out at the kernel (inotify's
    # mask): waking on them made a waiting engine wake itself with its own reads, at a
    # full core, and even ignored they cost a trip through watchdog's threads each
    writes = [ev.FileCreatedEvent, ev.FileModifiedEvent, ev.FileDeletedEvent, ev.FileMovedEvent,
              ev.FileClosedEvent, ev.DirCreatedEvent, ev.DirModifiedEvent, ev.DirDeletedEvent,
              ev.DirMovedEvent]

    class Wake(ev.FileSystemEventHandler):
        def on_any_event(self, event):
            if notify is not None:
                notify(event.src_path)
                if event.dest_path:
                    notify(event.dest_path)
            if wakeup is not None:
                wakeup.set()

    file_watches, paths = [], list(paths)
    for path in files:
        file_watch = None
        if wakeup is not None and notify is None:   # paths to notify come from watchdog
            try:
                file_watch = FileWatch(path, wakeup)
            except OSError:
                pass
        if file_watch is None:
            paths.append(os.path.dirname(path))   # every write beside it wakes too
            continue
        file_watch.start()
        file_watches.append(file_watch)
    problems = []
    for make in (Observer, lambda: PollingObserver(timeout=0.1)):
        observer = None
        try:
            observer = make()
            for path in paths:
                observer.schedule(Wake(), path, recursive=False, event_filter=writes)
            for path in trees:
                observer.schedule(Wake(), path, recursive=True, event_filter=writes)
            observer.start()
        except Exception as e:  # noqa: BLE001 - no watcher: say so, and poll instead
            problems.append(f"{type(e).__name__}: {e}")
            if observer is not None:   # what it started (inotify descriptors, threads)
                try:
                    observer.unschedule_all()
                    observer.stop()
                except Exception:  # noqa: BLE001
                    pass
            continue
        # inotify failing is said too, though watchdog's polling observer carries on
        return Watching(observer, Wake(), writes, file_watches,
                        failed="; ".join(problems) + " (watchdog polls instead)"
                        if problems else None)
    # never no wakeups: every second, as if everything watched had changed
    ticker = _Ticker([*paths, *trees], wakeup, notify)
    ticker.start()
    return Watching(ticker, None, writes, file_watches, failed="; ".join(problems))


class _Ticker(threading.Thread):
    """The fallback when no file-system watcher works: a wakeup every POLL_SECONDS."""

    POLL_SECONDS = 1.0

    def __init__(self, paths, wakeup, notify):
        super().__init__(name="watch-poll", daemon=True)
        self._paths, self._wakeup, self._notify = list(paths), wakeup, notify
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.POLL_SECONDS):
            for path in self._paths:
                if self._notify is not None:
                    self._notify(path)
            if self._wakeup is not None:
                self._wakeup.set()

    def schedule(self, handler, path, recursive=False, event_filter=None) -> None:
        self._paths.append(path)

    def stop(self) -> None:
        self._stopping.set()


class Watching:
    """A running watcher: calling it stops it; `add(path)` watches one more directory
    (not recursively), e.g. a session that appeared after it started."""

    def __init__(self, observer, handler, events, file_watches=(), failed: str | None = None):
        self._observer, self._handler, self._events = observer, handler, events
        self._file_watches = list(file_watches)
        self.failed = failed   # why no watcher works (then it polls every second)

    def add(self, path: str) -> None:
        if self._observer is not None:
            self._observer.schedule(self._handler, path, recursive=False,
                                    event_filter=self._events)

    def __call__(self) -> None:
        for file_watch in self._file_watches:
            file_watch.stop()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
