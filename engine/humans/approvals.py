"""Tool calls a human approves first (`agent.approve`), the engine's side.

An agent CLI's hook (`ralph tools approve`) hands the engine each tool call it is about to
make; the engine matches it against the rules of the config the session started with.
No rule: `pass`, the CLI's own permissions decide. A rule: a durable question of kind
`approval` (allow / deny / anything else denies, with those words as the reason the agent
is shown), answered on any channel; its deadline applies the rule's default (deny unless
said). Every decision goes on the bus (`approval.asked`, `approval.decided`), through the
store's `once`, keyed by the question.

A question outlives its asker: when the engine dies (or the run is stopped) while a hook
waits, the question stays answerable until its deadline, and the same call by the same
unit of work (its next run, after a resume) waits on that question, or takes the answer
given meanwhile, instead of asking again. An answer nobody waits for is never passed to
an agent as guidance: it was about one call.
"""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import Callable

from session_store import BadInput, questions

from ..tools.approve import Rule, tool_call
from .run_questions import record_key

Q = questions.QuestionStatus
OPTIONS = ["allow", "deny"]
ALLOW_WORDS = {"allow", "allowed", "approve", "approved", "yes", "y", "ok"}
SHOWN = 2000        # characters of a call a question and its records show
MAX_TOOL = 200


def decision_of(text: str) -> tuple[bool, str | None]:
    """An answer as a decision: (allowed, the reason for the agent). `allow` (yes, ok)
    allows; `deny` (no) denies; anything else denies with those words ("deny: not on
    main" keeps "not on main")."""
    said = " ".join(text.split())
    folded = said.casefold()
    if folded in ALLOW_WORDS:
        return True, None
    if folded in ("deny", "denied", "no", "n"):
        return False, None
    for word in ("deny", "no"):
        if folded.startswith(word) and not folded[len(word):len(word) + 1].isalnum():
            said = said[len(word):].lstrip(" :,;-–—")
            break
    return False, said or None


