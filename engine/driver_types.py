"""Small types shared by the driver, the states and the mailbox."""
from __future__ import annotations

from typing import NamedTuple

from session_store import PauseKind


class Next(NamedTuple):
    """What a state's work asks for: the trigger to fire and why."""
    trigger: str
    reason: str | None = None
    kind: PauseKind | None = None   # for pause: why, which decides the exit code
    signal: object | None = None    # the PAUSE/ABORT signal that asked for it


class Preempted(Exception):
    """A PAUSE or ABORT (or another stop) wins over the work or transition under way."""

    def __init__(self, nxt: Next):
        super().__init__(nxt.reason)
        self.next = nxt
