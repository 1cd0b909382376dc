"""The `ralph` console script. Agents call `ralph emit` (and `tools interact progress`)
constantly, so those paths load only engine.tools.emit and the event bus, never the CLI
module or its libraries."""
import sys


def main() -> None:
    if sys.argv[1:2] == ["emit"]:
        from engine.tools.emit import main as emit_main
        sys.exit(emit_main(sys.argv[2:]))
    if sys.argv[1:4] == ["tools", "interact", "progress"] and \
            not {"-h", "--help"} & set(sys.argv[4:]):
        from engine.tools.emit import progress_main
        sys.exit(progress_main(sys.argv[4:]))
    from engine.cli import main as cli_main
    sys.exit(cli_main())
