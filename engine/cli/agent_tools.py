"""`ralph tools ...`: what agents call during a run (ask a human, note progress, take
the signals meant for them)."""
from __future__ import annotations

import os

from .common import EXIT_OK, EXIT_PAUSED, bad, open_session, workspace


def cmd_interact_ask(args) -> int:
    """For agents: ask a human and block inside the agent's own run."""
    from ..interact import ask_and_wait
    answer, answered = ask_and_wait(args.question, timeout=args.timeout, default=args.default,
                                    options=args.option or [], session_id=args.session,
                                    workspace=workspace(args))
    if answer is not None:
        print(answer, flush=True)   # at once: the interpreter's exit takes tens of ms more
    return EXIT_OK if answered else EXIT_PAUSED


def cmd_interact_progress(args) -> int:
    """For agents: a fire-and-forget note to the humans, recorded on the bus."""
    from session_store import append_event
    session = open_session(args)
    iteration = os.environ.get("RALPH_ITERATION", "")
    record = append_event(session.dir, "human.progress", args.message,
                          source=os.environ.get("RALPH_ROLE") or "cli",
                          iteration=int(iteration) if iteration.isdigit() else None,
                          state=os.environ.get("RALPH_STATE") or None,
                          run=os.environ.get("RALPH_RUN_ID") or None)
    print(f"progress noted (seq {record['seq']})")
    return EXIT_OK


def cmd_signals_poll(args) -> int:
    """For agents at their step boundaries: take the STEER/INFO meant for this role."""
    import json

    from session_store import dump_yaml, signals

    from ..clock import SystemClock
    from ..config import ROLES
    role = (args.role or os.environ.get("RALPH_ROLE") or "").lower()
    if role not in ROLES:
        raise bad(f"--role {role or '(none)'}: expected one of {', '.join(ROLES)} "
                   f"(or RALPH_ROLE set by the engine)")
    session = open_session(args)
    clock = SystemClock()
    taken, stops = [], []
    for name in signals.waiting(session.dir):
        signal, _reason, _raw = signals.read(session.dir, name)
        if signal is None:
            continue  # malformed ones are the engine's to reject
        if signal.type in ("PAUSE", "ABORT"):
            stops.append({"type": signal.type, "message": signal.message, "file": name})
        elif signal.type in ("STEER", "INFO") and signal.role in (None, role) \
                and signal.target != "Orchestrator" and signals.take(session.dir, name):
            taken.append({"type": signal.type, "message": signal.message, "file": name})
            signals.mark_handled(session.dir, signal, handled_by=f"Ralph-{role.capitalize()}",
                                 action=f"taken by the {role} at a step boundary",
                                 now=clock.now())
    result = {"signals": taken, "engine_will_act_on": stops}
    print(json.dumps(result, indent=2) if args.json else dump_yaml(result), end="")
    return EXIT_OK
