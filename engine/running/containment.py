"""Every process an agent run starts, found and stopped, wherever it went.

A process group is not a run: Claude Code's Bash tool starts each command in a session
of its own, codex runs commands in PTYs behind a node wrapper, and a tool may call
`setsid` or double-fork. What every descendant keeps is its environment, so each run is
marked there (RUN_MARK and the session directory, set by the runner), and a run's
processes are those carrying its mark plus the descendants of its first process (in
case one cleared its environment). That first process is the run's supervisor
(engine/running/supervisor.py), a child subreaper: a process that both clears its environment
and double-forks is adopted by it rather than by init, so every process of the run
descends from it (`agent_run_of` finds it so), and it stops the run when the engine dies.
The engine is a subreaper too, for what a killed supervisor leaves; the next start finds
what outlived both by the session's mark. Linux (/proc, prctl).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import namedtuple
from contextlib import contextmanager

from . import procfs

RUN_MARK = "RALPH_RUN_ID"
SESSION_MARK = "RALPH_SESSION_DIR"
GRACE_SECONDS = 2.0     # between SIGTERM and SIGKILL: time to save partial work
_POLL = 0.05
_PR_SET_CHILD_SUBREAPER = 36
SUPERVISOR_NAME = "ralph-run"   # a run's supervisor names itself so (prctl PR_SET_NAME)
SANDBOX_NAME = "bwrap"          # the sandbox around a run (engine/running/sandbox.py)
_spared: set[int] = set()   # children the engine started itself (a resume from a channel)
_spawning = threading.Lock()   # held while such a child is started and spared
_adopting = False           # this process is the reaper of its orphaned descendants


def adopt_orphans() -> bool:
    """Make this process (the engine, a run's supervisor) the reaper of its orphaned
    descendants, so that nothing an agent run starts can slip out of its tree. False
    where it cannot."""
    global _adopting
    _adopting = prctl(_PR_SET_CHILD_SUBREAPER, 1)
    return _adopting


_libc_prctl = None   # looked up once: a child between fork and exec only calls it


def prctl(option: int, arg) -> bool:
    """prctl(2) through libc; False where it fails or is not there."""
    global _libc_prctl
    if _libc_prctl is None:
        import ctypes   # here: a verb asking `agent_run_of` needs none of it
        try:
            _libc_prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _libc_prctl = False
    return bool(_libc_prctl) and _libc_prctl(option, arg) == 0


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
        for pid in procfs.pids():
            if pid == root or pid in _spared:
                continue
            state = procfs.proc_state(pid)
            if state is not None and state[0] == "Z" and state[1] == me:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def _table() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process but this one."""
    table = procfs.live_parents()
    table.pop(os.getpid(), None)
    return table


def _marks(pid: int) -> dict[str, str]:
    return procfs.environ(pid, (RUN_MARK, SESSION_MARK))


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
    process adopted during the run (children it did not have `before` it, other than
    `root`, and not another run's) and their descendants. `root` may be this
    process itself (a supervisor: the run is its whole tree), which is never found."""
    table = _table()
    found = set()
    session = os.path.realpath(session_dir)
    real: dict[str, str] = {}   # the same session may be named through a symlink
    for pid in table:
        marks = _marks(pid)
        named = marks.get(SESSION_MARK)
        if named is None or RUN_MARK not in marks or \
                (run is not None and marks[RUN_MARK] != run):
            continue
        if named not in real:
            real[named] = os.path.realpath(named)
        if real[named] == session:
            found.add(pid)
    if root is not None:
        kids: dict[int, list[int]] = {}
        for pid, parent in table.items():
            kids.setdefault(parent, []).append(pid)
        with _spawning:
            adopted = [pid for pid in kids.get(os.getpid(), ()) if _adopting
                       and pid != root and pid not in before and pid not in _spared
                       and _ours(pid, session, run)]
        todo = ([root] if root in table else []) + adopted
        while todo:
            pid = todo.pop()
            found.add(pid)
            todo.extend(kids.get(pid, ()))
    return found


def _ours(pid: int, session: str, run: str | None) -> bool:
    """An adopted orphan counts as the run's unless another session's run, or another run
    (a parallel batch's lanes run at once; their supervisors are children too), marked
    it."""
    marks = _marks(pid)
    named = marks.get(SESSION_MARK)
    if run is not None and marks.get(RUN_MARK) not in (None, run):
        return False
    return named is None or os.path.realpath(named) == session


def stop(find_them, grace: float = GRACE_SECONDS) -> int:
    """SIGTERM every process `find_them()` returns, wait up to `grace` for all of them
    to go, then SIGKILL whatever is left. Every process seen once is followed to its end
    by its identity (pid and start time): one found only as a descendant is still
    stopped after its parents died. Returns how many there were at first."""
    known: dict[int, int] = {}     # pid -> start time

    def look() -> list[int]:
        """Add what is found now; return the known processes still alive."""
        for pid in find_them():
            if pid not in known and (stat := procfs.live(pid)) is not None:
                known[pid] = stat[1]
        return [pid for pid, start in known.items()
                if (stat := procfs.live(pid)) is not None and stat[1] == start]

    alive = look()
    first = len(alive)
    termed: set[int] = set()
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        fresh = [pid for pid in _in_their_turn(alive) if pid not in termed]
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


def _in_their_turn(alive: list[int]) -> list[int]:
    """Who gets SIGTERM now. A sandbox (bubblewrap, engine/running/sandbox.py) is never
    asked: its PID namespace ends, every process in it SIGKILLed, once the run's first
    process inside it exits; so that one is asked last, when the rest has gone (or at
    SIGKILL), and every other process gets its grace."""
    sandboxes = {pid for pid in alive if procfs.comm(pid) == SANDBOX_NAME}
    if not sandboxes:
        return alive
    firsts = {pid for pid in alive if (stat := procfs.live(pid)) and stat[0] in sandboxes}
    rest = [pid for pid in alive if pid not in sandboxes and pid not in firsts]
    return rest or [pid for pid in alive if pid in firsts and pid not in sandboxes]


def _send(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class AgentRun(namedtuple("AgentRun", "supervisor run_id session_dir")):
    """The agent run a process is part of, as its supervisor's marks say (or, where no
    supervisor is in sight, the marks of the nearest process that carries them):
    the supervisor's pid when in sight, the run's id (e.g. 0003-executor-t1; None when
    the marks are not readable) and the directory its session works in."""
    __slots__ = ()

    def __str__(self) -> str:
        where = f" of the session in {self.session_dir}" if self.session_dir else ""
        by = f"supervisor pid {self.supervisor}" if self.supervisor else "by its marks"
        return f"agent run {self.run_id or '?'}{where} ({by})"


def agent_run_of(pid: int | None = None) -> AgentRun | None:
    """The agent run that process `pid` (default: this one) is part of, or None outside
    every run; /proc reads only. However it hides (a cleared environment, `setsid`, a
    double fork), every process of a run descends from the run's supervisor, which adopts
    the run's orphans and whose name none of them can change. Inside a sandbox's own PID
    namespace (codex's bwrap), where no ancestor outside it is in sight, the run's marks
    in the environment of the process or of an ancestor (which it cannot change) tell."""
    marked = None
    for ancestor in procfs.lineage(procfs.own_pid() if pid is None else pid):
        if procfs.comm(ancestor) == SUPERVISOR_NAME:
            marks = _marks(ancestor)
            if RUN_MARK not in marks and marked is not None:
                # its environment out of this process's reach (a CLI's own sandbox, in a
                # user namespace of its own): the marks below it tell
                return marked._replace(supervisor=ancestor)
            return AgentRun(ancestor, marks.get(RUN_MARK), marks.get(SESSION_MARK))
        if marked is None and RUN_MARK in (marks := _marks(ancestor)):
            marked = AgentRun(None, marks[RUN_MARK], marks.get(SESSION_MARK))
    return marked
