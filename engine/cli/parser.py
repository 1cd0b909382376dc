"""The `ralph` argument parser: every command, its flags, and the handler it runs.

The commands are a tree (COMMANDS). argparse makes a parser per command (~6 ms for all
of them, on every start), so a command line that names one (`ralph session status ...`)
gets the parsers on its path only; the help and an unknown command's error get them all."""
from __future__ import annotations

import argparse
import sys

from . import agent_tools, sessions
from . import workspace as workspace_cmds
from .common import EXIT_BAD_INPUT, SESSION_FLAGS_HELP

EXIT_CODES = """exit codes:
  0    completed (also when some tasks ended [F]); any other command: done
  1    internal error
  2    bad input or refused (usage, config, unknown session, a session locked by a
       running engine, resume of a finished session or of one whose limit still holds,
       a question already answered)
  3    paused (resumable)
  4    aborted
  5    paused by a limit (resume with a higher --max-iterations, --max-runtime or --max-cost)
  130  interrupted by SIGINT, 143 by SIGTERM (both resumable)
  141  the reader of the output went away (e.g. `| head`)"""


ERROR = "ralph: error: "   # every command's one prefix for what it refuses


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2, no usage dump
        print(f"{ERROR}{message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser(argv: list[str] | None = None) -> Parser:
    """The parser of every command, or of those on the path `argv` names (its leading
    words: `session status` of `session status ID --json`)."""
    common = Parser(add_help=False)
    common.add_argument("--workspace", default=argparse.SUPPRESS, metavar="DIR",
                        help="the workspace (default: $RALPH_WORKSPACE, then the current directory)")
    parser = Parser(prog="ralph", parents=[common], epilog=EXIT_CODES,
                    description="Drive coding agents through a durable, human-steerable state machine.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser,
                                help="what to do (ralph COMMAND --help for its flags)")
    parser.set_defaults(handler=lambda _args: _print_help(parser))
    path = []
    for word in argv or ():
        if word.startswith("-"):
            break
        path.append(word)
    _add_commands(sub, COMMANDS, path, common)
    return parser


def _add_commands(sub, commands: dict, path: list[str], common: Parser) -> None:
    """Under `sub`: the command `path` names first, alone, else every one of `commands`."""
    named = bool(path) and path[0] in commands
    for name, (help_text, made, *example) in commands.items():
        if named and name != path[0]:
            continue
        if isinstance(made, dict):   # a group of commands
            group = sub.add_parser(name, help=help_text, description=_purpose(help_text))
            subs = group.add_subparsers(dest=f"{name}_command", required=True,
                                        parser_class=Parser, metavar="COMMAND",
                                        help="one of these")
            _add_commands(subs, made, path[1:] if named else [], common)
        else:   # a leaf: its purpose, its flags, an example (the exit codes: `ralph --help`)
            made(sub.add_parser(name, parents=[common], help=help_text,
                                description=_purpose(help_text),
                                epilog=examples(example)))


def examples(lines) -> str:
    """A leaf command's --help ends with its example(s); the exit codes are said once."""
    return (f"example{'s' if len(lines) > 1 else ''}:\n"
            + "".join(f"  {line}\n" for line in lines) + "\nexit codes: see `ralph --help`")


def _purpose(help_text: str) -> str:
    """A command's one-line help as the first line of its own --help."""
    return help_text[:1].upper() + help_text[1:] + "."


# --- the flags' values ---

def _positive(kind, most=None):
    """A flag's number: finite and above 0 (argparse's float takes nan and inf, which
    passed every check and crashed deadlines later); seconds up to ~31 years."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not 0 < value < float("inf") or (most is not None and value > most):
            raise argparse.ArgumentTypeError(
                f"expected a positive number{f' of at most {most:g}' if most else ''}, "
                f"got {text!r}")
        return value
    return parse


def _ask_seconds(text):
    from ..tools.interact import ask_seconds   # MCP `ask`'s check; loaded when given
    try:
        return ask_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _port(text):
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    return int(text)


_seconds = _positive(float, 1e9)   # config.MAX_SECONDS (not imported: it loads attrs)


def _limit_flags(p) -> None:
    p.add_argument("--max-iterations", type=_positive(int), metavar="N",
                   help="pause (exit 5) after N iterations "
                        "(default: event_loop.max_iterations)")
    p.add_argument("--max-runtime", type=_seconds, metavar="SECONDS",
                   help="pause (exit 5) after this much engine time "
                        "(default: event_loop.max_runtime_seconds)")
    p.add_argument("--max-cost", type=_positive(float), metavar="USD",
                   help="pause (exit 5) once agents report this cost "
                        "(default: event_loop.max_cost_usd)")


def _sandbox_flag(p) -> None:
    p.add_argument("--sandbox", choices=("enforce", "none"),
                   help="none: agents and hooks run with your rights, unconfined, for this "
                        "run of the engine (default: agent.sandbox of a config outside the "
                        "workspace, else enforce)")


# --- each command's flags and handler. one_shot: a command that does its work and exits
# (the CLI turns the cycle collector off for it; see engine/cli/__init__.py) ---

def _init(p) -> None:
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write it (default: the workspace's ralph.yml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(handler=workspace_cmds.cmd_init, one_shot=True, new_workspace=True)


def _validate(p) -> None:
    p.add_argument("-c", "--config", metavar="FILE",
                   help="the config (default: the workspace's ralph.yml)")
    p.set_defaults(handler=workspace_cmds.cmd_validate, one_shot=True)


def _session_start(p) -> None:
    p.add_argument("objective", nargs="?", help="what the session is to achieve (or -p FILE)")
    p.add_argument("-p", "--prompt-file", metavar="FILE", help="read the objective from FILE")
    p.add_argument("-c", "--config", metavar="FILE",
                   help="the config (default: the workspace's ralph.yml, if present)")
    p.add_argument("--agent", help="demo | command | claude | codex | gemini | ... | auto")
    p.add_argument("--id", help="session id (default YYMMDD-HHMMSS-xxxx)")
    p.add_argument("--accept-config", action="store_true",
                   help="adopt the workspace's ralph.yml though what it runs (the agents' "
                        "commands, the hooks) changed since the last session started; "
                        "without it, such a config is refused (at a terminal: asked)")
    _limit_flags(p)
    _sandbox_flag(p)
    p.set_defaults(handler=sessions.cmd_start, new_workspace=True)   # made if need be


def _session_resume(p) -> None:
    p.add_argument("session_id", metavar="ID", nargs="?", help=SESSION_FLAGS_HELP)
    p.add_argument("--message", help="guidance for the next agent invocation")
    p.add_argument("--now", action="store_true",
                   help="retry at once a step waiting for its agent's usage limit to reset")
    _limit_flags(p)
    _sandbox_flag(p)
    p.set_defaults(handler=sessions.cmd_resume)


def _session_status(p) -> None:
    p.add_argument("session_id", metavar="ID", nargs="?",
                   help=SESSION_FLAGS_HELP + ", then the newest")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=sessions.cmd_status, one_shot=True)


def _session_answer(p) -> None:
    p.add_argument("session_id", metavar="ID", nargs="?", help=SESSION_FLAGS_HELP)
    p.add_argument("text", metavar="TEXT",
                   help="the answer: free text, or an option by its number, text or a unique "
                        "prefix")
    p.add_argument("--question", metavar="QID", help="default: the only pending question")
    p.set_defaults(handler=sessions.cmd_answer, one_shot=True)


def _session_tail(p) -> None:
    p.add_argument("session_id", metavar="ID", nargs="?",
                   help=SESSION_FLAGS_HELP + ", then the newest")
    p.add_argument("-f", "--follow", action="store_true",
                   help="print new events as they land, until the session ends")
    p.add_argument("-n", "--lines", type=int, default=20, help="how many past events (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON record a line")
    p.set_defaults(handler=sessions.cmd_tail)


def _session_diff(p) -> None:
    p.add_argument("session_id", metavar="ID", nargs="?",
                   help=SESSION_FLAGS_HELP + ", then the newest")
    p.add_argument("--task", metavar="T", help="only the commit(s) of task T")
    p.set_defaults(handler=sessions.cmd_diff, one_shot=True)


def _session_clean(p) -> None:
    p.add_argument("session_id", metavar="ID", help="the session")
    p.set_defaults(handler=sessions.cmd_clean, one_shot=True)


def _session_diagnose(p) -> None:
    p.add_argument("session_id", metavar="ID", nargs="?",
                   help=SESSION_FLAGS_HELP + ", then the newest")
    p.set_defaults(handler=sessions.cmd_diagnose, one_shot=True)


def _session_list(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.set_defaults(handler=sessions.cmd_list, one_shot=True)


def _diagram(p) -> None:
    p.add_argument("--format", choices=["mermaid", "dot", "svg", "png"], default="mermaid",
                   help="mermaid (default) or dot as text; svg (drawn by Graphviz when "
                        "it is installed, else by ralph); png needs Graphviz")
    p.add_argument("--session", metavar="ID",
                   help="highlight where this session stands and the path it took")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    p.set_defaults(handler=workspace_cmds.cmd_diagram, one_shot=True)


def _bot_run(p) -> None:
    p.add_argument("-c", "--config", metavar="FILE",
                   help="the config (default: the workspace's ralph.yml, if present)")
    p.set_defaults(handler=workspace_cmds.cmd_bot_run)


def _web(p) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs $RALPH_WEB_TOKEN)")
    p.add_argument("--port", type=_port, default=8765, help="default 8765; 0 picks a free one")
    p.add_argument("--max-streams", type=_positive(int, 10000), metavar="N",
                   help="live streams (open pages) served at once; one more is refused "
                        "(default 32)")
    p.set_defaults(handler=workspace_cmds.cmd_web)


def _signal(p) -> None:
    p.add_argument("type", choices=["steer", "info", "pause", "abort", "approve", "skip"],
                   type=str.lower, metavar="TYPE",
                   help="steer | info | pause | abort | approve | skip")
    p.add_argument("message", metavar="MESSAGE", nargs="?", default="",
                   help="what the session is told (steer and info need one)")
    p.add_argument("--session", metavar="ID", help=SESSION_FLAGS_HELP)
    p.add_argument("--target", default="ALL",
                   help="ALL | Orchestrator | Planner | Executor | Reviewer | Librarian | Questioner")
    p.add_argument("--iteration", type=int, help="for approve/skip: the iteration it is meant for")
    p.add_argument("--priority", action="store_true",
                   help="steer only: interrupt the running agent and re-run its task now")
    p.set_defaults(handler=workspace_cmds.cmd_signal, one_shot=True)


def _signals_poll(p) -> None:
    p.add_argument("--role", help="default: $RALPH_ROLE")
    p.add_argument("--session", metavar="ID", help=SESSION_FLAGS_HELP)
    p.add_argument("--json", action="store_true", help="print JSON (default: YAML)")
    p.set_defaults(handler=agent_tools.cmd_signals_poll, one_shot=True)


def _interact_ask(p) -> None:
    p.add_argument("question", metavar="QUESTION", help="what to ask")
    p.add_argument("--timeout", type=_ask_seconds,
                   help="seconds, at most a day (default: RObot.timeout_seconds)")
    p.add_argument("--default", help="printed on timeout (exit 3)")
    p.add_argument("--option", action="append", help="a suggested answer (repeatable)")
    p.add_argument("--session", metavar="ID", help=SESSION_FLAGS_HELP)
    p.set_defaults(handler=agent_tools.cmd_interact_ask)


def _interact_progress(p) -> None:
    p.add_argument("message", metavar="MESSAGE", help="the note")
    p.add_argument("--session", metavar="ID", help=SESSION_FLAGS_HELP)
    p.set_defaults(handler=agent_tools.cmd_interact_progress, one_shot=True)


def _approve(p) -> None:
    p.add_argument("--cli", required=True, choices=["claude", "codex", "gemini"],
                   help="the CLI whose hook this is (its tool call's JSON and its answer)")
    p.set_defaults(handler=agent_tools.cmd_approve)


def _mcp(p) -> None:
    p.add_argument("--session", metavar="ID",
                   help="the session (default: $RALPH_SESSION_DIR inside an agent run, then "
                        "$RALPH_SESSION_ID, then the only open session)")
    p.set_defaults(handler=agent_tools.cmd_mcp)


def _emit_flags(p) -> None:
    # `ralph emit ...` is parsed by engine/tools/emit.py (stdlib only); this parser is its
    # help, and runs it when flags come first (`ralph --workspace W emit ...`)
    p.add_argument("topic", metavar="TOPIC", help="dotted words, e.g. build.done")
    p.add_argument("payload", metavar="PAYLOAD", nargs="?", help="the event's text payload")
    p.add_argument("--json", metavar="JSON", help="the payload as a JSON value")
    p.add_argument("--session", metavar="ID", help=SESSION_FLAGS_HELP)
    p.set_defaults(handler=_emit, one_shot=True)


# name -> (help, what makes it: a function given its parser, or the group's own commands;
# then, for a command, the example lines its --help ends with)
COMMANDS: dict = {
    "init": ("write a commented ralph.yml with every default", _init,
             "ralph init                  # then edit agent.backend in ralph.yml"),
    "validate": ("check a config, print every error", _validate,
                 "ralph validate -c ~/ralph/my.yml"),
    "session": ("start, resume and inspect sessions", {
        "start": ("create a session and run it", _session_start,
                  'ralph session start "add a --verbose flag to the CLI" --max-iterations 3'),
        "resume": ("continue a paused or interrupted session", _session_resume,
                   "ralph session resume 250101-120000-ab12 --message \"skip the docs task\""),
        "status": ("where a session stands", _session_status,
                   "ralph session status 250101-120000-ab12 --json"),
        "answer": ("answer a pending human question", _session_answer,
                   "ralph session answer 250101-120000-ab12 2     # its option 2"),
        "tail": ("the session's events; -f follows them", _session_tail,
                 "ralph session tail -f"),
        "diff": ("what a session changed in a git workspace (its branch), or one task's "
                 "commits", _session_diff, "ralph session diff 250101-120000-ab12 --task t1"),
        "clean": ("remove the branch a session left (not while it runs)", _session_clean,
                  "ralph session clean 250101-120000-ab12"),
        "diagnose": ("a summary of a session's diagnostics: the path it took, its slowest "
                     "runs, failing gates and hooks", _session_diagnose,
                     "ralph session diagnose 250101-120000-ab12"),
        "list": ("every session of the workspace", _session_list, "ralph session list --json"),
    }),
    "diagram": ("draw the machine (and a session's path)", _diagram,
                "ralph diagram --format svg --session 250101-120000-ab12 -o path.svg"),
    "bot": ("the workspace's Telegram bot", {
        "run": ("run the Telegram bot in the foreground for every session", _bot_run,
                "ralph bot run -c ~/ralph/my.yml"),
    }),
    "web": ("a live web view of the sessions: answer and steer from the page (open the URL "
            "it prints: it carries the token every request needs)", _web,
            "ralph web --port 8765"),
    "signal": ("drop a signal into a session's mailbox", _signal,
               'ralph signal steer "use the existing logger" --session 250101-120000-ab12',
               'ralph signal pause "lunch break"'),
    "tools": ("for agents: tools to use during a run", {
        "signals": ("the signals mailbox", {
            "poll": ("take the STEER/INFO signals addressed to ALL or to this role",
                     _signals_poll, "ralph tools signals poll --json"),
        }),
        "interact": ("talk to the humans", {
            "ask": ("block until a human answers; print it", _interact_ask,
                    'ralph tools interact ask "Which database?" --option sqlite '
                    "--option postgres --timeout 600"),
            "progress": ("tell the humans how it goes", _interact_progress,
                         'ralph tools interact progress "tests pass, writing docs"'),
        }),
        "approve": ("a CLI's pre-tool hook (agent.approve): the tool call as JSON on stdin; "
                    "a human allows or denies it", _approve,
                    "ralph tools approve --cli claude < tool-call.json"),
    }),
    "mcp": ("for agents: the agent tools (emit, ask, progress, signals_poll, blocker, status) "
            "as an MCP server over stdio", _mcp, "ralph mcp --session 250101-120000-ab12"),
    "emit": ("for agents: append an event to the session's bus", _emit_flags,
             'ralph emit build.done --json \'{"tests": "pass", "lint": "pass"}\''),
}


def _emit(args) -> int:
    import os

    from ..tools.emit import main as emit_main
    from .common import workspace
    os.environ["RALPH_WORKSPACE"] = workspace(args)
    argv = [args.topic] + ([args.payload] if args.payload is not None else []) \
        + (["--json", args.json] if args.json is not None else []) \
        + (["--session", args.session] if args.session else [])
    return emit_main(argv)


def _print_help(parser) -> int:
    """`ralph` alone: the help, not an error."""
    parser.print_help()
    return 0


class _Version(argparse.Action):
    """--version: the package's metadata is read only when asked (importlib.metadata
    costs every other command ~20 ms)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from ..version import version
        print(f"ralph {version()}")
        parser.exit()
