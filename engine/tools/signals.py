"""`ralph tools signals poll` and the MCP `signals_poll`: an agent takes, at its step
boundaries, the STEER/INFO signals meant for its role; PAUSE/ABORT are the engine's.
The engine takes them for it (the mailbox is the control plane's), as the run's role."""
from __future__ import annotations

from ralph.session_store import ROLES, BadInput

from .client import request

POLL_PATIENCE = 30.0   # seconds: an engine replies in milliseconds while its agent runs


def poll(work_dir: str, role: str) -> dict:
    """{"signals": [taken STEER/INFO], "engine_will_act_on": [waiting PAUSE/ABORT]}."""
    role = (role or "").lower()
    if role not in ROLES:
        raise BadInput(f"--role {role or '(none)'}: expected one of {', '.join(ROLES)} "
                       f"(or RALPH_ROLE set by the engine)")
    reply = request(work_dir, "poll", {"role": role}, patience=POLL_PATIENCE)
    return {"signals": reply.get("signals") or [],
            "engine_will_act_on": reply.get("engine_will_act_on") or []}
