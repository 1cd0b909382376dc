"""The engine's side of the runs' channels (the agents' side, and the layout, in _outbox).

A run's channel is made anew when the engine opens the run, its outbox held open by the
engine until the channel is retired (what an agent later swaps in at its path is never
what the engine reads or truncates); closed when the run ends; retired (read a last time,
then removed) before the engine's next run of that lane, or at its next start. Anything
that is not what the engine made there (a FIFO, a socket, a link, a directory, a file in
a directory's place) is renamed aside, under a name saying what it was, and reported to
the caller, who records it: it never stops the engine or a resume.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
from typing import NamedTuple

from ._atomic import (DIR_MODE, FILE_MODE, disk, durable_write_done, make_dirs, unlink_quietly,
                      write_atomic)
from ._work import write_at
from ._outbox import (CHUNK, HEADER_BYTES, INBOX, MAX_EVENT_BYTES, OUTBOX, RUN_ID, RUNS,
                      OutboxLine, parse_line, read_header)

MARKS = "runs"   # in the control plane: each channel's mark (see `mark`)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KINDS = ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symlink"),
          (stat.S_ISDIR, "directory"), (stat.S_ISREG, "file"))


class SetAside(NamedTuple):
    """What the engine found where a channel's file or directory belongs, and moved."""
    path: str       # in the work area
    was: str        # fifo, socket, symlink, directory, file, device
    moved_to: str   # in the work area


