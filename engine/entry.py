"""The `ralph` console script. Agents call `ralph emit` constantly, so that path loads
only engine.tools.emit and the event bus, never the CLI module or its libraries."""
import sys


def main() -> None:
    if sys.argv[1:2] == ["emit"]:
        from engine.tools.emit import main as emit_main
        sys.exit(emit_main(sys.argv[2:]))
    from engine.cli import main as cli_main
    sys.exit(cli_main())
