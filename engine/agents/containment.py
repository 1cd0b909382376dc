"""Every process an agent run starts, found and stopped, wherever it went.

A process group is not a run: Claude Code's Bash tool starts each command in a session
of its own, codex runs commands in PTYs behind a node wrapper, and a tool may call
`setsid` or double-fork. What every descendant keeps is its environment, so each run is
marked there (RUN_MARK and the session directory, set by the runner), and a run's
processes are those carrying its mark plus the descendants of its first process (in
case one cleared its environment). After a `kill -9` of the engine, the next start
finds what the dead engine's runs left by the session's mark. Linux (/proc).
"""
from __future__ import annotations

import os
import signal
import time

RUN_MARK = "RALPH_RUN_ID"
SESSION_MARK = "RALPH_SESSION_DIR"
GRACE_SECONDS = 2.0     # between SIGTERM and SIGKILL: time to save partial work
_POLL = 0.05


def _table() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process but this one."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces: read after the last ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields and fields[0] != b"Z":
            table[int(name)] = int(fields[1])
    table.pop(os.getpid(), None)
    return table


def _marks(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:       # gone, or not ours to read
        return {}
    wanted = (RUN_MARK.encode() + b"=", SESSION_MARK.encode() + b"=")
    return dict(item.split(b"=", 1) for item in environ.split(b"\0")
                if item.startswith(wanted))


def find(session_dir: str, run: str | None = None, root: int | None = None) -> set[int]:
    """The live processes of agent run `run` of the session (of any of its runs when
    `run` is None), and the descendants of `root`."""
    table = _table()
    found = set()
    session = os.path.abspath(session_dir).encode()
    for pid in table:
        marks = _marks(pid)
        if marks.get(SESSION_MARK.encode()) == session and RUN_MARK.encode() in marks and \
                (run is None or marks[RUN_MARK.encode()] == run.encode()):
            found.add(pid)
    if root is not None and root in table:
        children: dict[int, list[int]] = {}
        for pid, parent in table.items():
            children.setdefault(parent, []).append(pid)
        todo = [root]
        while todo:
            pid = todo.pop()
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def stop(find_them, grace: float = GRACE_SECONDS) -> int:
    """SIGTERM every process `find_them()` returns, wait up to `grace` for all of them
    to go, then SIGKILL whatever is left (again, for anything started meanwhile).
    Returns how many there were at first."""
    first = find_them()
    if not first:
        return 0
    _send(first, signal.SIGTERM)
    _send(first, signal.SIGCONT)   # a stopped process handles its SIGTERM only when woken
    deadline = time.monotonic() + grace
    while (left := find_them()) and time.monotonic() < deadline:
        time.sleep(_POLL)
    for _ in range(100):
        if not left:
            break
        _send(left, signal.SIGKILL)
        time.sleep(_POLL / 5)
        left = find_them()
    return len(first)


def _send(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
