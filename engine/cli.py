"""The `ralph` command. Handlers import what they need when they run, so `ralph emit`
never pays for yaml, cattrs or transitions."""
from __future__ import annotations

import os
import sys

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_PAUSED, EXIT_ABORTED, EXIT_LIMIT = 0, 1, 2, 3, 4, 5
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
SESSION_FLAGS_HELP = "the session (default: $RALPH_SESSION_ID, then the only open session)"


def workspace(args) -> str:
    return os.path.abspath(getattr(args, "workspace", None)
                           or os.environ.get("RALPH_WORKSPACE") or os.getcwd())


# --- session start / resume ---

def cmd_start(args) -> int:
    from session_store import Limits, create, dump_yaml

    from . import config as cfg
    from . import telegram_bot
    config_path = args.config or ("ralph.yml" if os.path.isfile("ralph.yml") else None)
    config = cfg.load(config_path)
    telegram_bot.check(config)   # RObot.enabled needs a token and a chat (env counts)
    if args.agent:
        config.agent = _choose_agent(config.agent, args.agent)
    objective = args.objective
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                objective = f.read()
        except OSError as e:
            raise _bad(f"{args.prompt_file}: cannot read the objective ({e.strerror})")
    if not objective or not objective.strip():
        raise _bad("an objective is required: ralph session start \"OBJECTIVE\" or -p FILE")
    loop = config.event_loop
    limits = Limits(max_iterations=loop.max_iterations,
                    max_runtime_seconds=loop.max_runtime_seconds, max_cost_usd=loop.max_cost_usd)
    _apply_limit_flags(limits, args)
    from .clock import SystemClock
    session = create(workspace(args), objective.strip(), now=SystemClock().now(),
                     session_id=args.id, limits=limits,
                     config_path=os.path.abspath(config_path) if config_path else None,
                     files={cfg.SNAPSHOT: dump_yaml(cfg.to_data(cfg.without_secrets(config)))})
    print(f"session {session.id} created in {session.dir}", flush=True)
    return _run(session, config, resume=False)


def cmd_resume(args) -> int:
    from session_store import BadInput, Status, load

    from . import config as cfg
    session = load(workspace(args), args.session_id)
    status = session.metadata.status
    if status in (Status.COMPLETED, Status.ABORTED):
        from states.complete import SUMMARY_FILE
        if os.path.exists(os.path.join(session.dir, SUMMARY_FILE)):
            raise BadInput(f"session {session.id} is {status.value}: there is nothing to resume")
        # a crash came between the final transition and the summary: finish the closing
        # work (the transition's record, the summary) and exit as the session ended
        return _run(session, cfg.load_session_config(session), resume=True)
    config = cfg.load_session_config(session)
    from . import telegram_bot
    telegram_bot.check(config)
    _apply_limit_flags(session.metadata.limits, args)
    return _run(session, config, resume=True, message=args.message)


def _run(session, config, *, resume: bool, message: str | None = None) -> int:
    from session_store import acquire_lock, release_lock

    from .driver import Engine
    lock = acquire_lock(session.dir, session.id)
    try:
        engine = Engine(session, config)
        if message:
            engine.add_resume_message(message)
        return engine.run(resume=resume)
    finally:
        release_lock(lock)


def _apply_limit_flags(limits, args) -> None:
    if args.max_iterations is not None:
        limits.max_iterations = args.max_iterations
    if args.max_runtime is not None:
        limits.max_runtime_seconds = args.max_runtime
    if args.max_cost is not None:
        limits.max_cost_usd = args.max_cost


def _choose_agent(agent, name: str):
    import attrs

    from .agents import installed_backend
    from .config import Backend
    if name == "auto":
        found = installed_backend()
        if found is None:
            raise _bad("--agent auto: none of the agent CLIs (claude, codex, gemini, kiro, amp, "
                       "copilot, opencode) is on the PATH")
        return attrs.evolve(agent, backend=found)
    try:
        return attrs.evolve(agent, backend=Backend(name))
    except ValueError:
        raise _bad(f"--agent {name}: expected auto or one of "
                   f"{', '.join(b.value for b in Backend)}") from None


# --- status / list ---

def cmd_status(args) -> int:
    import json

    from session_store import resolve_id

    from .views import session_view, status_text
    ws = workspace(args)
    view = session_view(ws, resolve_id(ws, args.session_id, newest_if_none_open=True))
    print(json.dumps(view, indent=2) if args.json else status_text(view))
    return EXIT_OK


