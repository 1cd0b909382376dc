"""`ralph tools signals poll` and the MCP `signals_poll`: an agent takes, at its step
boundaries, the STEER/INFO signals meant for its role; PAUSE/ABORT are the engine's."""
from __future__ import annotations

from session_store import ROLES, BadInput, signals

from ..clock import SystemClock


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
                and signal.target != "Orchestrator" and signals.take(session_dir, name):
            taken.append({"type": signal.type, "message": signal.message, "file": name})
            signals.mark_handled(session_dir, signal, handled_by=f"Ralph-{role.capitalize()}",
                                 action=f"taken by the {role} at a step boundary",
                                 now=clock.now())
    return {"signals": taken, "engine_will_act_on": stops}
