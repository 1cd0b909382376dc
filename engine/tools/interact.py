"""`ralph tools interact ask`: a blocking question inside the agent's own run (seed 003).

The agent's process waits (its context is kept) until a channel writes the answer or the
timeout passes; its timeout is the agent's to handle (exit 3 and the default), not the
engine's policy. The wait wakes on the answer file landing (inotify through watchdog).
"""
from __future__ import annotations

import os
import signal
import threading
from datetime import timedelta

from session_store import BadInput, RunOver, load, questions, resolve_id, run_over, shown

from .. import config as cfg
from ..clock import CHECK_SECONDS, SystemClock
from ..mailbox import watch


# The longest an agent may wait for an answer inside its run. The run holds its process
# and its model's context meanwhile, and the engine stops it long before (agent.timeout_
# seconds, 30 minutes by default): a day is already no wait a run can have, and beyond
# it a number is a mistake or an attack (1e300 overflows the deadline's date; NaN passed
# `timeout <= 0` and crashed it). The human's own RObot.timeout_seconds is the config's.
MAX_ASK_SECONDS = 86400


def ask_seconds(value) -> float:
    """The timeout an agent gave `ask` (`--timeout`, MCP `timeout_seconds`), as seconds:
    ValueError saying what was expected for anything but a finite number in
    (0, MAX_ASK_SECONDS]."""
    try:
        seconds = float(value) if isinstance(value, (str, int, float)) else None
    except (ValueError, OverflowError):   # "soon", 10**400
        seconds = None
    if type(value) is bool or seconds is None or not 0 < seconds <= MAX_ASK_SECONDS:
        raise ValueError(f"expected a number of seconds above 0 and at most "
                         f"{MAX_ASK_SECONDS} (a day), got {shown(value)}")
    return seconds   # NaN fails `0 < seconds`, infinity the upper bound


class Waiting:
    """A wait for an answer that another thread may end (the MCP server's: its call was
    cancelled, or the server is stopping)."""

    def __init__(self):
        self.woken = threading.Event()
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.woken.set()


def ask_and_wait(text: str, *, timeout: float | str | None, default: str | None,
                 options: list[str], session_id: str | None, workspace: str,
                 clock=None, waiting: Waiting | None = None,
                 timeout_name: str = "timeout") -> tuple[str | None, bool]:
    """(the answer, True) or (the default, False) on timeout (None: the config's
    RObot.timeout_seconds; else checked by ask_seconds, BadInput naming `timeout_name`).
    Without `waiting`, SIGTERM (the run being stopped) ends the wait."""
    if timeout is not None:
        try:
            timeout = ask_seconds(timeout)
        except ValueError as e:
            raise BadInput(f"{timeout_name}: {e}") from None
    clock = clock or SystemClock()
    session = load(workspace, resolve_id(workspace, session_id))
    if timeout is None:
        timeout = cfg.load_session_config(session).RObot.timeout_seconds
    run = os.environ.get("RALPH_RUN_ID") or None
    if run and (why := run_over(session.dir, run)):
        raise RunOver(f"ask refused: {why}")   # nobody would hear the answer
    now = clock.now()
    iteration = os.environ.get("RALPH_ITERATION", "")
    question = questions.ask(session.dir, questions.Question(
        id=questions.new_question_id(now), text=text, asked_at=now,
        deadline=now + timedelta(seconds=timeout), on_timeout="continue", kind="in_run",
        options=options, default=default,
        context=questions.QuestionContext(
            session=session.id, state=os.environ.get("RALPH_STATE")
            or session.metadata.orchestrator.state.value,
            iteration=int(iteration) if iteration.isdigit() else session.metadata.iteration,
            role=os.environ.get("RALPH_ROLE"), task=os.environ.get("RALPH_TASK_ID"))))
    try:
        session.append_event("human.question", {"id": question.id, "text": text,
                                                "in_run": True,
                                                "deadline": question.deadline.isoformat()},
                             source=os.environ.get("RALPH_ROLE") or "cli", run=run)
    except RunOver:   # the run ended meanwhile: nobody would hear the answer
        questions.resolve(session.dir, question, questions.QuestionStatus.CANCELLED,
                          clock.now())
        raise
    on_term = waiting is None
    waiting = waiting or Waiting()
    woken = waiting.woken

    watched = [os.path.join(session.dir, "answers"), os.path.join(session.dir, "questions")]

    def changed(path: str) -> None:
        # only this question's files wake the agent: waking on every file of a write
        # (temp file, data, link) fought the watcher's threads for the interpreter; a
        # watched directory itself is the poll's tick where no watcher works
        if path in watched or questions.question_id(os.path.basename(path)) == question.id:
            woken.set()
    stop_watching = watch(watched, None, notify=changed)
    previous = signal.signal(signal.SIGTERM, _stop_waiting_on_term) if on_term else None
    try:
        while True:
            if waiting.cancelled:
                raise KeyboardInterrupt
            answer = questions.read_answer(session.dir, question.id)
            if answer is not None:
                questions.resolve(session.dir, question, questions.QuestionStatus.ANSWERED,
                                  clock.now())
                return answer.text, True
            # read again (after the answer, which is what the agent waits for): a channel
            # that cannot deliver it moves its deadline to now
            question = questions.load_question(session.dir, question.id)
            left = (question.deadline - clock.now()).total_seconds()
            if left <= 0:
                questions.resolve(session.dir, question, questions.QuestionStatus.TIMED_OUT,
                                  clock.now())
                session.append_event("human.timeout", {"id": question.id, "in_run": True,
                                                       "default": default},
                                     source=os.environ.get("RALPH_ROLE") or "cli", run=run)
                return default, False
            woken.wait(min(left, CHECK_SECONDS))   # a stepped clock is read again
            woken.clear()
    except KeyboardInterrupt:
        # the run is being stopped (PAUSE, ABORT, timeout) or the human gave up waiting:
        # the question stays answerable, and its answer goes to the next run of this unit
        questions.mark_asker_gone(session.dir, question)
        raise
    finally:
        if on_term:
            signal.signal(signal.SIGTERM, previous)
        # stopping the watcher joins watchdog's threads (up to ~20 ms): not on the way
        # from the answer to the agent
        threading.Thread(target=stop_watching, name="stop-watching", daemon=True).start()


def _stop_waiting_on_term(_signum, _frame):
    raise KeyboardInterrupt  # the agent is being stopped: it stops waiting
