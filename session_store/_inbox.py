"""Where signals wait (signals/inputs/), on the stdlib alone: agents' step-boundary polls
look here first, and most of them find nothing to parse."""
from __future__ import annotations

import os


def dirs(session_dir: str) -> tuple[str, str, str]:
    """(inputs, processed, rejected) of a session's mailbox."""
    base = os.path.join(session_dir, "signals")
    return (os.path.join(base, "inputs"), os.path.join(base, "processed"),
            os.path.join(base, "rejected"))


def waiting(session_dir: str) -> list[str]:
    """Signal files in inputs/, oldest first (their names start with the time).
    Directories are no signal files: they are left alone."""
    inputs, _, _ = dirs(session_dir)
    try:
        return sorted(e.name for e in os.scandir(inputs)
                      if not e.name.startswith(".") and not e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []
