"""What the page may change, each through the store as the CLI does it: an answer
(`questions.answer`, first wins), a signal file (`signals.drop`), and a resume, which
starts `ralph session resume` as a process of its own: the web server never runs an
engine itself.

Synchronous (file writes, a process start): the routes run them in a worker thread.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone

from ralph.session_store import AlreadyAnswered, BadInput, ChannelFiles, Status, check_id

from ...views import answer_outcome, limit_still_reached
from .reads import Problem, open_session
from .security import TOKEN_ENV

SIGNAL_TYPES = ("steer", "info", "pause", "abort", "approve", "skip")
MAX_TEXT = 64 * 1024
RESUME_SETTLE = 5.0   # seconds to see the started engine take the session, or fail


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _text(value, what: str, required: bool) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise Problem(400, f"{what}: expected some text")
    if len(value) > MAX_TEXT:
        raise Problem(400, f"{what}: expected at most {MAX_TEXT} characters")
    return value


def _open(workspace: str, session_id: str):
    session = open_session(workspace, session_id)
    status = session.metadata.status
    if status in (Status.COMPLETED, Status.ABORTED):
        raise Problem(409, f"session {session.id} is {status.value}: it takes no more "
                           f"signals or answers")
    return session


def answer(workspace: str, session_id: str, question_id: str, body: dict) -> dict:
    session = open_session(workspace, session_id)
    try:
        check_id(question_id, "question id")
    except BadInput:
        raise Problem(404, f"no question {question_id[:80]!r}") from None
    if question_id not in session.questions.ids():
        raise Problem(404, f"session {session.id} has no question {question_id}")
    text = _text(body.get("text"), "$.text", required=True)
    try:
        session.questions.answer(question_id, text, now=_now(), channel="web")
    except AlreadyAnswered as e:
        earlier = session.questions.read_answer(question_id)
        if earlier is None:
            raise Problem(409, str(e)) from None
        raise Problem(409, f"question {question_id} is already answered",
                      answered_by=earlier.channel, answer=earlier.text) from None
    except BadInput as e:
        raise Problem(409, str(e)) from None
    question = session.questions.load(question_id)
    return {"answered": question_id, "outcome": answer_outcome(session, question)}


def signal(workspace: str, session_id: str, body: dict) -> dict:
    session = _open(workspace, session_id)
    kind = body.get("type")
    if kind not in SIGNAL_TYPES:
        raise Problem(400, f"$.type: expected one of {', '.join(SIGNAL_TYPES)}")
    message = _text(body.get("message"), "$.message", required=False) or f"{kind} from the web page"
    target = body.get("target") or "ALL"
    priority = body.get("priority") is True
    if kind == "pause" and session.metadata.status is Status.PAUSED:
        raise Problem(409, f"session {session.id} is paused already: resume it instead")
    iteration = session.metadata.iteration if kind in ("approve", "skip") else None
    try:
        name = session.signals.drop(kind.upper(), message, now=_now(), target=target,
                                    iteration=iteration, priority=priority)
    except BadInput as e:   # a target or a priority the mailbox does not take
        raise Problem(400, str(e)) from None
    return {"signal": name, "type": kind.upper()}


def _limit(body: dict, key: str, kind, most: float) -> str | None:
    value = body.get(key)
    if value in (None, ""):
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if kind is int and isinstance(value, float) and not value.is_integer():
        number = None
    if number is None or isinstance(value, bool) or not 0 < number <= most:
        raise Problem(400, f"$.{key}: expected a positive number of at most {most:g}")
    return str(number)


def resume(workspace: str, session_id: str, body: dict) -> dict:
    """Start `ralph session resume ID [--message M] [--max-...]` detached (its own process
    session, its output in the channel's log), and wait until it holds the session."""
    session = _open(workspace, session_id)
    pid = session.running_pid()
    if pid is not None:
        raise Problem(409, f"session {session.id} is running already (engine pid {pid})")
    argv = [sys.executable, "-P", "-m", "ralph.engine", "session", "resume", session.id,
            f"--workspace={session.workspace}"]
    message = _text(body.get("message"), "$.message", required=False)
    if message.strip():
        argv.append(f"--message={message}")
    raised = {}
    for key, flag, kind, most in (("max_iterations", "--max-iterations", int, 1e9),
                                  ("max_runtime", "--max-runtime", float, 1e9),
                                  ("max_cost", "--max-cost", float, 1e12)):
        value = _limit(body, key, kind, most)
        if value is not None:
            argv.append(f"{flag}={value}")
            raised[key] = kind(value)
    # paused by a limit that still holds, it would pause again at once: the page asks for
    # the new limit ($.max_iterations, $.max_runtime, $.max_cost) and nothing starts
    if held := limit_still_reached(session.metadata, **raised):
        key, why, least = held
        raise Problem(400, f"$.{key}: session {session.id} paused at its limit and would "
                           f"pause again at once ({why}): give a new "
                           f"{key.replace('_', ' ')} ({least}) to resume it")
    fd, log = ChannelFiles(session.workspace, "web").open_log(session.id)
    try:
        os.write(fd, f"--- {_now().isoformat()} ralph web: resume {session.id}\n".encode())
        child = subprocess.Popen(argv, cwd=session.workspace, stdin=subprocess.DEVNULL,
                                 stdout=fd, stderr=fd, start_new_session=True,
                                 env={k: v for k, v in os.environ.items() if k != TOKEN_ENV})
    finally:
        os.close(fd)
    deadline = time.monotonic() + RESUME_SETTLE
    while child.poll() is None and session.running_pid() != child.pid \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    code = child.poll()
    if code in (1, 2):
        raise Problem(409, f"the resume failed: {_last_line(log)}", log=log)
    _reap_later(child)
    return {"pid": child.pid, "log": log, "exit_code": code}


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = f.read().decode("utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(its log cannot be read)"
    return lines[-1] if lines else "(no output)"


def _reap_later(child: subprocess.Popen) -> None:
    import threading
    threading.Thread(target=child.wait, name=f"reap-{child.pid}", daemon=True).start()