class Approvals:
    def __init__(self, session, clock, *, rules, robot, announce: Callable, state: Callable,
                 reply: Callable[[str, dict], None], wakeup: threading.Event):
        self.session = session
        self.clock = clock
        self.rules = [(Rule(r.rule), r) for r in rules]
        self.robot = robot                  # RObot: the default timeout
        self._announce = announce           # the desk's announce_question
        self._state = state
        self._reply = reply                 # (request id, reply): into the hook's inbox
        self._wakeup = wakeup
        self._waiting: dict[str, list[tuple[str, str]]] = {}  # question -> [(request, run)]
        self._open: set[str] = set()        # approval questions still pending
        self._timers: list[threading.Timer] = []

    def recover(self) -> None:
        """Open approvals of an engine before (its hooks died with it), answered meanwhile
        or not: served, and timed out at their deadlines."""
        for question in self.session.questions.all():
            if question.kind == "approval" and question.status is Q.PENDING:
                self._open.add(question.id)
                self._wake_at(question.deadline)
                # the question is the commit point of asking, its record comes after: an
                # engine killed in between left it without one, written now, once
                self.session.once(record_key("approval.asked", question.id),
                                  "approval.asked", {
                                      "id": question.id, "text": question.text,
                                      "default": question.default,
                                      "deadline": question.deadline.isoformat()},
                                  source=question.context.role or "engine")

    def request(self, request: dict, run, via: list) -> dict | None:
        """A hook's request: replied now (`pass`, or an answer given while nobody waited),
        or asked; {"refused": why} for a request that is not a tool call."""
        name, tool_input = request.get("tool"), request.get("input")
        if not isinstance(request.get("id"), str):
            return {"refused": "$.id: expected the request's id"}
        if not isinstance(name, str) or not 0 < len(name) <= MAX_TOOL:
            return {"refused": f"tool: expected a tool's name of 1 to {MAX_TOOL} characters"}
        tool, call = tool_call(str(request.get("cli")), name, tool_input)
        found = next((spec for rule, spec in self.rules if rule.matches(tool, call)), None)
        rid = str(request["id"])
        if found is None:
            self._reply(rid, {"decision": "pass"})
            return None
        text = (f"Approve this tool call? {tool}: {call[:SHOWN]}"
                + (f" [{len(call)} characters, cut]" if len(call) > SHOWN else "")
                + f"\n(rule {found.rule}; answer allow, deny, or your reason to deny it, "
                  f"which the agent is shown)")
        question = self._open_same(text, run)
        if question is None:
            decided = self._decided_same(text, run)
            if decided is not None:
                return self._reuse(decided, rid, run)
            question = self._ask(text, tool, call, found, run, via)
        self._waiting.setdefault(question.id, []).append((rid, run.id))
        self.serve()
        return None

    def _same(self, question: questions.Question, text: str, run) -> bool:
        c = question.context
        return question.kind == "approval" and question.text == text and \
            (c.iteration, c.role, c.task) == (self.session.metadata.iteration, run.role,
                                               run.task)

    def _open_same(self, text: str, run) -> questions.Question | None:
        """The same call's open question by the same unit of work (its hook died with an
        engine, or its run was stopped): this call waits on it."""
        for qid in sorted(self._open):
            try:
                question = self.session.questions.load(qid)
            except BadInput:
                continue
            if self._same(question, text, run):
                return question
        return None

    def _decided_same(self, text: str, run) -> questions.Question | None:
        """The same call's question by the same unit, answered while nobody waited and
        not used since: its answer decides this call, once."""
        return next((q for q in self.session.questions.all()
                     if self._same(q, text, run) and q.status is Q.ANSWERED
                     and not q.late_answer_delivered), None)

    def _reuse(self, question: questions.Question, rid: str, run) -> None:
        answer = self.session.questions.read_answer(question.id)
        allowed, reason = _decision(question, answer)
        self.session.once(record_key("approval.reused", question.id), "approval.reused", {
            "id": question.id, "decision": "allow" if allowed else "deny"},
            source=run.role, run=run.id)
        self._reply(rid, _reply(allowed, reason))
        question.late_answer_delivered = True   # its answer decided a later call: once
        self.session.questions.save(question)
        return None

    def _ask(self, text, tool, call, rule, run, via) -> questions.Question:
        timeout = rule.timeout_seconds or self.robot.timeout_seconds
        now = self.clock.now()
        question = self.session.questions.ask(questions.Question(
            id=questions.new_question_id(now), text=text, asked_at=now,
            deadline=now + timedelta(seconds=timeout), on_timeout="continue",
            kind="approval", options=list(OPTIONS), default=rule.default.value,
            context=questions.QuestionContext(
                session=self.session.id, state=self._state().value,
                iteration=self.session.metadata.iteration, role=run.role, task=run.task)))
        self.session.once(record_key("approval.asked", question.id), "approval.asked", {
            "id": question.id, "tool": tool, "call": call[:SHOWN], "rule": rule.rule,
            "default": rule.default.value, "deadline": question.deadline.isoformat()},
            source=run.role, run=run.id, via=via)
        self._open.add(question.id)
        self._wake_at(question.deadline)
        self._announce(question)
        return question

    def _wake_at(self, deadline) -> None:
        seconds = max(0.0, (deadline - self.clock.now()).total_seconds())
        timer = threading.Timer(seconds, self._wakeup.set)
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def serve(self) -> None:
        """Answers and passed deadlines of open approvals: recorded, replied to whoever
        waits, resolved (on every wakeup while an agent runs)."""
        asked = self.session.questions
        for qid in sorted(self._open):
            try:
                question = asked.load(qid)
                answer = asked.read_answer(qid)
            except BadInput:
                self._open.discard(qid)
                continue
            now = self.clock.now()
            if answer is None and question.status is Q.PENDING and now < question.deadline:
                continue
            allowed, reason = _decision(question, answer)
            by = {"by": "human", "channel": answer.channel} if answer else {"by": "timeout"}
            waiters = self._waiting.pop(qid, [])
            # recorded and replied before it is resolved (its commit point): a crash in
            # between leaves it open, and the next engine records nothing twice
            self.session.once(record_key("approval.decided", qid), "approval.decided", {
                "id": qid, "decision": "allow" if allowed else "deny", **by,
                **({"reason": reason} if reason else {}),
                **({} if waiters else {"asker_gone": True})})
            for rid, _ in waiters:
                self._reply(rid, _reply(allowed, reason))
            if waiters and answer is not None:
                question.late_answer_delivered = True   # used: no later call takes it
            if question.status is Q.PENDING:
                asked.resolve(question, Q.ANSWERED if answer else Q.TIMED_OUT, now)
            self._open.discard(qid)

    def end_run(self, run_id: str) -> None:
        """The run is over: its hooks wait no more (their questions stay open)."""
        for qid, waiters in list(self._waiting.items()):
            kept = [w for w in waiters if w[1] != run_id]
            if kept:
                self._waiting[qid] = kept
            else:
                del self._waiting[qid]

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()


def _decision(question: questions.Question, answer) -> tuple[bool, str | None]:
    """(allowed, the reason the agent is shown) of an answer, or of the rule's default."""
    if answer is None:
        allowed = question.default == "allow"
        return allowed, None if allowed else \
            "Denied: nobody answered within the rule's time, and its default is deny"
    allowed, words = decision_of(answer.text)
    return allowed, None if allowed else \
        f"Denied by a human ({answer.channel})" + (f": {words}" if words else "")


def _reply(allowed: bool, reason: str | None) -> dict:
    return {"decision": "allow" if allowed else "deny", **({"reason": reason} if reason else {})}
