"""`ralph tools ...`: what agents call during a run (ask a human, note progress, take
the signals meant for them)."""
from __future__ import annotations

import os

from .common import EXIT_OK, EXIT_PAUSED, workspace


def _work_dir(args) -> str:
    """The session's work area, where agents' tools talk to its engine."""
    from ralph.session_store import BadInput

    from ..tools.emit import EmitError, session_dir
    os.environ.setdefault("RALPH_WORKSPACE", workspace(args))
    try:
        return session_dir(args.session)
    except EmitError as e:
        raise BadInput(str(e)) from None


def cmd_interact_ask(args) -> int:
    """For agents: ask a human and block inside the agent's own run."""
    from ..tools.interact import ask_and_wait
    answer, answered = ask_and_wait(args.question, timeout=args.timeout, default=args.default,
                                    options=args.option or [], work_dir=_work_dir(args),
                                    timeout_name="--timeout")
    if answer is not None:
        print(answer, flush=True)   # at once: the interpreter's exit takes tens of ms more
    return EXIT_OK if answered else EXIT_PAUSED


def cmd_interact_progress(args) -> int:
    """For agents: a fire-and-forget note to the humans, recorded on the bus."""
    from ..tools.emit import progress_main
    argv = [args.message] + (["--session", args.session] if args.session else [])
    return progress_main(argv)


def cmd_signals_poll(args) -> int:
    """For agents at their step boundaries: take the STEER/INFO meant for this role."""
    import json

    from ralph.session_store import dump_yaml

    from ..tools.signals import poll
    result = poll(_work_dir(args), args.role or os.environ.get("RALPH_ROLE") or "")
    print(json.dumps(result, indent=2) + "\n" if args.json else dump_yaml(result), end="")
    return EXIT_OK


def cmd_approve(args) -> int:
    """For agents' CLIs (their pre-tool hook): what a human decides of the call on stdin."""
    from ..tools.approve import main
    return main(["--cli", args.cli])


def cmd_mcp(args) -> int:
    """For agents: serve the session's tools over MCP (stdio) until the client leaves."""
    directory = _work_dir(args)
    from ..tools.mcp_server import serve
    serve(directory)
    return EXIT_OK
