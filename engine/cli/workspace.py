"""Commands on the workspace: init, validate, signals, diagrams, the Telegram bot."""
from __future__ import annotations

import os
import sys
from functools import partial

from ..safe_text import printable
from .common import (EXIT_OK, bad, channel_errors, config_file, human_only, open_session,
                     session_id_of, shown_path, workspace, write_output)


def cmd_signal(args) -> int:

    from ..clock import SystemClock
    from ..views import resume_command
    human_only("signal")
    if args.priority and args.type != "steer":
        raise bad("--priority is for steer signals only")
    if args.type in ("steer", "info") and not args.message.strip():
        raise bad(f"{args.type}: MESSAGE: expected what the session is told: "
                  f"ralph signal {args.type} \"MESSAGE\"")
    session = open_session(args)
    name = session.signals.drop(args.type.upper(), args.message, now=SystemClock().now(),
                                target=args.target, iteration=args.iteration,
                                priority=args.priority)
    when = "its engine takes it at its next step" if session.running_pid() is not None \
        else f"no engine runs it: taken when it is resumed " \
             f"({resume_command(session.id, session.workspace)})"
    print(f"asked session {session.id} {SIGNAL_ASKS[args.type]}"
          + ("" if args.target.upper() == "ALL" else f" (for the {printable(args.target)})")
          + f"; {when} (signal file {name})")
    return EXIT_OK


SIGNAL_ASKS = {"pause": "to pause", "abort": "to abort",
               "steer": "to steer by your message", "info": "to take your note",
               "approve": "to promote its staged knowledge",
               "skip": "to keep its staged knowledge staged"}


def cmd_diagram(args) -> int:
    from ..diagram import graphviz_installed, render, session_path
    current = taken = None
    if args.session:
        current, taken = session_path(workspace(args),
                                      session_id_of(args, newest_if_none_open=True))
    if args.format == "svg" and not graphviz_installed():
        # the picture the web page shows, which ralph draws itself (Graphviz's adds the
        # path's numbered list and a legend)
        from ..diagram_svg import svg
        data = svg(current, taken.steps if taken else None).encode()
    else:
        data = render(args.format, current, taken)
    if args.output:
        write_output(args.output, data, "diagram")
        print(f"wrote {args.output}")
    else:
        sys.stdout.buffer.write(data if data.endswith(b"\n") or args.format == "png"
                                else data + b"\n")
    return EXIT_OK


def cmd_bot_run(args) -> int:
    """The workspace's Telegram bot in the foreground, for every session."""
    from .. import config as cfg
    from ..config_started import check_telegram_as_started
    human_only("bot run")
    from ..channels import telegram
    ws = workspace(args)
    source = config_file(args)
    config = cfg.load(source, channels=channel_errors)
    check_telegram_as_started(config, ws, source)
    found = telegram.settings(config, require_enabled=False)
    return telegram.run_foreground(ws, found)


def cmd_web(args) -> int:
    from ..channels.web import serve
    human_only("web")
    return serve(workspace(args), args.host, args.port, max_streams=args.max_streams)


def cmd_init(args) -> int:
    from importlib import resources
    human_only("init")
    if args.output:
        path = args.output
    else:   # the workspace is made if need be, as `session start` makes it
        where = workspace(args)
        os.makedirs(where, exist_ok=True)
        path = shown_path(os.path.join(where, "ralph.yml"))
    if os.path.exists(path) and not args.force:
        raise bad(f"{path} already exists; use --force to overwrite it")
    write_output(path, resources.files("ralph.engine").joinpath("ralph.yml.template")
                 .read_text(), "config")
    print(f"wrote {path}")
    return EXIT_OK


def cmd_validate(args) -> int:
    from ralph.session_store import BadInput

    from .. import config as cfg
    from ..config_started import check_approvals_as_started, unpinned
    from ..running.sandbox import check_config
    ws = workspace(args)
    path = args.config or shown_path(os.path.join(ws, "ralph.yml"))
    if not os.path.exists(path):
        raise bad(f"{path}: no such config file")
    config = cfg.load(path, all_errors=True, channels=channel_errors)
    placed = []   # what `session start` refuses from a config in the workspace, all at once
    for check in (partial(cfg.check_paths, all_errors=True),
                  partial(check_config, all_errors=True), check_approvals_as_started):
        try:
            check(config, ws, path)
        except BadInput as e:
            placed.append(str(e))
    if placed:
        raise BadInput("\n".join(placed))
    print(f"{path}: valid")
    from .sessions import preflight_problems
    for problem in preflight_problems(config):   # valid, but `session start` would refuse
        print(f"ralph: warning: {path}: {problem}: `session start` refuses it here",
              file=sys.stderr, flush=True)
    found = unpinned(config, ws, path)
    if found is not None:   # said, not refused: `session start` is where it is decided
        print(f"ralph: warning: {path}: what it runs changed since session "
              f"{found.session_id} started ({found.paths()}): `session start` refuses it "
              f"until you adopt it (--accept-config)", file=sys.stderr, flush=True)
    return EXIT_OK
