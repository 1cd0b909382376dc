"""`ralph emit TOPIC [PAYLOAD] [--json JSON]`: the agents' way to talk to the engine.

An event goes to the run's outbox, in the session's work area (agents never write the
control plane); the engine takes it from there, as the run's, and records it on the bus. The cold
path imports the stdlib and the outbox only (no yaml, attrs, transitions): agents call
this constantly.
"""
from __future__ import annotations

import json
import os
import re
import sys

TOPIC = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*")
# what only the engine or a human says: an agent's event on one of these would speak as
# ralph (a transition, a pause) or as a human (an answer, an approval)
RESERVED_PREFIXES = ("session.", "engine.", "gate.", "fallback.", "signal.", "emit.", "cli.",
                     "ralph.", "hook.", "approval.", "limit.", "diagnostics.", "git.",
                     "quota.")
RESERVED = frozenset({"human.question", "human.response", "human.timeout", "task.resume",
                      "knowledge.promoted", "knowledge.refused"})
MAX_EVENT_BYTES = 1 << 20   # session_store's outbox cap unless its header says otherwise
USAGE = "usage: ralph emit TOPIC [PAYLOAD] [--json JSON] [--session ID]"
HELP = USAGE + """

For agents: append an event to the session's bus (inside a run it needs no flag).

positional arguments:
  TOPIC           dotted words, e.g. build.done, review.done, human.interact
  PAYLOAD         the event's text payload

options:
  -h, --help      show this help message and exit
  --json JSON     the payload as a JSON value
  --session ID    the session (default: $RALPH_SESSION_ID, then the only open session)

examples:
  ralph emit build.done --json '{"tests": "pass", "lint": "pass"}'
  ralph emit human.interact "Which database should I use?"

exit codes: see `ralph --help`"""


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
            print(HELP)
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
    return topic, payload   # the caller checks it (check), with the engine's size cap