class RunChannel:
    """One run's outbox and inbox, as the engine makes, reads and removes them."""

    def __init__(self, work, run: str, max_bytes: int = MAX_EVENT_BYTES):
        self._work = work
        self.run = run
        self.max_bytes = max_bytes
        self.open = False
        self.set_aside: list[SetAside] = []   # found in its places: the caller records them
        self._dir: int | None = None     # runs/<run>/, as made
        self._outbox: int | None = None  # its outbox, held from make (or find) to retire
        self._inbox: int | None = None
        self._phase: str | None = None
        self._offset = 0

    @property
    def outbox_path(self) -> str:
        return os.path.join(self._work.path, RUNS, self.run, OUTBOX)

    # --- its life ---

    def make(self) -> None:
        """The channel made anew, open: an empty inbox, the outbox headed with the run.
        Whatever is at its place (a dead run's of the same id was retired at the start: an
        agent's, planted) is set aside first."""
        runs = _runs_dir(self._work, self.set_aside)
        try:
            with disk(self.outbox_path):
                if _exists(runs, self.run):
                    self.set_aside.append(_set_aside(runs, self.run, RUNS, runs, RUNS))
                os.mkdir(self.run, DIR_MODE, dir_fd=runs)
                self._dir = os.open(self.run, _DIR, dir_fd=runs)
                os.mkdir(INBOX, DIR_MODE, dir_fd=self._dir)
                self._inbox = os.open(INBOX, _DIR, dir_fd=self._dir)
                self._outbox = os.open(OUTBOX, os.O_RDWR | os.O_CREAT | os.O_EXCL
                                       | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE,
                                       dir_fd=self._dir)
        finally:
            os.close(runs)
        self.open = True
        self._head()

    def close(self, take) -> None:
        """The run is over: the lines it sent until now go to `take` (as its), under the
        lock its appenders take; then the outbox says closed, and what comes after is
        read as a closed run's."""
        if self._outbox is None or not self.open:
            return
        fcntl.flock(self._outbox, fcntl.LOCK_EX)
        try:
            take(self._read())
            self.open = False
            self._head()
        finally:
            fcntl.flock(self._outbox, fcntl.LOCK_UN)

    def read_new(self) -> list[OutboxLine]:
        """The complete lines appended since the last read."""
        return [] if self._outbox is None or self._phase is None else self._read()

    def recover(self, mark: dict | None, last_via) -> list[OutboxLine]:
        """A dead engine's channel (found by `leftover_channels`): the lines no engine
        read, to be refused: those after its mark (the place read up to when the mark was
        made) or after `last_via` (the newest place the bus records after the mark),
        whichever is later, in the outbox's phase now."""
        if self._outbox is None:
            return []
        head = read_header(self._outbox)
        if head is None:
            return []
        self._phase = str(head["phase"])
        self._offset = os.pread(self._outbox, HEADER_BYTES, 0).find(b"\n") + 1
        for place in ((mark or {}).get("place"), last_via):
            if isinstance(place, list) and len(place) == 2 and place[0] == self._phase \
                    and type(place[1]) is int:
                self._offset = max(self._offset, place[1])
        return self._read()

    @property
    def place(self) -> list:
        """[phase, offset]: where the engine has read its outbox up to."""
        return [self._phase, self._offset]

    def retire(self, take) -> None:
        """Read a last time (to `take`, as lines of a run that is over), then removed."""
        try:
            if self._outbox is not None and self._phase is not None:
                fcntl.flock(self._outbox, fcntl.LOCK_EX)
                take(self._read())
        finally:
            self._forget()
        runs = _runs_dir(self._work, self.set_aside)
        try:
            if self._dir is not None and _same(runs, self.run, self._dir):
                shutil.rmtree(self.run, dir_fd=runs, ignore_errors=True)
        finally:
            os.close(runs)
            if self._dir is not None:
                os.close(self._dir)
                self._dir = None

    def release(self) -> None:
        """The engine stops: the channel is left as it is (the next start retires it)."""
        self._forget()
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def _forget(self) -> None:
        for fd in (self._outbox, self._inbox):
            if fd is not None:
                os.close(fd)
        self._outbox = self._inbox = None

    # --- replies ---

    def reply(self, request_id: str, data: dict) -> None:
        """`inbox/<request id>.json`, replaced whole (a temp file renamed in: the tool
        watching the inbox sees it whole); no fsync (asked again after a crash)."""
        if self._inbox is None or not _REQUEST_ID.fullmatch(request_id):
            return
        name = f"{request_id}.json"
        path = os.path.join(self._work.path, RUNS, self.run, INBOX, name)
        body = json.dumps(data).encode()
        with disk(path):
            try:
                write_at(self._inbox, name, body)
            except OSError as e:
                if e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise
                rel = f"{RUNS}/{self.run}/{INBOX}"
                self.set_aside.append(_set_aside(self._inbox, name, rel, self._inbox, rel))
                write_at(self._inbox, name, body)
        durable_write_done("reply", path, durable=False)

    # --- the outbox ---

    def _head(self) -> None:
        """A new phase: the outbox emptied and headed (open or closed); the caller holds
        the lock, or nobody can append yet."""
        assert self._outbox is not None
        self._phase = os.urandom(6).hex()
        head = (json.dumps({"phase": self._phase, "run": self.run, "open": self.open,
                            "engine": os.getpid(), "max_event_bytes": self.max_bytes})
                + "\n").encode()
        with disk(self.outbox_path):
            os.ftruncate(self._outbox, 0)
            os.pwrite(self._outbox, head, 0)
        self._offset = len(head)
        durable_write_done("outbox-reset", self.outbox_path, durable=False)

    def _read(self) -> list[OutboxLine]:
        """Complete lines from the cursor on; a line longer than a request may be is
        skipped without being held in memory whole."""
        assert self._outbox is not None
        fd, lines = self._outbox, []
        size = os.fstat(fd).st_size
        limit = self.max_bytes + HEADER_BYTES   # the request's own fields around the payload
        while self._offset < size:
            data = os.pread(fd, min(size - self._offset, limit + 1), self._offset)
            cut = data.find(b"\n")
            if cut == -1:
                if len(data) <= limit:
                    break   # a line still being written: later
                end = _skip_line(fd, self._offset + len(data), size)
                if end is None:
                    break
                lines.append(OutboxLine([self._phase, end], None,
                                        f"a request of {end - self._offset - 1} bytes: at "
                                        f"most {self.max_bytes} bytes of payload are taken"))
                self._offset = end
                continue
            while cut != -1:
                raw, end = data[:cut], self._offset + cut + 1
                lines.append(parse_line(raw, [self._phase, end]))
                data, self._offset = data[cut + 1:], end
                cut = data.find(b"\n")
        return lines


def leftover_channels(work, max_bytes: int = MAX_EVENT_BYTES
                      ) -> tuple[list[RunChannel], list[SetAside]]:
    """At the engine's start: the channels a dead engine left in the work area (each
    with its outbox held, when it has one that is a file), to recover and retire; and
    what was set aside on the way (anything in `runs/` that is no channel, an outbox
    that is no file)."""
    aside: list[SetAside] = []
    found: list[RunChannel] = []
    runs = _runs_dir(work, aside)
    try:
        for name in sorted(os.listdir(runs)):
            if name.startswith("."):   # what was set aside before
                continue
            kind = _kind(os.lstat(name, dir_fd=runs).st_mode)
            if kind != "directory" or not RUN_ID.fullmatch(name):
                aside.append(_set_aside(runs, name, RUNS, runs, RUNS))
                continue
            channel = RunChannel(work, name, max_bytes)
            try:
                channel._dir = os.open(name, _DIR, dir_fd=runs)
            except PermissionError:   # made unreadable by the run
                aside.append(_set_aside(runs, name, RUNS, runs, RUNS))
                continue
            channel._outbox = _outbox_of(channel._dir, name, runs, aside)
            found.append(channel)
    finally:
        os.close(runs)
    for channel in found:
        aside += channel.set_aside
        channel.set_aside = []
    return found, aside


