"""events.jsonl: the append-only bus.

Stdlib only: `ralph emit` imports this module on its cold path.

An appender takes an exclusive flock, reads the last `seq`, cuts off a torn last line
(a crash mid-append), writes its line in one O_APPEND write, fsyncs and releases.
Readers skip a torn last line and never fail on one.

Exactly once (`append_once`, the Session's `once` and `done`): a record may carry a
dedupe key, the top-level field `once`, which the caller builds ("human.timeout:<qid>").
It is appended only if no record with that key was appended before: the check and the
append are made under the bus's one lock, against an index of the keys on the bus
(`OnceIndex`: built from the index of keys kept beside the bus, _once, and the bus past
what it covers, then caught up from the byte offset it had read to, so each call costs
only the lines appended since, and a start reads no history). The key is in the appended
line itself, so there is no second write to tear: after a kill -9 at any point the next
engine finds the line complete (done) or not there / torn (not done: a torn last line is
no record and no key, and the next appender cuts it off). Never twice, never half.

That makes the record exactly once. An effect outside the bus cannot join that one
write, so its caller picks a side of the kill:
  - record-then-effect (`if once(...): effect()`): a kill between them loses the effect
    (at most once); use it where losing the effect is the lesser harm;
  - effect-then-record (`if not done(key): effect(); once(key, ...)`): a kill between
    them repeats the effect (at least once); the effect must be idempotent (an atomic
    file rewrite keyed by the same id, a question resolved again) for the pair to be
    exactly once.
A kill -9 after the line's write and before its fsync leaves it done (the page cache
outlives the process); a power cut there may lose it, but then `once` never returned,
so no effect after it happened either. Who uses it, and on which side: a transition's
record comes after its metadata (the commit point), and forgetting the guidance it
delivered after the record (lost on a kill: the guidance stays for a re-run); a
question's human.question comes after its question file (asking's commit point), its
human.response or human.timeout beside the question's resolve, which the next engine
repeats idempotently whichever side the kill fell on; a blocker's count record comes
before its trace in the user's workspace (lost on a kill, never written twice).
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
from contextlib import contextmanager
from datetime import datetime, timezone

from . import _lock
from . import _once
from ._atomic import FILE_MODE, disk, durable_write_done, fsync
from ._errors import BadInput

EVENTS_FILE = "events.jsonl"
REFUSED = "emit.refused"   # the record of a request the engine did not take
ONCE = "once"              # a record's dedupe key (see above)
_ONCE_BYTES = b'"once"'    # in every line that has the field (and a few others)
_TAIL_CHUNK = 65536
_READ_CHUNK = 1 << 20
# A line longer than this is no event (an agent's event is capped well below it): readers
# skip it without holding it whole, so one huge line costs a view no more than its read.
MAX_RECORD_BYTES = 2 << 20


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _last_seq_and_trim(fd: int) -> int:
    """Return the last complete record's seq; truncate a torn tail. Caller holds the lock."""
    size = os.fstat(fd).st_size
    whole = _complete_end(fd, size)
    if whole != size:
        os.ftruncate(fd, whole)
    for record in _backwards(fd, whole):
        try:
            return int(record["seq"])
        except (ValueError, TypeError, OverflowError):
            continue  # not a seq (`"seq": Infinity`, `"seq": "x"`)
    return 0


@contextmanager
def locked(session_dir: str, wait_seconds: float | None = None):
    """The bus held exclusively (its fd): appends, and the engine opening or closing an
    agent run, are ordered by this one lock. With `wait_seconds`, an appender that holds
    it longer (stopped mid-append) is not waited for beyond that: the engine goes on to
    stop it."""
    path = os.path.join(session_dir, EVENTS_FILE)
    try:
        with disk(path):
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, FILE_MODE)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise BadInput(f"{path}: a symlink; the bus is never written through one") from None
    try:
        if wait_seconds is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            _lock.flock_within(fd, wait_seconds)   # not had: go on (see above)
        yield fd
    finally:
        os.close(fd)  # closing releases the flock


def append_event(session_dir: str, topic: str, payload=None, *, source: str = "engine",
                 iteration: int | None = None, state: str | None = None,
                 ts: str | None = None, run: str | None = None, via: list | None = None) -> dict:
    """Append one record to the session's bus and return it (with its seq). `run`: the
    agent run it came from; `via`: where in the work area's outbox (see _outbox)."""
    record = _append(session_dir, dict(topic=topic, payload=payload, source=source,
                                       iteration=iteration, state=state, ts=ts, run=run,
                                       via=via))
    assert record is not None   # without a key, it always appends
    return record


def append_once(session_dir: str, index: "OnceIndex", key: str, topic: str, payload=None,
                **fields) -> dict | None:
    """Append the record with dedupe key `key` unless one with that key is on the bus:
    the record, or None when it was there already. `index` is the caller's OnceIndex of
    this bus, caught up here under the lock (so concurrent appenders agree)."""
    if not isinstance(key, str) or not key:
        raise BadInput(f"once key {key!r}: expected a non-empty string")
    return _append(session_dir, dict(topic=topic, payload=payload, **fields), key, index)


