"""`ralph tools signals poll` and the MCP `signals_poll`: an agent takes, at its step
boundaries, the STEER/INFO signals meant for its role; PAUSE/ABORT are the engine's."""
from __future__ import annotations

import signal as os_signal
import threading

from session_store import ROLES, BadInput, signals

from ..clock import SystemClock


TAKING = threading.Lock()   # held from a take to its mark: a stopping MCP server waits
_QUIET = {os_signal.SIGTERM, os_signal.SIGINT}


def poll(session_dir: str, role: str) -> dict:
    """{"signals": [taken STEER/INFO], "engine_will_act_on": [waiting PAUSE/ABORT]}."""
    role = (role or "").lower()
    if role not in ROLES:
        raise BadInput(f"--role {role or '(none)'}: expected one of {', '.join(ROLES)} "
                       f"(or RALPH_ROLE set by the engine)")
    clock = SystemClock()
    taken, stops = [], []
    for name in signals.waiting(session_dir):
        signal, _reason, _raw = signals.read(session_dir, name)
        if signal is None:
            continue  # malformed ones are the engine's to reject
        if signal.type in ("PAUSE", "ABORT"):
            stops.append({"type": signal.type, "message": signal.message, "file": name})
        elif signal.type in ("STEER", "INFO") and signal.role in (None, role) \
                and signal.target != "Orchestrator":
            # a take and its mark are one step: a stop (SIGTERM at the run's end) waits
            # for it (what a kill -9 leaves between them, the engine handles after the run)
            with TAKING:
                blocked = os_signal.pthread_sigmask(os_signal.SIG_BLOCK, _QUIET)
                try:
                    if not signals.take(session_dir, name):
                        continue
                    signals.mark_handled(session_dir, signal,
                                         handled_by=f"Ralph-{role.capitalize()}",
                                         action=f"taken by the {role} at a step boundary",
                                         now=clock.now())
                finally:
                    os_signal.pthread_sigmask(os_signal.SIG_SETMASK, blocked)
            taken.append({"type": signal.type, "message": signal.message, "file": name})
    return {"signals": taken, "engine_will_act_on": stops}
