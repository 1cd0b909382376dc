"""`ralph tools interact ask`: a blocking question inside the agent's own run (seed 003).

The agent's process waits (its context is kept) while the engine asks: the question is
the engine's to create, announce, answer and time out (the control plane is out of the
agent's reach), and its reply comes back through the work area's inbox. Its timeout is
the agent's to handle (exit 3 and the default), not the engine's policy.
"""
from __future__ import annotations

from ralph.session_store import BadInput, shown

from .client import Waiting, request

__all__ = ["MAX_ASK_SECONDS", "Waiting", "ask_and_wait", "ask_seconds"]

# The longest an agent may wait for an answer inside its run. The run holds its process
# and its model's context meanwhile, and the engine stops it long before (agent.timeout_
# seconds, 30 minutes by default): a day is already no wait a run can have, and beyond
# it a number is a mistake or an attack (1e300 overflows the deadline's date; NaN passed
# `timeout <= 0` and crashed it). The human's own RObot.timeout_seconds is the config's.
MAX_ASK_SECONDS = 86400


def ask_seconds(value) -> float:
    """The timeout an agent gave `ask` (`--timeout`, MCP `timeout_seconds`), as seconds:
    ValueError saying what was expected for anything but a finite number in
    (0, MAX_ASK_SECONDS]."""
    try:
        seconds = float(value) if isinstance(value, (str, int, float)) else None
    except (ValueError, OverflowError):   # "soon", 10**400
        seconds = None
    if type(value) is bool or seconds is None or not 0 < seconds <= MAX_ASK_SECONDS:
        raise ValueError(f"expected a number of seconds above 0 and at most "
                         f"{MAX_ASK_SECONDS} (a day), got {shown(value)}")
    return seconds   # NaN fails `0 < seconds`, infinity the upper bound


def ask_and_wait(text: str, *, timeout: float | str | None, default: str | None,
                 options: list[str], work_dir: str, waiting: Waiting | None = None,
                 timeout_name: str = "timeout") -> tuple[str | None, bool]:
    """(the answer, True) or (the default, False) on timeout (None: the session's
    RObot.timeout_seconds; else checked by ask_seconds, BadInput naming `timeout_name`).
    Without `waiting`, SIGTERM (the run being stopped) ends the wait (KeyboardInterrupt)."""
    if timeout is not None:
        try:
            timeout = ask_seconds(timeout)
        except ValueError as e:
            raise BadInput(f"{timeout_name}: {e}") from None
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
