"""The `ralph` command. Handlers import what they need when they run, so `ralph emit`
never pays for yaml, attrs or transitions."""
from __future__ import annotations

import os
import sys

from .common import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_SIGINT, EXIT_SIGTERM

EXIT_BROKEN_PIPE = 141   # what a shell reports for a program its reader left (128 + SIGPIPE)


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop like ^C (the session stays resumable), exit 143."""


def _terminate(_signum, _frame):
    raise Terminated


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """`ralph ARGV`; `exiting`: the process ends when it returns (the console script)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["emit"]:  # agents' hot path (engine/entry.py takes it before this module)
        from ..tools.emit import main as emit_main
        return emit_main(argv[1:])
    from ..tools.emit import is_text  # stdlib only: cheap
    bad = next((i for i, arg in enumerate(argv, 1) if not is_text(arg)), None)
    if bad is not None:   # bytes that are not UTF-8 reach Python as lone surrogates
        print(f"ralph: error: argument {bad} is not valid UTF-8 text", file=sys.stderr)
        return EXIT_BAD_INPUT
    import signal

    from ..secrets import hide_from_proc
    from .parser import build_parser
    hide_from_proc()   # the tokens this command holds: not in /proc/<pid>/environ
    args = build_parser(argv).parse_args(argv)
    if exiting and getattr(args, "one_shot", False):
        _leave_objects_to_the_exit()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = args.handler(args)
        sys.stdout.flush()   # inside the try: a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:   # `ralph session list | head -1`: the reader has had enough
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as e:
        print(f"ralph: interrupted{_how_to_resume(args)}", file=sys.stderr)
        return EXIT_SIGTERM if isinstance(e, Terminated) else EXIT_SIGINT
    except Exception as e:
        from ralph.session_store import BadInput, DiskFault, UnknownSession

        from ..safe_text import printable   # a file name or value an agent chose, escaped
        if isinstance(e, DiskFault):   # a one-shot command: nothing was left half-written
            print(f"ralph: error: {printable(str(e))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if isinstance(e, BadInput):
            said = str(e)
            if isinstance(e, UnknownSession):
                from .common import nearest_session
                said += nearest_session(args)
            for line in said.splitlines():  # `validate` reports every error, one a line
                print(f"ralph: error: {printable(line)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if os.environ.get("RALPH_DEBUG"):
            raise
        print(f"ralph: internal error: {type(e).__name__}: {printable(str(e))} "
              f"(RALPH_DEBUG=1 shows where)", file=sys.stderr)
        return EXIT_INTERNAL


def _how_to_resume(args) -> str:
    """For an engine's command (start, resume): the command that resumes its session."""
    session_id = getattr(args, "engine_session", None)
    if session_id is None:
        return ""
    from ..views import resume_command
    from .common import workspace
    return f"; the session is resumable: {resume_command(session_id, workspace(args))}"


def _leave_objects_to_the_exit() -> None:
    """A one-shot command's objects live until its process exits, so the cycle collector
    finds next to nothing to free: it would only scan the thousands attrs and cattrs make
    at import (~5 ms), then every one again in the interpreter's last collection (~9 ms).
    Frozen at exit, they are left to the exit."""
    import atexit
    import gc
    gc.disable()
    atexit.register(gc.freeze)


def _drop_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush at exit would hit the
    closed pipe again and print a warning."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
