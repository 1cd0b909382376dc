"""`ralph emit TOPIC [PAYLOAD] [--json JSON]`: the agents' way to talk to the engine.

The cold path imports the stdlib and the event bus only (no yaml, cattrs, transitions):
agents call this constantly.
"""
from __future__ import annotations

import json
import os
import re
import sys

TOPIC = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*")
USAGE = "usage: ralph emit TOPIC [PAYLOAD] [--json JSON]"


class EmitError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[str, object]:
    args, json_text, it = [], None, iter(argv)
    for arg in it:
        if arg == "--json":
            json_text = next(it, None)
            if json_text is None:
                raise EmitError("--json: expected a JSON value after it")
        elif arg.startswith("--json="):
            json_text = arg[len("--json="):]
        elif arg in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        else:
            args.append(arg)
    if not args or len(args) > 2:
        raise EmitError(USAGE)
    topic = args[0]
    if len(topic) > 200 or not TOPIC.fullmatch(topic):
        raise EmitError(f"topic {topic[:80]!r}: expected dotted words like build.done "
                        f"(letters, digits, _ and -)")
    if json_text is not None and len(args) == 2:
        raise EmitError("give the payload as PAYLOAD or as --json, not both")
    if json_text is not None:
        try:
            payload = json.loads(json_text)
        except ValueError as e:
            raise EmitError(f"--json: not valid JSON ({e})") from None
    else:
        payload = args[1] if len(args) == 2 else None
    if topic in ("blocker", "confidence"):  # topics the engine reads field by field
        from .event_schemas import VALIDATORS
        problem = VALIDATORS[topic](payload)
        if problem:
            raise EmitError(f"{topic} --json: {problem}")
    return topic, payload


def session_dir() -> str:
    """$RALPH_SESSION_DIR inside an agent; else the workspace's session (slower path)."""
    found = os.environ.get("RALPH_SESSION_DIR")
    if found:
        if not os.path.isdir(found):
            raise EmitError(f"RALPH_SESSION_DIR {found}: no such session directory")
        return found
    from session_store import BadInput, resolve_id, sessions_root  # not on an agent's path
    workspace = os.environ.get("RALPH_WORKSPACE", os.getcwd())
    try:
        return os.path.join(sessions_root(workspace), resolve_id(workspace, None))
    except BadInput as e:
        raise EmitError(str(e)) from None


def main(argv: list[str]) -> int:
    from session_store._events import append_event
    try:
        topic, payload = parse_args(argv)
        directory = session_dir()
    except EmitError as e:
        print(f"ralph emit: error: {e}", file=sys.stderr)
        return 2
    iteration = os.environ.get("RALPH_ITERATION", "")
    record = append_event(directory, topic, payload,
                          source=os.environ.get("RALPH_ROLE") or "cli",
                          iteration=int(iteration) if iteration.isdigit() else None,
                          state=os.environ.get("RALPH_STATE") or None)
    print(f"emitted {topic} (seq {record['seq']})")
    return 0
