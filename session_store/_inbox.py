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
    """What waits in inputs/, oldest first (signal files' names start with the time):
    every entry but the hidden ones (writers' temp files), directories too, which the
    engine rejects like any entry that is no signal file."""
    inputs, _, _ = dirs(session_dir)
    try:
        return sorted(n for n in os.listdir(inputs) if not n.startswith("."))
    except FileNotFoundError:
        return []
