"""`ralph emit TOPIC [PAYLOAD] [--json JSON]`: the agents' way to talk to the engine.

The cold path imports the stdlib and the event bus only (no yaml, attrs, transitions):
agents call this constantly.
"""
from __future__ import annotations

import json
import os
import re
import sys

TOPIC = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*")
USAGE = "usage: ralph emit TOPIC [PAYLOAD] [--json JSON] [--session ID]"


class EmitError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[str, object]:
    for i, arg in enumerate(argv, 1):
        if not is_text(arg):   # bytes that are not UTF-8 reach Python as lone surrogates
            raise EmitError(f"argument {i} is not valid UTF-8 text")
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
    _check_topic(topic)   # the topic first: the payload's errors only for a good topic
    if json_text is not None and len(args) == 2:
        raise EmitError("give the payload as PAYLOAD or as --json, not both")
    if json_text is not None:
        try:
            payload = json.loads(json_text, parse_constant=_not_json, parse_float=_finite)
        except ValueError as e:
            raise EmitError(f"--json: not valid JSON ({e})") from None
        except RecursionError:
            raise EmitError("--json: nested too deeply") from None
        if not is_text(json.dumps(payload, ensure_ascii=False)):
            raise EmitError("--json: a \\ud800-style escape that is no character")
    else:
        payload = args[1] if len(args) == 2 else None
    check(topic, payload, "--json")
    return topic, payload


def check(topic: str, payload, where: str = "payload") -> None:
    """An event an agent may publish: a dotted topic, and the fields the engine reads
    for `blocker` and `confidence` (EmitError says what is wrong)."""
    _check_topic(topic)
    if topic in ("blocker", "confidence"):  # topics the engine reads field by field
        from ..event_schemas import VALIDATORS
        problem = VALIDATORS[topic](payload)
        if problem:
            raise EmitError(f"{topic} {where}: {problem}")


def _check_topic(topic: str) -> None:
    if not isinstance(topic, str) or len(topic) > 200 or not TOPIC.fullmatch(topic):
        raise EmitError(f"topic {str(topic)[:80]!r}: expected dotted words like build.done "
                        f"(letters, digits, _ and -)")


def publish(directory: str, topic: str, payload) -> dict:
    """Append an agent's event to the session's bus, stamped from the run's environment
    (role, iteration, state, run: an event of a run that is over is refused)."""
    from session_store._events import append_event
    iteration = os.environ.get("RALPH_ITERATION", "")
    return append_event(directory, topic, payload,
                        source=os.environ.get("RALPH_ROLE") or "cli",
                        iteration=int(iteration) if iteration.isdigit() else None,
                        state=os.environ.get("RALPH_STATE") or None,
                        run=os.environ.get("RALPH_RUN_ID") or None)


def is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _not_json(name: str):
    """NaN and Infinity: Python's json reads and writes them, but they are not JSON, and
    the bus is read by other tools too."""
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):   # 1e999 reads as infinity
        raise ValueError(f"{text[:40]} is out of range")
    return value


def take_session(argv: list[str]) -> tuple[list[str], str | None]:
    """`--session ID` (or `--session=ID`) out of argv: (the rest, ID or None)."""
    rest, session, it = [], None, iter(argv)
    for arg in it:
        if arg == "--session":
            session = next(it, None)
            if session is None:
                raise EmitError("--session: expected a session id after it")
        elif arg.startswith("--session="):
            session = arg[len("--session="):]
        else:
            rest.append(arg)
    return rest, session


def session_dir(session_id: str | None = None) -> str:
    """$RALPH_SESSION_DIR inside an agent; else the workspace's session named by --session,
    $RALPH_SESSION_ID or the only open one (slower path)."""
    found = None if session_id else os.environ.get("RALPH_SESSION_DIR")
    if found:
        if not os.path.isdir(found):
            raise EmitError(f"RALPH_SESSION_DIR {found}: no such session directory")
        return os.path.abspath(found)   # its parts name the workspace and the session
    from session_store import BadInput, resolve_id, sessions_root  # not on an agent's path
    workspace = os.environ.get("RALPH_WORKSPACE", os.getcwd())
    try:
        found = os.path.join(sessions_root(workspace), resolve_id(workspace, session_id))
    except BadInput as e:
        raise EmitError(str(e)) from None
    if not os.path.isdir(found):
        raise EmitError(f"unknown session {os.path.basename(found)} in {sessions_root(workspace)}")
    return found


def progress_main(argv: list[str]) -> int:
    """`ralph tools interact progress MESSAGE [--session ID]` on the same cold path as
    emit (agents call it often): a note to the humans, on the bus as human.progress."""
    try:
        argv, session_id = take_session(argv)
        if len(argv) != 1 or not is_text(argv[0]):
            raise EmitError("usage: ralph tools interact progress MESSAGE [--session ID]")
        directory = session_dir(session_id)
    except EmitError as e:
        print(f"ralph: error: {e}", file=sys.stderr)
        return 2
    from session_store._errors import BadInput, DiskFault
    try:
        record = publish(directory, "human.progress", argv[0])
    except (BadInput, DiskFault) as e:
        print(f"ralph: error: {e}", file=sys.stderr)
        return 2
    print(f"progress noted (seq {record['seq']})")
    return 0


def poll_when_empty(argv: list[str]) -> int | None:
    """`ralph tools signals poll [--role R] [--session ID] [--json]` when nothing waits in
    the mailbox, the usual case at an agent's step boundary: answered from a directory
    listing. None when there is something to parse and take (the CLI does that)."""
    from session_store._inbox import waiting
    from session_store._types import ROLES
    try:
        argv, session_id = take_session(argv)
        as_json, role, it = False, os.environ.get("RALPH_ROLE") or "", iter(argv)
        for arg in it:
            if arg == "--json":
                as_json = True
            elif arg == "--role":
                role = next(it, "")
            else:
                return None   # anything else: the CLI says what is wrong
        if role.lower() not in ROLES:
            return None
        directory = session_dir(session_id)
    except EmitError:
        return None
    if waiting(directory):
        return None
    print('{\n  "signals": [],\n  "engine_will_act_on": []\n}' if as_json
          else "signals: []\nengine_will_act_on: []")
    return 0


def main(argv: list[str]) -> int:
    try:
        argv, session_id = take_session(argv)
        topic, payload = parse_args(argv)
        directory = session_dir(session_id)
    except EmitError as e:
        print(f"ralph emit: error: {e}", file=sys.stderr)
        return 2
    from session_store._errors import BadInput, DiskFault
    try:
        record = publish(directory, topic, payload)
    except (BadInput, DiskFault) as e:   # a symlink, a run that is over, a full disk
        print(f"ralph emit: error: {e}", file=sys.stderr)
        return 2
    print(f"emitted {topic} (seq {record['seq']})")
    return 0
