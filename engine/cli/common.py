"""What every command shares: exit codes, the workspace, the session a command means."""
from __future__ import annotations

import os

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_PAUSED, EXIT_ABORTED, EXIT_LIMIT = 0, 1, 2, 3, 4, 5
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
SESSION_FLAGS_HELP = "the session (default: $RALPH_SESSION_ID, then the only open session)"


def workspace(args) -> str:
    """--workspace, else $RALPH_WORKSPACE, else the current directory. One that is not a
    directory (a typo) is refused, not taken for a workspace without sessions, but by the
    commands that make it (`session start`, `init`: `new_workspace`)."""
    given = getattr(args, "workspace", None)
    path = given or os.environ.get("RALPH_WORKSPACE")
    if not path:
        return os.getcwd()
    if not os.path.isdir(path) and not (getattr(args, "new_workspace", False)
                                        and not os.path.exists(path)):
        raise bad(f"{'--workspace' if given else '$RALPH_WORKSPACE'} {path}: "
                  f"{'not a directory' if os.path.exists(path) else 'no such directory'}")
    return os.path.abspath(path)


def write_output(path: str, data: str | bytes, kind: str) -> None:
    """A file the human named, written whole (atomically); a folder that is not there, or
    one that may not be written, is said in one line (exit 2)."""
    from ralph.session_store import write_atomic
    try:
        write_atomic(path, data, kind)
    except OSError as e:
        raise bad(f"{path}: cannot write it: {e.strerror or e}") from None


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
    from ralph.session_store import BadInput

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


def session_id_of(args, newest_if_none_open: bool = False) -> str:
    """The session a command means (see resolve_id); the hint, when it cannot tell, in the
    syntax of this command: its ID argument, or its --session flag."""
    from ralph.session_store import resolve_id
    if hasattr(args, "session_id"):
        how = f"ralph session {args.session_command} ID"
        given = args.session_id
    else:
        how = f"ralph {_command_words(args)} --session ID"
        given = args.session
    return resolve_id(workspace(args), given, newest_if_none_open, named_by=how)


def _command_words(args) -> str:
    """The command's words (`signal`, `tools signals poll`), from the parser's dests."""
    words, key = [], "command"
    while (word := getattr(args, key, None)) is not None:
        words.append(word)
        key = f"{word}_command"
    if words == ["signal"]:
        words += [args.type] + (["MESSAGE"] if args.type in ("steer", "info") else [])
    return " ".join(words)


def nearest_session(args) -> str:
    """For an unknown session id, the hint: the workspace's session nearest to it
    ("; did you mean X?"), else the sessions it has."""
    import difflib

    from ralph.session_store import list_ids
    given = getattr(args, "session_id", None) or getattr(args, "session", None) \
        or os.environ.get("RALPH_SESSION_ID")
    try:
        known = sorted(list_ids(workspace(args)))
    except Exception:   # a hint: whatever stops it leaves the error as it was
        return ""
    if not given or not known:
        return "; this workspace has no session" if given else ""
    found = difflib.get_close_matches(given, known, n=1, cutoff=0.5)
    if found:
        return f"; did you mean {found[0]}?"
    newest = known[-3:]
    return (f"; its sessions: {', '.join(reversed(newest))}"
            + (f" and {len(known) - 3} more (ralph session list)" if len(known) > 3 else ""))


def open_session(args):
    from ralph.session_store import BadInput, Status, load
    ws = workspace(args)
    session = load(ws, session_id_of(args))
    if session.metadata.status in (Status.COMPLETED, Status.ABORTED):
        raise BadInput(f"session {session.id} is {session.metadata.status.value}: "
                       f"it takes no more signals")
    return session


def bad(message: str):
    from ralph.session_store import BadInput
    return BadInput(message)


def human_only(verb: str) -> None:
    """A human's verb (answer, signal, resume, init, web, bot) refuses to run inside an
    agent run: an agent must not answer its own question, approve its own knowledge or
    steer its own session. The run is known however the call hides it (a cleared
    environment, setsid, a double fork): every process of a run descends from the run's
    supervisor (containment.agent_run_of). The refusal is recorded on the bus, as the
    run's, through the session's work area."""
    from ..running.containment import agent_run_of
    run = agent_run_of()
    if run is None:
        return
    why = f"refused inside {run}: `ralph {verb}` is a human's to do"
    if run.session_dir:
        from ..tools.emit import report_refusal
        report_refusal(run.session_dir, verb, why, run=run.run_id)
    raise bad(f"{verb}: {why}")