def cmd_list(args) -> int:
    import json

    from .views import list_text, list_views
    views = list_views(workspace(args))
    print(json.dumps(views, indent=2) if args.json else list_text(views))
    return EXIT_OK


# --- humans ---

def cmd_answer(args) -> int:
    from session_store import BadInput, load, questions

    from .clock import SystemClock
    session = load(workspace(args), args.session_id)
    qid = args.question
    if qid is None:
        waiting = questions.pending(session.dir)
        if not waiting:
            raise BadInput(f"session {session.id} has no pending question")
        if len(waiting) > 1:
            raise BadInput(f"session {session.id} has several pending questions "
                           f"({', '.join(q.id for q in waiting)}); name one with --question")
        qid = waiting[0].id
    from session_store import check_id
    check_id(qid, "question id")
    questions.answer(session.dir, qid, args.text, now=SystemClock().now(), channel="cli")
    print(f"answered {qid}")
    return EXIT_OK


def cmd_interact_ask(args) -> int:
    """For agents: ask a human and block inside the agent's own run."""
    from .interact import ask_and_wait
    answer, answered = ask_and_wait(args.question, timeout=args.timeout, default=args.default,
                                    options=args.option or [], session_id=args.session,
                                    workspace=workspace(args))
    if answer is not None:
        print(answer)
    return EXIT_OK if answered else EXIT_PAUSED


def cmd_interact_progress(args) -> int:
    """For agents: a fire-and-forget note to the humans, recorded on the bus."""
    from session_store import append_event
    session = _open_session(args)
    iteration = os.environ.get("RALPH_ITERATION", "")
    record = append_event(session.dir, "human.progress", args.message,
                          source=os.environ.get("RALPH_ROLE") or "cli",
                          iteration=int(iteration) if iteration.isdigit() else None,
                          state=os.environ.get("RALPH_STATE") or None)
    print(f"progress noted (seq {record['seq']})")
    return EXIT_OK


# --- signals ---

def _open_session(args):
    from session_store import BadInput, Status, load, resolve_id
    ws = workspace(args)
    session = load(ws, resolve_id(ws, args.session))
    if session.metadata.status in (Status.COMPLETED, Status.ABORTED):
        raise BadInput(f"session {session.id} is {session.metadata.status.value}: "
                       f"it takes no more signals")
    return session


def cmd_signal(args) -> int:
    from session_store import signals

    from .clock import SystemClock
    if args.priority and args.type != "steer":
        raise _bad("--priority is for steer signals only")
    session = _open_session(args)
    name = signals.drop(session.dir, args.type.upper(), args.message, now=SystemClock().now(),
                        target=args.target, iteration=args.iteration, priority=args.priority)
    print(name)
    return EXIT_OK


def cmd_signals_poll(args) -> int:
    """For agents at their step boundaries: take the STEER/INFO meant for this role."""
    import json

    from session_store import dump_yaml, signals

    from .clock import SystemClock
    from .config import ROLES
    role = (args.role or os.environ.get("RALPH_ROLE") or "").lower()
    if role not in ROLES:
        raise _bad(f"--role {role or '(none)'}: expected one of {', '.join(ROLES)} "
                   f"(or RALPH_ROLE set by the engine)")
    session = _open_session(args)
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


# --- diagrams and the event tail ---

def cmd_diagram(args) -> int:
    from .diagram import render, session_path
    current = taken = None
    if args.session:
        from session_store import resolve_id
        ws = workspace(args)
        current, taken = session_path(ws, resolve_id(ws, args.session, newest_if_none_open=True))
    data = render(args.format, current, taken)
    if args.output:
        from session_store import write_atomic
        write_atomic(args.output, data, "diagram")
        print(f"wrote {args.output}")
    else:
        sys.stdout.buffer.write(data if data.endswith(b"\n") or args.format == "png"
                                else data + b"\n")
    return EXIT_OK


def cmd_tail(args) -> int:
    from .views import tail
    ws = workspace(args)
    from session_store import resolve_id
    return tail(ws, resolve_id(ws, args.session_id, newest_if_none_open=True), follow=args.follow,
                count=args.lines, as_json=args.json)


# --- the Telegram bot ---

