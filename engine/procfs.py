"""What Linux's /proc says about a process. Stdlib only: `ralph session status` asks it
whether an engine is stopped without loading the agent backends."""
from __future__ import annotations


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