def check(topic: str, payload, where: str = "payload",
          max_bytes: int = MAX_EVENT_BYTES) -> None:
    """An event an agent may publish: a dotted topic that is not the engine's or a
    human's, a payload of at most `max_bytes`, and the fields the engine reads for
    `blocker` and `confidence` (EmitError says what is wrong)."""
    _check_topic(topic)
    if topic in RESERVED or topic.startswith(RESERVED_PREFIXES):
        raise EmitError(f"topic {topic}: reserved for the engine and humans; agents "
                        f"publish their own outcomes (build.done, review.done, ...)")
    size = len(json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise EmitError(f"{where}: {size} bytes; an event carries at most {max_bytes} "
                        f"(put the rest in a file of the workspace and name it)")
    if topic in ("blocker", "confidence"):  # topics the engine reads field by field
        from ..event_schemas import VALIDATORS
        problem = VALIDATORS[topic](payload)
        if problem:
            raise EmitError(f"{topic} {where}: {problem}")


def _check_topic(topic: str) -> None:
    if not isinstance(topic, str) or len(topic) > 200 or not TOPIC.fullmatch(topic):
        raise EmitError(f"topic {str(topic)[:80]!r}: expected dotted words like build.done "
                        f"(letters, digits, _ and -)")


def publish(work_dir: str, topic: str, payload, run: str | None = None) -> str:
    """Send an agent's event to the engine (the run's outbox, in `work_dir`), as the
    run of this environment's RALPH_RUN_ID; returns the request's id. RunOver when the
    engine will not take it as the run's (the run is over, no engine runs): the line is
    written all the same, and the engine records it as refused. `run`: the run, where it
    is not this process's environment's (an in-process agent's). Outside every run (a
    human at a terminal) the event goes to the bus itself, as the CLI's."""
    from ralph.session_store import RunOver, outbox
    run = run or run_id() or hidden_run()
    if run is None:
        return _publish_as_human(work_dir, topic, payload)
    rid = outbox.new_request_id()
    why = outbox.post(work_dir, {"kind": "event", "id": rid, "topic": topic,
                                 "payload": payload, "run": run})
    if why:
        raise RunOver(f"{topic} refused: {why}")
    return rid


def _publish_as_human(work_dir: str, topic: str, payload) -> str:
    """A human's event: written by this process to the bus in the control plane, which
    agents do not reach, because the outbox, which they write, can vouch for no human.
    Taken only while an engine runs the session, as an agent's."""
    from ralph.session_store import RunOver, load_work_area, outbox
    if not outbox.engine_alive(work_dir):
        raise RunOver(f"{topic} refused: no engine runs this session (it stopped or died)")
    return str(load_work_area(work_dir).append_event(topic, payload, source="cli")["seq"])


def hidden_run() -> str | None:
    """The run this process is part of though its environment no longer says so (a
    cleared environment, setsid, a double fork), else None. Only read where no
    RALPH_RUN_ID is set: never on an agent's usual path."""
    from ..running.containment import agent_run_of
    found = agent_run_of()
    return None if found is None else (found.run_id or "unknown")


def run_id() -> str | None:
    return os.environ.get("RALPH_RUN_ID") or None


def max_event_bytes(work_dir: str) -> int:
    """The cap the engine announced in the run's outbox's header, else the default."""
    from ralph.session_store import outbox
    run = run_id() or hidden_run()
    head = (outbox.header(work_dir, run) if run else None) or {}
    cap = head.get("max_event_bytes")
    return cap if type(cap) is int and cap > 0 else MAX_EVENT_BYTES


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
    """The session's work area: $RALPH_SESSION_DIR inside an agent; else the workspace's
    session named by --session, $RALPH_SESSION_ID or the only open one (slower path)."""
    found = None if session_id else os.environ.get("RALPH_SESSION_DIR")
    if found:
        if not os.path.isdir(found):
            raise EmitError(f"RALPH_SESSION_DIR {found}: no such session directory")
        return os.path.abspath(found)   # its parts name the workspace and the session
    from ralph.session_store import BadInput, load, resolve_id  # not on an agent's path
    workspace = os.environ.get("RALPH_WORKSPACE", os.getcwd())
    try:
        return load(workspace, resolve_id(workspace, session_id)).work_dir
    except BadInput as e:
        raise EmitError(str(e)) from None


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
    from ralph.session_store import BadInput, DiskFault
    try:
        check("human.progress", argv[0], "MESSAGE", max_event_bytes(directory))
        publish(directory, "human.progress", argv[0])
    except EmitError as e:
        report_refusal(directory, "tools interact progress", str(e))
        print(f"ralph: error: {e}", file=sys.stderr)
        return 2
    except (BadInput, DiskFault) as e:
        print(f"ralph: error: {e}", file=sys.stderr)
        return 2
    print("progress noted")
    return 0


def poll_when_empty(argv: list[str]) -> int | None:
    """`ralph tools signals poll [--role R] [--session ID] [--json]` when nothing waits in
    the mailbox, the usual case at an agent's step boundary: answered from a directory
    listing of the control plane (read-only: $RALPH_CONTROL_DIR, which the engine gives
    its runs). None when there is something to take (the engine does that, asked)."""
    from ralph.session_store import ROLES, signals
    try:
        argv, session_id = take_session(argv)
        own = os.environ.get("RALPH_ROLE") or ""
        as_json, role, it = False, own, iter(argv)
        for arg in it:
            if arg == "--json":
                as_json = True
            elif arg == "--role":
                role = next(it, "")
            else:
                return None   # anything else: the CLI says what is wrong
        if role.lower() != own.lower():
            return None   # the engine refuses a poll as another role
        control = os.environ.get("RALPH_CONTROL_DIR")
        if role.lower() not in ROLES or session_id or not control:
            return None
    except EmitError:
        return None
    if signals.waiting(control):
        return None
    print('{\n  "signals": [],\n  "engine_will_act_on": []\n}' if as_json
          else "signals: []\nengine_will_act_on: []")
    return 0


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        print(HELP)
        return 0
    try:
        argv, session_id = take_session(argv)
        directory = session_dir(session_id)
    except EmitError as e:
        print(f"ralph: error: {e}", file=sys.stderr)
        return 2
    from ralph.session_store import BadInput, DiskFault
    try:
        topic, payload = parse_args(argv)
        check(topic, payload, "--json", max_event_bytes(directory))
        publish(directory, topic, payload)
    except EmitError as e:
        report_refusal(directory, "emit " + " ".join(argv)[:200], str(e))
        print(f"ralph: error: {e}", file=sys.stderr)
        return 2
    except (BadInput, DiskFault) as e:   # a symlink, a run that is over, a full disk
        print(f"ralph: error: {e}", file=sys.stderr)
        return 2
    print(f"emitted {topic}")
    return 0


def report_refusal(work_dir: str, command: str, why: str, run: str | None = None) -> None:
    """What an agent tried and was refused is recorded (by the engine, as the run's): a
    line in the run's outbox, best effort. `run`: where the environment no longer says it."""
    from ralph.session_store import BadInput, DiskFault, outbox
    run = run or run_id() or hidden_run()
    if run is None:   # a human at a terminal: told on stderr, nothing to record
        return
    try:
        outbox.post(work_dir, {"kind": "refusal", "id": outbox.new_request_id(),
                               "run": run, "command": command, "why": why})
    except (BadInput, DiskFault, OSError):
        pass