def cmd_bot_run(args) -> int:
    """The workspace's Telegram bot in the foreground, for every session."""
    from . import config as cfg
    from . import telegram_bot
    ws = workspace(args)
    path = args.config or (os.path.join(ws, "ralph.yml")
                           if os.path.isfile(os.path.join(ws, "ralph.yml")) else None)
    found = telegram_bot.settings(cfg.load(path), require_enabled=False)
    return telegram_bot.run_foreground(ws, found)


# --- init / validate ---

def cmd_init(args) -> int:
    from importlib import resources

    from session_store import write_atomic
    path = args.output
    if os.path.exists(path) and not args.force:
        raise _bad(f"{path} already exists; use --force to overwrite it")
    write_atomic(path, resources.files("engine").joinpath("ralph.yml.template").read_text(),
                 "config")
    print(f"wrote {path}")
    return EXIT_OK


def cmd_validate(args) -> int:
    from . import config as cfg
    path = args.config or "ralph.yml"
    if not os.path.exists(path):
        raise _bad(f"{path}: no such config file")
    cfg.load(path, all_errors=True)
    print(f"{path}: valid")
    return EXIT_OK


def _bad(message: str):
    from session_store import BadInput
    return BadInput(message)


# --- the parser ---

def build_parser():
    import argparse  # not on `ralph emit`'s path

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit 2, no usage dump
            print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
            raise SystemExit(EXIT_BAD_INPUT)

    common = Parser(add_help=False)
    common.add_argument("--workspace", default=argparse.SUPPRESS,
                        help="the workspace (default: $RALPH_WORKSPACE, then the current directory)")
    parser = Parser(prog="ralph", parents=[common],
                    description="Drive coding agents through a durable, human-steerable state machine.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("init", parents=[common], help="write a commented ralph.yml with every default")
    p.add_argument("-o", "--output", default="ralph.yml")
    p.add_argument("--force", action="store_true")
    p.set_defaults(handler=cmd_init)

    p = sub.add_parser("validate", parents=[common], help="check a config, print every error")
    p.add_argument("-c", "--config")
    p.set_defaults(handler=cmd_validate)

    session = sub.add_parser("session", help="start, resume and inspect sessions")
    ssub = session.add_subparsers(dest="session_command", required=True, parser_class=Parser)

    def positive(kind, most=None):
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

    seconds = positive(float, 1e9)   # config.MAX_SECONDS (not imported: it loads cattrs)

    def limit_flags(p):
        p.add_argument("--max-iterations", type=positive(int))
        p.add_argument("--max-runtime", type=seconds, metavar="SECONDS")
        p.add_argument("--max-cost", type=positive(float), metavar="USD")

    p = ssub.add_parser("start", parents=[common], help="create a session and run it")
    p.add_argument("objective", nargs="?")
    p.add_argument("-p", "--prompt-file", metavar="FILE", help="read the objective from FILE")
    p.add_argument("-c", "--config", help="ralph.yml (default: ./ralph.yml if present)")
    p.add_argument("--agent", help="demo | command | claude | codex | gemini | ... | auto")
    p.add_argument("--id", help="session id (default YYMMDD-HHMMSS-xxxx)")
    limit_flags(p)
    p.set_defaults(handler=cmd_start)

    p = ssub.add_parser("resume", parents=[common], help="continue a paused or interrupted session")
    p.add_argument("session_id", metavar="ID")
    p.add_argument("--message", help="guidance for the next agent invocation")
    limit_flags(p)
    p.set_defaults(handler=cmd_resume)

    p = ssub.add_parser("status", parents=[common], help="where a session stands")
    p.add_argument("session_id", metavar="ID", nargs="?", help=SESSION_FLAGS_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_status)

    p = ssub.add_parser("answer", parents=[common], help="answer a pending human question")
    p.add_argument("session_id", metavar="ID")
    p.add_argument("text")
    p.add_argument("--question", metavar="QID", help="default: the only pending question")
    p.set_defaults(handler=cmd_answer)

    p = ssub.add_parser("tail", parents=[common], help="the session's events; -f follows them")
    p.add_argument("session_id", metavar="ID", nargs="?", help=SESSION_FLAGS_HELP)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("-n", "--lines", type=int, default=20, help="how many past events (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON record a line")
    p.set_defaults(handler=cmd_tail)

    p = ssub.add_parser("list", parents=[common], help="every session of the workspace")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_list)

    p = sub.add_parser("diagram", parents=[common], help="draw the machine (and a session's path)")
    p.add_argument("--format", choices=["mermaid", "dot", "svg", "png"], default="mermaid")
    p.add_argument("--session", help="highlight where this session stands and the path it took")
    p.add_argument("-o", "--output", metavar="FILE")
    p.set_defaults(handler=cmd_diagram)

    bot = sub.add_parser("bot", help="the workspace's Telegram bot")
    bsub = bot.add_subparsers(dest="bot_command", required=True, parser_class=Parser)
    p = bsub.add_parser("run", parents=[common],
                        help="run the Telegram bot in the foreground for every session")
    p.add_argument("-c", "--config", help="ralph.yml (default: the workspace's, if present)")
    p.set_defaults(handler=cmd_bot_run)

    p = sub.add_parser("signal", parents=[common], help="drop a signal into a session's mailbox")
    p.add_argument("type", choices=["steer", "info", "pause", "abort", "approve", "skip"],
                   type=str.lower)
    p.add_argument("message")
    p.add_argument("--session", help=SESSION_FLAGS_HELP)
    p.add_argument("--target", default="ALL",
                   help="ALL | Orchestrator | Planner | Executor | Reviewer | Librarian | Questioner")
    p.add_argument("--iteration", type=int, help="for approve/skip: the iteration it is meant for")
    p.add_argument("--priority", action="store_true",
                   help="steer only: interrupt the running agent and re-run its task now")
    p.set_defaults(handler=cmd_signal)

    tools = sub.add_parser("tools", help="for agents: tools to use during a run")
    tsub = tools.add_subparsers(dest="tool", required=True, parser_class=Parser)
    sig = tsub.add_parser("signals", help="the signals mailbox")
    sigsub = sig.add_subparsers(dest="signals_command", required=True, parser_class=Parser)
    p = sigsub.add_parser("poll", parents=[common],
                          help="take the STEER/INFO signals addressed to ALL or to this role")
    p.add_argument("--role", help="default: $RALPH_ROLE")
    p.add_argument("--session", help=SESSION_FLAGS_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_signals_poll)

    interact = tsub.add_parser("interact", help="talk to the humans")
    isub = interact.add_subparsers(dest="interact_command", required=True, parser_class=Parser)
    p = isub.add_parser("ask", parents=[common], help="block until a human answers; print it")
    p.add_argument("question")
    p.add_argument("--timeout", type=seconds, help="seconds (default: RObot.timeout_seconds)")
    p.add_argument("--default", help="printed on timeout (exit 3)")
    p.add_argument("--option", action="append", help="a suggested answer (repeatable)")
    p.add_argument("--session", help=SESSION_FLAGS_HELP)
    p.set_defaults(handler=cmd_interact_ask)
    p = isub.add_parser("progress", parents=[common], help="tell the humans how it goes")
    p.add_argument("message")
    p.add_argument("--session", help=SESSION_FLAGS_HELP)
    p.set_defaults(handler=cmd_interact_progress)

    p = sub.add_parser("emit", help="for agents: append an event to the session's bus")
    p.add_argument("topic")
    p.add_argument("payload", nargs="?")
    p.add_argument("--json")
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop like ^C (the session stays resumable), exit 143."""


def _terminate(_signum, _frame):
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["emit"]:  # agents' hot path (engine/entry.py takes it before this module)
        from .emit import main as emit_main
        return emit_main(argv[1:])
    from .emit import is_text  # stdlib only: cheap
    bad = next((i for i, arg in enumerate(argv, 1) if not is_text(arg)), None)
    if bad is not None:   # bytes that are not UTF-8 reach Python as lone surrogates
        print(f"ralph: error: argument {bad} is not valid UTF-8 text", file=sys.stderr)
        return EXIT_BAD_INPUT
    import signal
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.handler(args)
    except KeyboardInterrupt as e:
        print("ralph: interrupted; the session is resumable", file=sys.stderr)
        return EXIT_SIGTERM if isinstance(e, Terminated) else EXIT_SIGINT
    except Exception as e:
        from session_store import BadInput
        if isinstance(e, BadInput):
            for line in str(e).splitlines():  # `validate` reports every error, one a line
                print(f"ralph: error: {line}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if os.environ.get("RALPH_DEBUG"):
            raise
        print(f"ralph: internal error: {type(e).__name__}: {e} (RALPH_DEBUG=1 shows where)",
              file=sys.stderr)
        return EXIT_INTERNAL
