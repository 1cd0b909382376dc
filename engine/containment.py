"""Every process an agent run starts, found and stopped, wherever it went.

A process group is not a run: Claude Code's Bash tool starts each command in a session
of its own, codex runs commands in PTYs behind a node wrapper, and a tool may call
`setsid` or double-fork. What every descendant keeps is its environment, so each run is
marked there (RUN_MARK and the session directory, set by the runner), and a run's
processes are those carrying its mark plus the descendants of its first process (in
case one cleared its environment). The engine is also a child subreaper: a process that
both clears its environment and double-forks is adopted by the engine rather than by
init, and found among its children. After a `kill -9` of the engine, the next start
finds what the dead engine's runs left by the session's mark. Linux (/proc, prctl).
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from contextlib import contextmanager

from .procfs import proc_state

RUN_MARK = "RALPH_RUN_ID"
SESSION_MARK = "RALPH_SESSION_DIR"
GRACE_SECONDS = 2.0     # between SIGTERM and SIGKILL: time to save partial work
_POLL = 0.05
_PR_SET_CHILD_SUBREAPER = 36
_spared: set[int] = set()   # children the engine started itself (a resume from a channel)
_spawning = threading.Lock()   # held while such a child is started and spared
_adopting = False           # this process is the reaper of its orphaned descendants


def adopt_orphans() -> bool:
    """Make this process (the engine) the reaper of its orphaned descendants, so that
    nothing an agent run starts can slip out of its tree. False where it cannot."""
    global _adopting
    try:
        _adopting = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        _adopting = False
    return _adopting


@contextmanager
def spawning():
    """Start a child the engine means to keep (a resume a channel asked for) inside this,
    and `spare` it: no run's containment takes it for an adopted orphan meanwhile."""
    with _spawning:
        yield


def spare(pid: int) -> None:
    """A child the engine started on purpose: never taken for an agent's orphan."""
    _spared.add(pid)


def reap_orphans(root: int | None = None) -> None:
    """Collect the exit status of adopted orphans that ended (so they leave no zombie);
    the agent's own process (`root`) and spared children are waited for by their owners."""
    if not _adopting:
        return
    me = os.getpid()
    with _spawning:
        for name in os.listdir("/proc"):
            pid = int(name) if name.isdigit() else None
            if pid is None or pid == root or pid in _spared:
                continue
            state = proc_state(pid)
            if state is not None and state[0] == "Z" and state[1] == me:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, None if it is gone or a zombie."""
    state = proc_state(pid)
    if state is None or state[0] == "Z":
        return None
    return state[1], state[2]


def _table() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process but this one."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            table[int(name)] = stat[0]
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


def children() -> set[int]:
    """This process's live children now (those of a run are new ones); only an engine
    that adopts orphans needs to know."""
    if not _adopting:
        return set()
    me = os.getpid()
    return {pid for pid, parent in _table().items() if parent == me}


def find(session_dir: str, run: str | None = None, root: int | None = None,
         before: frozenset[int] = frozenset()) -> set[int]:
    """The live processes of agent run `run` of the session (of any of its runs when
    `run` is None), and the descendants of `root`; with `root`, also the orphans this
    engine adopted during the run (children it did not have `before` it, other than
    `root`: the run is the only one it has) and their descendants."""
    table = _table()
    found = set()
    session = os.path.realpath(session_dir)
    real: dict[bytes, str] = {}   # the same session may be named through a symlink
    for pid in table:
        marks = _marks(pid)
        named = marks.get(SESSION_MARK.encode())
        if named is None or RUN_MARK.encode() not in marks or \
                (run is not None and marks[RUN_MARK.encode()] != run.encode()):
            continue
        if named not in real:
            real[named] = os.path.realpath(os.fsdecode(named))
        if real[named] == session:
            found.add(pid)
    if root is not None:
        kids: dict[int, list[int]] = {}
        for pid, parent in table.items():
            kids.setdefault(parent, []).append(pid)
        with _spawning:
            adopted = [pid for pid in kids.get(os.getpid(), ()) if _adopting
                       and pid != root and pid not in before and pid not in _spared
                       and _ours(pid, session)]
        todo = ([root] if root in table else []) + adopted
        while todo:
            pid = todo.pop()
            found.add(pid)
            todo.extend(kids.get(pid, ()))
    return found


def _ours(pid: int, session: str) -> bool:
    """An adopted orphan counts as the run's unless another session's run marked it."""
    named = _marks(pid).get(SESSION_MARK.encode())
    return named is None or os.path.realpath(os.fsdecode(named)) == session


def stop(find_them, grace: float = GRACE_SECONDS) -> int:
    """SIGTERM every process `find_them()` returns, wait up to `grace` for all of them
    to go, then SIGKILL whatever is left. Every process seen once is followed to its end
    by its identity (pid and start time): one found only as a descendant is still
    stopped after its parents died. Returns how many there were at first."""
    known: dict[int, int] = {}     # pid -> start time

    def look() -> list[int]:
        """Add what is found now; return the known processes still alive."""
        for pid in find_them():
            if pid not in known and (stat := _stat(pid)) is not None:
                known[pid] = stat[1]
        return [pid for pid, start in known.items()
                if (stat := _stat(pid)) is not None and stat[1] == start]

    alive = look()
    first = len(alive)
    termed: set[int] = set()
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        fresh = [pid for pid in alive if pid not in termed]
        _send(fresh, signal.SIGTERM)
        _send(fresh, signal.SIGCONT)   # a stopped process handles its SIGTERM when woken
        termed.update(fresh)
        time.sleep(_POLL)
        alive = look()
    for _ in range(100):
        if not alive:
            break
        _send(alive, signal.SIGKILL)
        time.sleep(_POLL / 5)
        alive = look()
    return first


def _send(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class AgentRun:
    """The agent run a process is part of, as the marks of its nearest marked ancestor say."""

    def __init__(self, run_id: str | None, session_dir: str | None):
        self.supervisor = None
        self.run_id = run_id
        self.session_dir = session_dir

    def __str__(self) -> str:
        where = f" of the session in {self.session_dir}" if self.session_dir else ""
        return f"agent run {self.run_id or '?'}{where}"


def agent_run_of(pid: int | None = None) -> AgentRun | None:
    """The agent run process `pid` (default: this one) is part of, or None."""
    pid = os.getpid() if pid is None else pid
    while pid > 1:
        marks = _marks(pid)
        if RUN_MARK.encode() in marks:
            session = marks.get(SESSION_MARK.encode())
            return AgentRun(marks[RUN_MARK.encode()].decode(errors="replace"),
                            session.decode(errors="replace") if session else None)
        state = proc_state(pid)
        if state is None:
            return None
        pid = state[1]
    return None