def _append(session_dir: str, fields: dict, key: str | None = None,
            index: "OnceIndex | None" = None) -> dict | None:
    path = os.path.join(session_dir, EVENTS_FILE)
    with locked(session_dir) as fd, disk(path):
        seq = _last_seq_and_trim(fd) + 1
        size = os.fstat(fd).st_size
        if index is not None:
            index.catch_up(size)
            if key in index.keys:
                return None
        record = {"seq": seq, "ts": fields.get("ts") or now_iso(), "topic": fields["topic"],
                  "payload": fields.get("payload"), "source": fields.get("source", "engine"),
                  "iteration": fields.get("iteration"), "state": fields.get("state")}
        for name in ("run", "via"):
            if fields.get(name) is not None:
                record[name] = fields[name]
        if key is not None:
            record[ONCE] = key
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        try:
            written = os.write(fd, line)
            if written != len(line):   # a short write: a torn line (a full disk)
                raise OSError(errno.ENOSPC, f"short write to {path}")
            fsync(fd)
        except OSError:
            os.ftruncate(fd, size)   # never leave a torn or unflushed line behind
            raise
        if index is not None and key is not None:
            index.appended(key, size + len(line))
    durable_write_done("event", path)
    if index is not None:
        index.flush()
    return record


class OnceIndex:
    """The dedupe keys on one bus, read up to `offset` (just past a complete line): first
    from the index beside the bus (_once), then from the bus past what it covers; what
    is read, and the keys this process appends, are added to the index in turn."""

    def __init__(self, session_dir: str):
        self.dir = session_dir
        self.keys: set[str] = set()
        self.offset = 0
        self._loaded = False
        self._indexed = 0              # the index covers the bus up to here
        self._unindexed: set[str] = set()   # the keys between there and `offset`

    def catch_up(self, end: int | None = None) -> None:
        """Read the lines appended since the last look (up to `end`, a complete line's
        end, when the caller holds the lock and knows it). A bus shorter than what was
        read is another one (replaced): read again from its start."""
        end = complete_size(self.dir) if end is None else end
        if not self._loaded:
            self._loaded = True
            self.keys, self.offset = _once.load(self.dir, end)
            self._indexed = self.offset
        if end < self.offset:
            self.keys.clear()
            self.offset = self._indexed = 0
            self._unindexed.clear()
        if end == self.offset:
            return
        # a line without the field's bytes has no key: not parsed
        records, self.offset = read_events(self.dir, self.offset, having=_ONCE_BYTES)
        found = {r[ONCE] for r in records if isinstance(r.get(ONCE), str)}
        self.keys |= found
        self._unindexed |= found

    def appended(self, key: str, end: int) -> None:
        """This process appended the record of `key`, ending at `end`, right after the
        catch-up made under the same lock."""
        self.keys.add(key)
        self._unindexed.add(key)
        self.offset = end

    def flush(self) -> None:
        """What was read and appended since the last flush, added to the index (after a
        record of this process's: the bus first, then its index)."""
        if self.offset > self._indexed and \
                _once.add(self.dir, self._indexed, self.offset, self._unindexed):
            self._indexed, self._unindexed = self.offset, set()

    def done(self, key: str) -> bool:
        self.catch_up()
        return key in self.keys


def read_events(session_dir: str, offset: int = 0, *,
                having: bytes | None = None) -> tuple[list[dict], int]:
    """Records from byte `offset` on, and the offset just past the last complete line.
    With `having`, only the lines that contain it are parsed (the others are skipped).

    A torn last line is left for later; a complete line that is not a record is skipped,
    and so is one longer than MAX_RECORD_BYTES, without being held whole: the file is read
    in chunks, a line's pieces dropped once they pass the cap.
    """
    fd = _open_for_reading(os.path.join(session_dir, EVENTS_FILE))
    if fd is None:
        return [], offset
    records: list[dict] = []
    pieces: list[bytes] = []   # the line read so far, in order
    size = 0                   # their length; -1 once the line is too long to keep
    done = at = offset         # past the last newline read; where the next chunk starts
    try:   # a pread per chunk (no buffered file object): the engine reads after every step
        end = os.fstat(fd).st_size
        while at < end:
            chunk = os.pread(fd, min(_READ_CHUNK, end - at), at)
            if not chunk:
                break
            at += len(chunk)
            parts = chunk.split(b"\n")
            size = _gather(pieces, size, parts[0])
            if len(parts) == 1:
                continue
            records += _records([b"".join(pieces) if size > 0 else b"", *parts[1:-1]],
                                having)
            pieces = []
            size = _gather(pieces, 0, parts[-1])
            done = at - len(parts[-1])
    finally:
        os.close(fd)
    return records, done


