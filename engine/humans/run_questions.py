"""Questions an agent asks inside its own run (`ralph tools interact ask`, MCP `ask`).

The asker waits in its process; the question is the engine's: created from the run's
request (in the outbox), announced, answered on any channel, timed out at its deadline,
and the outcome written back to the asker's inbox. The agent never writes the question
or its answer: it could otherwise answer itself. When the run ends first, the question
stays answerable and its answer goes to the unit's next run (the desk does that).
"""
from __future__ import annotations

import math
import threading
from datetime import timedelta
from typing import Callable

from ralph.session_store import BadInput, questions

Q = questions.QuestionStatus
MAX_TEXT = 64 * 1024
MAX_OPTIONS = 50
MAX_SECONDS = 1e9   # as the config's durations: further off overflows datetime


def record_key(topic: str, qid: str) -> str:
    """The dedupe key (the store's `once`) of a question's record on the bus: one
    human.question, one human.response, one human.timeout per question, whoever records it
    (the desk, or this module for a run's question) and however many engines crash."""
    return f"{topic}:{qid}"


class RunQuestions:
    def __init__(self, session, clock, *, robot, announce: Callable, state: Callable,
                 reply: Callable[[str, dict], None], wakeup: threading.Event):
        self.session = session
        self.clock = clock
        self.robot = robot                  # RObot config: the default timeout
        self._announce = announce           # the desk's announce_question
        self._state = state
        self._reply = reply                 # (request id, reply): into the asker's inbox
        self._wakeup = wakeup
        self._waiting: dict[str, tuple[str, str]] = {}  # question id -> (request id, run)
        self._timers: dict[str, list[threading.Timer]] = {}   # run -> its deadlines

    def ask(self, request: dict, run, via: list) -> dict | None:
        """A run's question: asked now, or {"refused": why}."""
        problem = _problem(request)
        if problem:
            return {"refused": problem}
        timeout = request.get("timeout")
        timeout = float(timeout) if timeout is not None else self.robot.timeout_seconds
        now = self.clock.now()
        m = self.session.metadata
        question = self.session.questions.ask(questions.Question(
            id=questions.new_question_id(now), text=request["text"], asked_at=now,
            deadline=now + timedelta(seconds=timeout), on_timeout="continue", kind="in_run",
            options=list(request.get("options") or []), default=request.get("default"),
            context=questions.QuestionContext(session=self.session.id,
                                              state=self._state().value,
                                              iteration=m.iteration, role=run.role,
                                              task=run.task)))
        self.session.once(record_key("human.question", question.id), "human.question", {
            "id": question.id, "text": question.text, "in_run": True,
            "deadline": question.deadline.isoformat()}, source=run.role, run=run.id, via=via)
        self._waiting[question.id] = (request["id"], run.id)
        timer = threading.Timer(timeout, self._wakeup.set)   # its deadline wakes the engine
        timer.daemon = True
        timer.start()
        self._timers.setdefault(run.id, []).append(timer)
        self._announce(question)
        return None

    def gone(self, request_id: str) -> None:
        """The asker stopped waiting (its call was cancelled): the question stays
        answerable; its answer goes to the unit's next run."""
        for qid, (rid, _) in list(self._waiting.items()):
            if rid == request_id:
                del self._waiting[qid]
                try:
                    asked = self.session.questions
                    asked.mark_asker_gone(asked.load(qid))
                except BadInput:
                    pass

    def serve(self) -> None:
        """Answers and passed deadlines of the questions askers wait for, each written
        back to its asker (on every wakeup while an agent runs)."""
        asked = self.session.questions
        for qid, (rid, _) in list(self._waiting.items()):
            try:
                question = asked.load(qid)
                answer = asked.read_answer(qid)
            except BadInput:
                continue
            now = self.clock.now()
            # recorded and replied before the question is resolved (its commit point): a
            # crash in between leaves it pending, its asker gone with the engine, and the
            # next engine settles it for the unit's next run, recording nothing twice (desk)
            if answer is not None:
                self.session.once(record_key("human.response", qid), "human.response", {
                    "id": qid, "answer": answer.text, "channel": answer.channel,
                    "in_run": True})
                self._reply(rid, {"answered": True, "text": answer.text})
                asked.resolve(question, Q.ANSWERED, now)
            elif now >= question.deadline:   # a channel that could not deliver it moved it
                self.session.once(record_key("human.timeout", qid), "human.timeout", {
                    "id": qid, "in_run": True, "default": question.default,
                    **({"delivery_failed": True} if question.delivery_failed else {})})
                self._reply(rid, {"answered": False, "default": question.default})
                asked.resolve(question, Q.TIMED_OUT, now)
            else:
                continue
            del self._waiting[qid]

    def end_run(self, run_id: str) -> None:
        """The run is over: nobody of it waits any more (the desk releases its
        questions)."""
        for qid, (_, run) in list(self._waiting.items()):
            if run == run_id:
                del self._waiting[qid]
        for timer in self._timers.pop(run_id, []):
            timer.cancel()


def _problem(request: dict) -> str | None:
    """What is wrong with an ask request's fields, in one line, else None."""
    text, options, default = request.get("text"), request.get("options"), request.get("default")
    timeout = request.get("timeout")
    if not isinstance(request.get("id"), str):
        return "$.id: expected the request's id"
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT:
        return f"question: expected text of 1 to {MAX_TEXT} characters"
    if options is not None and (not isinstance(options, list) or len(options) > MAX_OPTIONS
                                or not all(isinstance(o, str) and len(o) <= 1000
                                           for o in options)):
        return f"options: expected at most {MAX_OPTIONS} strings"
    if default is not None and (not isinstance(default, str) or len(default) > MAX_TEXT):
        return "default: expected a string"
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or not 0 < timeout <= MAX_SECONDS):
        return f"timeout: expected a number of seconds above 0 and at most {MAX_SECONDS:g}"
    return None