def _outbox_of(folder: int, run: str, runs: int, aside: list[SetAside]) -> int | None:
    """A dead run's outbox, opened; anything but a file there is set aside (out of the
    channel, which is removed)."""
    try:
        fd = os.open(OUTBOX, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENOTDIR,
                           errno.EACCES):
            raise
        aside.append(_set_aside(folder, OUTBOX, f"{RUNS}/{run}", runs, RUNS, prefix=run))
        return None
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    aside.append(_set_aside(folder, OUTBOX, f"{RUNS}/{run}", runs, RUNS, prefix=run))
    return None


def _runs_dir(work, aside: list[SetAside]) -> int:
    """`runs/` of the work area, made when missing; anything else in its place set aside."""
    root = work.dir_fd("")
    try:
        try:
            return os.open(RUNS, _DIR, dir_fd=root)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EACCES):
                raise
            aside.append(_set_aside(root, RUNS, "", root, ""))
        try:
            os.mkdir(RUNS, DIR_MODE, dir_fd=root)
        except FileExistsError:
            pass
        return os.open(RUNS, _DIR, dir_fd=root)
    finally:
        os.close(root)


def _set_aside(src: int, name: str, src_rel: str, dst: int, dst_rel: str,
               prefix: str = "") -> SetAside:
    kind = _kind(os.lstat(name, dir_fd=src).st_mode)
    new = f".{prefix + '.' if prefix else ''}{name}.set-aside-{kind}-{os.urandom(3).hex()}"
    os.rename(name, new, src_dir_fd=src, dst_dir_fd=dst)
    return SetAside(os.path.join(src_rel, name), kind, os.path.join(dst_rel, new))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "device")


def _exists(folder: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=folder)
        return True
    except FileNotFoundError:
        return False


def _same(folder: int, name: str, fd: int) -> bool:
    try:
        now = os.lstat(name, dir_fd=folder)
    except OSError:
        return False
    then = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino)


def _skip_line(fd: int, start: int, size: int) -> int | None:
    while start < size:
        cut = os.pread(fd, CHUNK, start).find(b"\n")
        if cut != -1:
            return start + cut + 1
        start += CHUNK
    return None


# --- the marks: where the bus's records of a channel begin (in the control plane) ---

def mark(session, run: str, seq: int, place: list) -> None:
    """Durably: the bus's last seq now, and where the run's outbox is read up to (every
    line before it recorded). At the next start, the records of a channel a dead engine
    left are looked for after its mark's seq only (and the lines before its place are not
    read again), so a start reads the bus back no further than the last mark of the runs
    it recovers, never the session's history. Made when the run opens and once it is
    closed: a crash between a read and the next mark finds the records of that read
    after the mark before it."""
    folder = os.path.join(session.dir, MARKS)
    make_dirs(folder)
    write_atomic(os.path.join(folder, run), json.dumps({"seq": seq, "place": place}),
                 "run-mark")


def mark_of(session, run: str) -> dict | None:
    """The mark of `run` (None: none, or unreadable: no record of its channel was made)."""
    try:
        with open(os.path.join(session.dir, MARKS, run), "rb") as f:
            found = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and type(found.get("seq")) is int else None


def marked(session) -> list[str]:
    try:
        return [n for n in os.listdir(os.path.join(session.dir, MARKS)) if RUN_ID.fullmatch(n)]
    except OSError:
        return []


def unmark(session, run: str) -> None:
    unlink_quietly(os.path.join(session.dir, MARKS, run))


def watch_outbox(path: str, wakeup):
    """Set `wakeup` at each write to the run's outbox (inotify on the file; its directory
    through watchdog where that fails). Returns the function that stops it."""
    from ._watch import FileWatch, watch
    try:
        file_watch = FileWatch(path, wakeup)
    except OSError:
        return watch([os.path.dirname(path)], wakeup)
    file_watch.start()
    return file_watch.stop