def _without_lone_surrogates(record: dict) -> dict:
    """JSON may escape half a character ("\\ud800"); such text cannot be written back as
    UTF-8 (a report, a prompt, a question would fail), so it becomes U+FFFD here."""
    text = json.dumps(record, ensure_ascii=False)
    try:
        text.encode("utf-8")
        return record
    except UnicodeEncodeError:
        return json.loads(text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))


def _open_for_reading(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        return None   # a symlink planted in place of the bus is not read


def complete_size(session_dir: str) -> int:
    """The byte offset just past the bus's last complete line (a torn tail excluded)."""
    fd = _open_for_reading(os.path.join(session_dir, EVENTS_FILE))
    if fd is None:
        return 0
    try:
        return _complete_end(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _complete_end(fd: int, end: int) -> int:
    """The offset just past the last newline before `end` (0 when there is none)."""
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        cut = os.pread(fd, end - start, start).rfind(b"\n")
        if cut != -1:
            return start + cut + 1
        end = start
    return 0


def backwards(session_dir: str, end: int | None = None):
    """The bus's complete records (before byte `end`), newest first, read from the end back
    in chunks: what a resume or a status looks for is near the end, whatever the size."""
    end = complete_size(session_dir) if end is None else end
    fd = _open_for_reading(os.path.join(session_dir, EVENTS_FILE))
    if fd is None:
        return
    try:
        yield from _backwards(fd, end)
    finally:
        os.close(fd)


def _backwards(fd: int, end: int):
    """Linear in the bytes read: a line that spans chunks is gathered as a list of pieces
    and joined once; one longer than MAX_RECORD_BYTES is skipped, its pieces dropped as
    they come, so a huge line costs its read, never its size in memory."""
    pieces: list[bytes] = []   # the line being read back, its last piece first
    size = 0                   # their length; -1 once the line is too long to keep
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        chunk = os.pread(fd, end - start, start)
        end = start
        parts = chunk.split(b"\n")
        size = _gather(pieces, size, parts[-1])
        if len(parts) == 1:    # no line starts in this chunk: one more piece of it
            continue
        # the piece after the chunk's last newline began the line read so far
        yield from _records([b"".join(reversed(pieces)) if size > 0 else b"",
                             *reversed(parts[1:-1])])
        pieces = []
        size = _gather(pieces, 0, parts[0])
    yield from _records([b"".join(reversed(pieces)) if size > 0 else b""])   # the first line


def _gather(pieces: list[bytes], size: int, piece: bytes) -> int:
    """Add `piece` to the pieces of a line being read; the line's size, -1 past the cap."""
    if size < 0 or size + len(piece) > MAX_RECORD_BYTES:
        pieces.clear()
        return -1
    pieces.append(piece)
    return size + len(piece)


def _records(lines, having: bytes | None = None):
    """The records among whole lines: an empty one, one past the cap, garbage skipped
    (and, with `having`, one without it)."""
    for line in lines:
        if line and len(line) <= MAX_RECORD_BYTES and (having is None or having in line):
            record = _record(line)
            if record is not None:
                yield record


def events_after(session_dir: str, seq: int) -> list[dict]:
    """The complete records whose seq is past `seq`, oldest first: a reader's cursor is a
    seq, never a byte offset. Read from the end back, so a cursor near the end costs what
    is new, whatever the bus's size."""
    newer = []
    for record in backwards(session_dir):
        at = _seq_of(record)
        if 0 <= at <= seq:
            break
        if at >= 0:   # a record without a seq is no record of the bus's
            newer.append(record)
    return newer[::-1]


def last_seq(session_dir: str) -> int:
    """The seq of the last complete record (0: none yet)."""
    return next((s for r in backwards(session_dir) if (s := _seq_of(r)) >= 0), 0)


def _seq_of(record: dict) -> int:
    seq = record.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else -1


def last_event(session_dir: str, match) -> dict | None:
    """The newest complete record for which `match(record)` is true."""
    return next((r for r in backwards(session_dir) if match(r)), None)


def tail_events(session_dir: str, count: int, end: int | None = None) -> list[dict]:
    """The newest `count` complete records (before byte `end`), oldest first."""
    return list(itertools.islice(backwards(session_dir, end), max(0, count)))[::-1]


def _record(line: bytes) -> dict | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(record, dict) and "seq" in record and "topic" in record):
        return None
    if b"\\ud" in line or b"\\uD" in line:
        record = _without_lone_surrogates(record)
    return record


class EventReader:
    """Reads the bus incrementally: each call returns the records appended since the last."""

    def __init__(self, session_dir: str, offset: int | None = 0):
        self._dir = session_dir
        self.offset = offset if offset is not None else complete_size(session_dir)

    def read_new(self) -> list[dict]:
        records, self.offset = read_events(self._dir, self.offset)
        return records
