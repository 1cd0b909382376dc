"""The `ralph` console script. Agents call `ralph emit`, `tools interact progress` and
`tools signals poll` constantly (and their CLIs `tools approve` before tool calls), so those
paths load only engine.tools.emit and the event
bus (a poll that finds signals to take goes on to the CLI), never the CLI module or its
libraries."""
import os
import sys


def main() -> None:
    if sys.argv[1:2] == ["emit"]:
        from ralph.engine.tools.emit import main as emit_main
        sys.exit(emit_main(sys.argv[2:]))
    in_a_run = bool(os.environ.get("RALPH_RUN_ID"))   # else the CLI's checks (a person)
    if sys.argv[1:4] == ["tools", "interact", "progress"] and in_a_run and \
            not {"-h", "--help"} & set(sys.argv[4:]):
        from ralph.engine.tools.emit import progress_main
        sys.exit(progress_main(sys.argv[4:]))
    if sys.argv[1:3] == ["tools", "approve"] and not {"-h", "--help"} & set(sys.argv[3:]):
        from ralph.engine.tools.approve import main as approve_main   # a CLI's pre-tool hook
        sys.exit(approve_main(sys.argv[3:]))
    if sys.argv[1:4] == ["tools", "signals", "poll"] and in_a_run:
        from ralph.engine.tools.emit import poll_when_empty
        code = poll_when_empty(sys.argv[4:])
        if code is not None:
            sys.exit(code)
    from ralph.engine.cli import main as cli_main
    sys.exit(cli_main(exiting=True))
