"""What Linux's /proc says about processes. Stdlib only, /proc reads only: `ralph session
status` asks it whether an engine is stopped, and a human's verb whether it was called
from inside an agent run, without loading the agent backends."""
from __future__ import annotations

import os


def proc_state(pid: int) -> tuple[str, int, int] | None:
    """(state letter, parent pid, start time) of a process, from /proc/<pid>/stat; None
    when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: read after the last ")"
    fields = stat[stat.rfind(b")") + 2:].split()
    if len(fields) < 20:
        return None
    return fields[0].decode(), int(fields[1]), int(fields[19])


def live(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, None if it is gone or a zombie."""
    state = proc_state(pid)
    if state is None or state[0] == "Z":
        return None
    return state[1], state[2]


def own_pid() -> int:
    """This process's pid as /proc names it: os.getpid() is its pid in its own PID
    namespace, which a /proc of an outer one does not show."""
    return int(os.readlink("/proc/self"))


def pids() -> list[int]:
    """Every process now (some may be gone by the time they are read)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def live_parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    table = {}
    for pid in pids():
        if (stat := live(pid)) is not None:
            table[pid] = stat[0]
    return table


def environ(pid: int, names: tuple[str, ...]) -> dict[str, str]:
    """The variables `names` of a process's environment as it was started (what
    /proc/<pid>/environ holds); {} when it is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            block = f.read()
    except OSError:
        return {}
    wanted = tuple(name.encode() + b"=" for name in names)
    return dict(os.fsdecode(item).split("=", 1) for item in block.split(b"\0")
                if item.startswith(wanted))


def comm(pid: int) -> str | None:
    """A process's name (/proc/<pid>/comm: set by exec or by the process itself through
    prctl(PR_SET_NAME), never by another one); None when it is gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return os.fsdecode(f.read().rstrip(b"\n"))
    except OSError:
        return None


def lineage(pid: int):
    """The process itself, then its parent, its grandparent... up to the first process
    of its PID namespace."""
    seen = set()
    while pid > 0 and pid not in seen:   # a pid reused while walking could loop
        seen.add(pid)
        yield pid
        state = proc_state(pid)
        if state is None:
            return
        pid = state[1]
