"""Running several tasks of a batch at once (`event_loop.parallel`), each on a lane.

The engine stays one program with one truth: every part of it runs under `EngineLock`,
held by one thread at a time. A thread lets it go only while it waits (for an agent's
process, a wakeup, a deadline), which is where a run spends its time; so a parallel
batch's lanes overlap their agents' runs and nothing else, and no part of the engine
needs a lock of its own.

`Wakeups` is the engine's one wakeup (the mailbox watcher, an agent exiting, a
question's deadline set it) heard by every waiting thread: each waits on an event of its
own, and a wait lets go of the engine lock meanwhile.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager


class EngineLock:
    """The engine's lock, and whether this thread holds it (a wait lets it go)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._owner: int | None = None

    def acquire(self) -> None:
        self._lock.acquire()
        self._owner = threading.get_ident()

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def held(self) -> bool:
        return self._owner == threading.get_ident()

    @contextmanager
    def holding(self):
        self.acquire()
        try:
            yield
        finally:
            self.release()


class Wakeups:
    """A threading.Event for many waiters: `set` wakes every thread that waits, each
    thread's `wait`/`clear` are its own, and a thread holding the engine lock lets go of
    it while it waits."""

    def __init__(self, lock: EngineLock | None = None):
        self.lock = lock or EngineLock()
        self._events: dict[int, threading.Event] = {}
        self._guard = threading.Lock()

    def _mine(self) -> threading.Event:
        me = threading.get_ident()
        with self._guard:
            event = self._events.get(me)
            if event is None:   # set: what came before its first wait is looked at
                event = self._events[me] = threading.Event()
                event.set()
            return event

    def set(self) -> None:
        with self._guard:
            for event in self._events.values():
                event.set()

    def clear(self) -> None:
        self._mine().clear()

    def wait(self, timeout: float | None = None) -> bool:
        event = self._mine()
        if not self.lock.held():
            return event.wait(timeout)
        self.lock.release()
        try:
            return event.wait(timeout)
        finally:
            self.lock.acquire()

    def leave(self) -> None:
        """This thread waits no more (a lane's end)."""
        with self._guard:
            self._events.pop(threading.get_ident(), None)
