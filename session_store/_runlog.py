"""A run's output log (`logs/<seq>-<role>[-<task>].stdout` or `.stderr` in the work area),
bounded. An agent prints what it likes, as much as it likes: the engine reads back, and
keeps once the run is over, at most the log's first HEAD_BYTES and its last TAIL_BYTES,
with one line between them saying how much was cut (head and tail cut at line ends, so
no half line of JSON stands on either side). What every preset reads is there: a CLI's
first lines (Claude Code's `system`/`init`, the conversation's id) and its last (the
result, the usage and the cost, a usage limit). So the engine's memory stays flat in an
agent's output, and a run's two logs take at most 2 x MAX_LOG_BYTES once it is over
(while it runs, what the agent writes goes straight to the file). Stdlib only.
"""
from __future__ import annotations

import errno
import os

from ._work import WorkArea

HEAD_BYTES = 64 * 1024      # a CLI's first lines: Claude Code's init line is ~10 KiB
TAIL_BYTES = 1024 * 1024    # its last: a final answer, its usage, a limit's words
_CUT = "\n[ralph: {cut} bytes of this log were cut here; it keeps its first {head} and " \
       "last {tail} bytes]\n"
# the cut line at its longest (a size of 20 digits)
MAX_LOG_BYTES = HEAD_BYTES + TAIL_BYTES + len(_CUT.format(cut=10**19, head=HEAD_BYTES,
                                                           tail=TAIL_BYTES))


def bounded(fd: int) -> tuple[bytes, bool]:
    """The log open as `fd` (readable), as the engine reads and keeps it: all of it when
    it is no longer than HEAD_BYTES + TAIL_BYTES, else its head, the cut line and its tail;
    and whether it was cut."""
    size = os.fstat(fd).st_size
    if size <= HEAD_BYTES + TAIL_BYTES:
        return _read(fd, 0, size), False
    head = _read(fd, 0, HEAD_BYTES)
    tail = _read(fd, size - TAIL_BYTES, TAIL_BYTES)
    head = head[:head.rfind(b"\n") + 1] or head   # a half line at the cut: dropped
    tail = tail[tail.find(b"\n") + 1:] or tail
    cut = _CUT.format(cut=size - len(head) - len(tail), head=len(head), tail=len(tail))
    return head + cut.encode() + tail, True


def keep_bounded(work_dir: str, path: str, fd: int) -> bytes:
    """Read the run's log open as `fd` (at `path`, in the work area `work_dir`), bounded;
    when it was cut, put the bounded log in its place (a temp file renamed over it, never
    through a link). Returns the bounded bytes. Something else planted at `path` (a
    directory) is left there; a full disk raises DiskFault (the engine pauses)."""
    data, cut = bounded(fd)
    if cut:
        work = WorkArea(work_dir)
        try:
            work.write(os.path.relpath(path, work_dir), data, kind="run-log")
        except OSError as e:
            if e.errno not in (errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST,
                               errno.ELOOP):
                raise
        finally:
            work.close()
    return data


def _read(fd: int, offset: int, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:   # shorter than its size said (truncated meanwhile)
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)
