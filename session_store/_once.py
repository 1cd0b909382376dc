"""The index of the bus's dedupe keys (`once`, see _events), kept beside the bus so that
an engine's start reads neither the bus nor its history: `events.once-index`.

Each line says which keys the bus's bytes [from, to) hold: {"from": a, "to": b, "keys":
[...]}. It is a cache, written after the bus, never instead of it: a line lost (a kill
before it, a full disk) or torn only makes the next reader read that stretch of the bus
again, and every key it lists is on the bus. A reader trusts the stretch from the bus's
start that lines cover without a gap, and reads the bus from there on; an index that
claims more than the bus holds belongs to another bus, and is not used. Past a few dozen
lines, a reader rewrites it as one. Stdlib only.
"""
from __future__ import annotations

import json
import os

from ._atomic import FILE_MODE, durable_write_done, write_atomic

INDEX_FILE = "events.once-index"
_MAX_BYTES = 64 << 20
_COMPACT_LINES = 32


def load(session_dir: str, end: int) -> tuple[set[str], int]:
    """(the keys the index lists, the bus offset up to which they are all of them), for a
    bus whose complete lines end at `end`; (nothing, 0) without a usable index."""
    path = os.path.join(session_dir, INDEX_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return set(), 0
    with os.fdopen(fd, "rb") as f:
        lines = f.read(_MAX_BYTES).splitlines()
    spans: list[tuple[int, int]] = []
    keys: set[str] = set()
    for line in lines:
        try:
            item = json.loads(line)
            start, stop, listed = item["from"], item["to"], item["keys"]
        except (ValueError, KeyError, TypeError):
            continue   # a torn line: its stretch is read again
        if type(start) is not int or type(stop) is not int or not isinstance(listed, list) \
                or not 0 <= start <= stop:
            continue
        if stop > end:
            return set(), 0   # another bus's
        spans.append((start, stop))
        keys.update(k for k in listed if isinstance(k, str))
    covered = 0
    for start, stop in sorted(spans):
        if start > covered:
            break
        covered = max(covered, stop)
    if len(lines) > _COMPACT_LINES:
        write_atomic(path, _line(0, covered, keys), "once-index", durable=False)
    return keys, covered


def add(session_dir: str, start: int, stop: int, keys: set[str]) -> bool:
    """Say that the bus's bytes [start, stop) hold `keys` (all of theirs): one appended
    line. False where it could not be written (the stretch is read again next time)."""
    path = os.path.join(session_dir, INDEX_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC, FILE_MODE)
        try:
            os.write(fd, _line(start, stop, keys).encode())
        finally:
            os.close(fd)
    except OSError:
        return False
    durable_write_done("once-index", path, durable=False)
    return True


def _line(start: int, stop: int, keys: set[str]) -> str:
    return json.dumps({"from": start, "to": stop, "keys": sorted(keys)},
                      ensure_ascii=False, separators=(",", ":")) + "\n"
