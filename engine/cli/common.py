"""What every command shares: exit codes, the workspace, the session a command means."""
from __future__ import annotations

import os

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_PAUSED, EXIT_ABORTED, EXIT_LIMIT = 0, 1, 2, 3, 4, 5
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
SESSION_FLAGS_HELP = "the session (default: $RALPH_SESSION_ID, then the only open session)"


def workspace(args) -> str:
    return os.path.abspath(getattr(args, "workspace", None)
                           or os.environ.get("RALPH_WORKSPACE") or os.getcwd())


def config_file(args) -> str | None:
    """The config a command uses: `-c PATH` as given (relative to the current directory),
    else the workspace's ralph.yml when there is one, else None (every default)."""
    if getattr(args, "config", None):
        return args.config
    path = os.path.join(workspace(args), "ralph.yml")
    return shown_path(path) if os.path.isfile(path) else None


def channel_errors(config) -> list[str]:
    """A human channel that cannot work (RObot.enabled without a token or a chat; the
    environment's token counts): the Telegram settings' own check, so `validate`, `start`
    and `resume` refuse the same configs."""
    if not config.RObot.enabled:
        return []
    from session_store import BadInput

    from ..channels.telegram import check   # cheap: the bot itself is not loaded
    try:
        check(config)
    except BadInput as e:
        return [str(e)]
    return []


def check_channels(config, source: str) -> None:
    """For `resume`: the session's config still has working human channels."""
    errors = channel_errors(config)
    if errors:
        raise bad(f"{source}: {errors[0]}")


def shown_path(path: str) -> str:
    """`path` as an operator reads it: relative when it is under the current directory."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def open_session(args):
    from session_store import BadInput, Status, load, resolve_id
    ws = workspace(args)
    session = load(ws, resolve_id(ws, args.session))
    if session.metadata.status in (Status.COMPLETED, Status.ABORTED):
        raise BadInput(f"session {session.id} is {session.metadata.status.value}: "
                       f"it takes no more signals")
    return session


def bad(message: str):
    from session_store import BadInput
    return BadInput(message)


def human_only(verb: str) -> None:
    """A human's verb (answer, signal, resume, init, web, bot) refuses to run inside an
    agent run: an agent must not answer its own question, approve its own knowledge or
    steer its own session. The run is known however the call hides it (a cleared
    environment, setsid, a double fork): every process of a run descends from the run's
    supervisor (containment.agent_run_of). The refusal is recorded on the bus, as the
    run's, through the session's work area."""
    from ..containment import agent_run_of
    run = agent_run_of()
    if run is None:
        return
    why = f"refused inside {run}: `ralph {verb}` is a human's to do"
    if run.session_dir:
        from ..tools.emit import report_refusal
        report_refusal(run.session_dir, verb, why, run=run.run_id)
    raise bad(f"{verb}: {why}")
