"""`ralph tools interact ask`: a blocking question inside the agent's own run (seed 003).

The agent's process waits (its context is kept) while the engine asks: the question is
the engine's to create, announce, answer and time out (the control plane is out of the
agent's reach), and its reply comes back through the work area's inbox. Its timeout is
the agent's to handle (exit 3 and the default), not the engine's policy.
"""
from __future__ import annotations

from .client import Waiting, request

__all__ = ["Waiting", "ask_and_wait"]


def ask_and_wait(text: str, *, timeout: float | None, default: str | None,
                 options: list[str], work_dir: str,
                 waiting: Waiting | None = None) -> tuple[str | None, bool]:
    """(the answer, True) or (the default, False) on timeout. Without `waiting`, SIGTERM
    (the run being stopped) ends the wait (KeyboardInterrupt)."""
    import signal
    previous = signal.signal(signal.SIGTERM, _stop_waiting_on_term) if waiting is None \
        else None
    try:
        reply = request(work_dir, "ask", {"text": text, "options": list(options),
                                          "default": default, "timeout": timeout},
                        waiting=waiting)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if reply.get("answered"):
        return str(reply.get("text") or ""), True
    fallback = reply.get("default")
    return (None if fallback is None else str(fallback)), False


def _stop_waiting_on_term(_signum, _frame):
    raise KeyboardInterrupt  # the agent is being stopped: it stops waiting
