"""The outbox: how agents' tools reach the engine, through the work area alone.

Agents never write the control plane. Their tools (`ralph emit`, `ralph tools ...`,
`ralph mcp`) append requests to `outbox.jsonl` in the session's work area, one JSON line
each, under an exclusive flock; the engine reads them, trusts nothing in them (the
source, the role, the iteration are the engine's own, from the run it opened), and
records what it accepts on the bus. Replies a tool waits for (an answer, a poll) come
back as `inbox/<request id>.json`.

The first line is the engine's header: which runs are open now (one, or a parallel
batch's), and a phase id. Opening or closing a run reads what is left and records it, then truncates the file and writes a
new header, all under the lock every appender takes: once a run is closed, nothing it
appends is taken as its. Each record the engine makes of a line says where it came from
(`via`: [phase, offset after the line]), so after a crash the engine knows which lines it
never read (they are refused: their run died with its engine) and records none twice;
and no line is cut off before its record is made.

A live engine holds `engine.lock` (flock) for its lifetime: a tool finding it free knows
nobody will hear it. Stdlib only: this is `ralph emit`'s cold path.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re

from ._atomic import FILE_MODE, disk, durable_write_done, read_nofollow
from ._errors import BadInput

OUTBOX = "outbox.jsonl"
ENGINE_LOCK = "engine.lock"
INBOX = "inbox"
MAX_EVENT_BYTES = 1 << 20          # the default cap of one request (event_loop.max_event_bytes)
KINDS = ("event", "ask", "ask.gone", "poll", "refusal", "approve")
_HEADER_BYTES = 4096
_CHUNK = 1 << 20


def outbox_path(work_dir: str) -> str:
    return os.path.join(work_dir, OUTBOX)


def reply_path(work_dir: str, request_id: str) -> str:
    return os.path.join(work_dir, INBOX, f"{request_id}.json")


def new_request_id() -> str:
    return "r" + os.urandom(8).hex()


# --- the agents' side ---

def header(work_dir: str) -> dict | None:
    """The engine's header of the outbox (None: no engine has opened it)."""
    try:
        fd = os.open(outbox_path(work_dir), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _header(fd)
    finally:
        os.close(fd)


def post(work_dir: str, request: dict) -> str | None:
    """Append one request for the engine. Returns why the engine will not take it as the
    run's (its run is over, no engine runs the session), else None. The line is written
    either way (where an engine made the outbox): the engine records what it refuses."""
    path = outbox_path(work_dir)
    try:
        with disk(path):   # never made here: an engine makes it, and reads it
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return "no engine has run this session here (it has no outbox)"
        if e.errno != errno.ELOOP:
            raise
        raise BadInput(f"{path}: a symlink; the outbox is never written through one") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        why = not_heard(work_dir, _header(fd), request.get("run"))
        line = (json.dumps(request, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        with disk(path):
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line   # a torn line (an appender killed mid-write) stays apart
            written = os.write(fd, line)
            if written != len(line):
                os.ftruncate(fd, size)
                raise OSError(errno.ENOSPC, f"short write to {path}")
    finally:
        os.close(fd)
    durable_write_done("outbox", path, durable=False)
    return why


def not_heard(work_dir: str, head: dict | None, run: str | None) -> str | None:
    """Why a request of `run` (None: from outside any run) is not taken now, else None."""
    if head is None or not engine_alive(work_dir):
        return "no engine runs this session (it stopped or died)"
    runs = head.get("runs")
    runs = [str(r) for r in runs] if isinstance(runs, list) else []
    if run is not None and run not in runs:
        now = "no run is open" if not runs else f"run {runs[0]} is running now" \
            if len(runs) == 1 else f"runs {', '.join(runs)} are running now"
        return f"run {run} is over (the engine stopped it or it finished); {now}"
    return None


def inbox_watch(work_dir: str, woken):
    """inotify on the inbox, started: a reply renamed in sets `woken` at once (`stop()`
    ends it); None where it cannot watch (the waiter then looks every 50 ms)."""
    from ._watch import IN_LANDED, FileWatch
    try:
        watch = FileWatch(os.path.join(work_dir, INBOX), woken, IN_LANDED)
    except OSError:
        return None
    watch.start()
    return watch


def engine_alive(work_dir: str) -> bool:
    try:
        fd = os.open(os.path.join(work_dir, ENGINE_LOCK), os.O_RDONLY | os.O_NOFOLLOW
                     | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def read_reply(work_dir: str, request_id: str) -> dict | None:
    try:
        data = json.loads(read_nofollow(reply_path(work_dir, request_id), _CHUNK * 8))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _header(fd: int) -> dict | None:
    first = os.pread(fd, _HEADER_BYTES, 0).split(b"\n", 1)[0]
    try:
        head = json.loads(first)
    except ValueError:
        return None
    return head if isinstance(head, dict) and "phase" in head else None


# --- the engine's side ---

def hold_engine_lock(work) -> int:
    """The engine's presence in the work area, held for its lifetime (agents' tools probe
    it): always a fresh file, flocked before it is renamed in, so one an agent planted or
    holds is simply replaced. Returns the fd (closing it ends the presence)."""
    folder = work.dir_fd("")
    tmp = f".{ENGINE_LOCK}.{os.getpid()}.tmp"
    try:
        with disk(os.path.join(work.path, ENGINE_LOCK)):
            try:
                os.unlink(tmp, dir_fd=folder)
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, FILE_MODE, dir_fd=folder)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, f"{os.getpid()}\n".encode())
            os.rename(tmp, ENGINE_LOCK, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        os.close(folder)
    return fd


def holds_engine_lock(work, fd: int) -> bool:
    """Whether `fd` (hold_engine_lock's) is still the work area's engine.lock (a `git
    clean` may have removed it, an agent replaced it)."""
    try:
        now = os.lstat(os.path.join(work.path, ENGINE_LOCK))
    except OSError:
        return False
    then = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino)


class OutboxLine:
    """One request as the engine read it: `request` (a dict), or why it is none. (A
    plain class: `typing` would cost `ralph emit` milliseconds to import.)"""
    __slots__ = ("via", "request", "problem")

    def __init__(self, via: list, request: dict | None, problem: str | None = None):
        self.via = via                # [phase, offset just past the line]
        self.request = request
        self.problem = problem


class Outbox:
    """The engine's reader of one work area's outbox (the WorkArea writes it)."""

    def __init__(self, work, max_bytes: int = MAX_EVENT_BYTES):
        self._work = work
        self.max_bytes = max_bytes
        self._phase: str | None = None
        self._offset = 0

    def recover(self, last_via) -> list[OutboxLine]:
        """At the engine's start: the lines no engine read (after `last_via`, the newest
        place the bus records), to be refused. The caller records them, then resets
        (which hands it whatever came meanwhile)."""
        fd = self._open()
        if fd is None:
            return []
        try:
            head = _header(fd)
            if head is None:
                return []
            self._phase = head["phase"]
            end = os.pread(fd, _HEADER_BYTES, 0).find(b"\n") + 1
            self._offset = end
            if isinstance(last_via, list) and len(last_via) == 2 and \
                    last_via[0] == self._phase and isinstance(last_via[1], int):
                self._offset = max(end, last_via[1])
            return self._read(fd)
        finally:
            os.close(fd)

    def reset(self, runs: list[str], take) -> None:
        """The runs open from now on (several: a parallel batch's). The lines not read yet
        are handed to `take` first (as the old phase's), under the lock, before the file
        is emptied: a crash in between leaves them, and their records' `via`, for
        `recover`. Then a new phase begins, empty."""
        path = outbox_path(self._work.path)
        fd = self._work_fd()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._phase is not None:
                take(self._read(fd))
            self._phase = os.urandom(6).hex()
            head = (json.dumps({"phase": self._phase, "runs": runs, "engine": os.getpid(),
                                "max_event_bytes": self.max_bytes}) + "\n").encode()
            with disk(path):
                os.ftruncate(fd, 0)
                os.write(fd, head)
            self._offset = len(head)
        finally:
            os.close(fd)
        durable_write_done("outbox-reset", path, durable=False)

    def read_new(self) -> list[OutboxLine]:
        """The complete lines appended since the last read."""
        if self._phase is None:
            return []
        fd = self._open()
        if fd is None:
            return []
        try:
            return self._read(fd)
        finally:
            os.close(fd)

    def _open(self) -> int | None:
        try:
            return os.open(outbox_path(self._work.path), os.O_RDONLY | os.O_NOFOLLOW
                           | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None

    def _work_fd(self) -> int:
        """The outbox opened for the engine's rewrite, from the work area's descriptor (a
        link planted in its place is set aside by the work area)."""
        folder = self._work.dir_fd("")
        try:
            try:
                return os.open(OUTBOX, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                               FILE_MODE, dir_fd=folder)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    raise
                os.unlink(OUTBOX, dir_fd=folder)
                return os.open(OUTBOX, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                               FILE_MODE, dir_fd=folder)
        finally:
            os.close(folder)

    def _read(self, fd: int) -> list[OutboxLine]:
        """Complete lines from the cursor on; a line longer than a request may be is
        skipped without being held in memory whole."""
        lines: list[OutboxLine] = []
        size = os.fstat(fd).st_size
        limit = self.max_bytes + _HEADER_BYTES   # the request's own fields around the payload
        while self._offset < size:
            data = os.pread(fd, min(size - self._offset, limit + 1), self._offset)
            cut = data.find(b"\n")
            if cut == -1:
                if len(data) <= limit:
                    break   # a line still being written: later
                end = self._skip_line(fd, self._offset + len(data), size)
                if end is None:
                    break
                lines.append(OutboxLine([self._phase, end], None,
                                  f"a request of {end - self._offset - 1} bytes: at most "
                                  f"{self.max_bytes} bytes of payload are taken"))
                self._offset = end
                continue
            while cut != -1:
                raw, end = data[:cut], self._offset + cut + 1
                lines.append(_parse(raw, [self._phase, end]))
                data, self._offset = data[cut + 1:], end
                cut = data.find(b"\n")
        return lines

    @staticmethod
    def _skip_line(fd: int, start: int, size: int) -> int | None:
        while start < size:
            cut = os.pread(fd, _CHUNK, start).find(b"\n")
            if cut != -1:
                return start + cut + 1
            start += _CHUNK
        return None


def _parse(raw: bytes, via: list) -> OutboxLine:
    if not raw.strip():
        return OutboxLine(via, None, "an empty line")
    try:
        text = raw.decode("utf-8")   # strictly: json.loads would take UTF-16 and half a character
    except UnicodeDecodeError:
        return OutboxLine(via, None, "not UTF-8 text")
    try:
        request = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return OutboxLine(via, None, "not a JSON object")
    if _ESCAPED_SURROGATE.search(text) and not _whole_characters(request):
        # "\ud800" alone is half a character: no record could hold it as UTF-8
        return OutboxLine(via, None, "half a character (a lone surrogate escape)")
    if not isinstance(request, dict) or request.get("kind") not in KINDS:
        return OutboxLine(via, None, f"not a request (kind: one of {', '.join(KINDS)})")
    for key in ("id", "run"):
        value = request.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 128):
            return OutboxLine(via, None, f"$.{key}: expected a short string")
    return OutboxLine(via, request)


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _whole_characters(request: dict) -> bool:
    try:
        json.dumps(request, ensure_ascii=False).encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")
