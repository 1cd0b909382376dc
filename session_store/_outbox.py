"""The outboxes: how agents' tools reach the engine, through the work area alone.

Agents never write the control plane. Each agent run has its own channel in the session's
work area, made by the engine when it opens the run: `runs/<run id>/outbox.jsonl`, where
the run's tools (`ralph emit`, `ralph tools ...`, `ralph mcp`) append requests, one JSON
line each, under an exclusive flock, and `runs/<run id>/inbox/`, where the engine puts
the replies a tool waits for (an answer, a poll, an approval's decision) as
`<request id>.json`. The run finds them from its environment (RALPH_SESSION_DIR and
RALPH_RUN_ID). A line is the run's whose outbox it is in, never what it claims; the engine
trusts nothing else in it either (the source, the role, the iteration are its own, from
the run it opened), and records what it accepts on the bus.

The tools only ever read their inbox: a sandbox may show it to the run read-only
(`run_inbox` names it), so that no process of the run can forge a reply there.

The first line of an outbox is the engine's header: its run, whether the run is open, and
a phase id. Closing the run reads what is left and records it, then truncates the file
and writes a closed header, under the lock every appender takes: once a run is closed,
nothing it appends is taken as its (the engine records it as refused). Each record the
engine makes of a line says where it came from (`via`: [phase, offset after the line]),
so after a crash the engine knows which lines it never read (refused: their run died with
its engine) and records none twice. The engine's side is in _runs.

A live engine holds `engine.lock` (flock) for its lifetime: a tool finding it free knows
nobody will hear it. Stdlib only: this is `ralph emit`'s cold path.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat

from ._atomic import FILE_MODE, disk, durable_write_done, read_nofollow
from ._errors import BadInput

RUNS = "runs"
OUTBOX = "outbox.jsonl"
ENGINE_LOCK = "engine.lock"
INBOX = "inbox"
MAX_EVENT_BYTES = 1 << 20          # the default cap of one request (event_loop.max_event_bytes)
KINDS = ("event", "ask", "ask.gone", "poll", "refusal", "approve")
HEADER_BYTES = 4096
CHUNK = 1 << 20
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def run_dir(work_dir: str, run: str) -> str:
    """The channel of the run `run` (its outbox and inbox), in the work area `work_dir`."""
    if not RUN_ID.fullmatch(run):
        raise BadInput(f"run id {run[:80]!r}: expected [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}")
    return os.path.join(work_dir, RUNS, run)


def outbox_path(work_dir: str, run: str) -> str:
    return os.path.join(run_dir(work_dir, run), OUTBOX)


def run_inbox(work_dir: str, run: str) -> str:
    """The directory where the engine puts its replies to the run `run`: the run's tools
    only read it, so a sandbox may mount it read-only inside the run (made before the run
    starts, removed by the engine after it)."""
    return os.path.join(run_dir(work_dir, run), INBOX)


def reply_path(work_dir: str, run: str, request_id: str) -> str:
    return os.path.join(run_inbox(work_dir, run), f"{request_id}.json")


def new_request_id() -> str:
    return "r" + os.urandom(8).hex()


# --- the agents' side ---

def header(work_dir: str, run: str) -> dict | None:
    """The engine's header of the run's outbox (None: no engine has opened it)."""
    try:
        fd = os.open(outbox_path(work_dir, run), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except (OSError, BadInput):
        return None
    try:
        return read_header(fd)
    finally:
        os.close(fd)


def post(work_dir: str, request: dict) -> str | None:
    """Append one request of the run `request["run"]` for the engine, to that run's
    outbox. Returns why the engine will not take it as the run's (its run is over, no
    engine runs the session), else None. The line is written either way (where the
    engine made the run's outbox): the engine records what it refuses."""
    run = request.get("run")
    if not isinstance(run, str) or not RUN_ID.fullmatch(run):
        return ("it names no run: requests come from agent runs only (RALPH_RUN_ID)"
                if run is None else f"run {str(run)[:80]!r} is no run of this session")
    path = outbox_path(work_dir, run)
    try:
        with disk(path):   # never made here: the engine makes it when it opens the run
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return f"run {run} has no outbox here: its run is over, or no engine ran it"
        if e.errno == errno.ELOOP:
            raise BadInput(f"{path}: a symlink; the outbox is never written through "
                           f"one") from None
        if e.errno in (errno.EISDIR, errno.ENXIO):
            raise BadInput(f"{path}: not a file (the engine sets it aside)") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):   # a FIFO: nobody would read it
            raise BadInput(f"{path}: not a file (the engine sets it aside)")
        fcntl.flock(fd, fcntl.LOCK_EX)
        why = not_heard(work_dir, read_header(fd), run)
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
    """Why a request of `run` in its outbox (headed `head`) is not taken now, else None."""
    if head is None or not engine_alive(work_dir):
        return "no engine runs this session (it stopped or died)"
    if head.get("run") != run or head.get("open") is not True:
        return f"run {run} is over (the engine stopped it or it finished)"
    return None


def inbox_watch(work_dir: str, run: str, woken):
    """inotify on the run's inbox, started: a reply renamed in sets `woken` at once
    (`stop()` ends it); None where it cannot watch (the waiter then looks every 50 ms)."""
    from ._watch import IN_LANDED, FileWatch
    try:
        watch = FileWatch(run_inbox(work_dir, run), woken, IN_LANDED)
    except (OSError, BadInput):
        return None
    watch.start()
    return watch


def engine_alive(work_dir: str) -> bool:
    try:
        fd = os.open(os.path.join(work_dir, ENGINE_LOCK), os.O_RDONLY | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def read_reply(work_dir: str, run: str, request_id: str) -> dict | None:
    """The engine's reply to the request, read (never moved or removed: the inbox may be
    read-only to the run; the engine clears it)."""
    try:
        data = json.loads(read_nofollow(reply_path(work_dir, run, request_id), CHUNK * 8))
    except (OSError, ValueError, RecursionError, BadInput):
        return None
    return data if isinstance(data, dict) else None


def read_header(fd: int) -> dict | None:
    first = os.pread(fd, HEADER_BYTES, 0).split(b"\n", 1)[0]
    try:
        head = json.loads(first)
    except ValueError:
        return None
    return head if isinstance(head, dict) and "phase" in head else None


# --- the engine's side (the rest in _runs) ---

class OutboxLine:
    """One request as the engine read it: `request` (a dict), or why it is none."""
    __slots__ = ("via", "request", "problem")

    def __init__(self, via: list, request: dict | None, problem: str | None = None):
        self.via = via                # [phase, offset just past the line]
        self.request = request
        self.problem = problem


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


def parse_line(raw: bytes, via: list) -> OutboxLine:
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
