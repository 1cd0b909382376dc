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

from ralph.session_store import BadInput, questions

from ..config import ApprovalDefault
from ..tools.approve import MAX_CALL, MAX_TOOL, Rule, decision_of
from .run_questions import record_key

Q = questions.QuestionStatus
OPTIONS = ["allow", "deny"]
SHOWN = 2000        # characters of a call a question and its records show
OWN_TOOLS = "mcp__ralph__"   # ralph's own MCP tools (emit, ask, ...): never asked about


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
        self._timers: dict[str, threading.Timer] = {}   # question -> its deadline's wakeup

    def recover(self) -> None:
        """Open approvals of an engine before (its hooks died with it), answered meanwhile
        or not: served, and timed out at their deadlines."""
        for question in self.session.questions.all():
            if question.kind == "approval" and question.status is Q.PENDING:
                self._open.add(question.id)
                self._wake_at(question)
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
        tool, call, cut = request.get("tool"), request.get("call"), request.get("cut")
        if not isinstance(request.get("id"), str):
            return {"refused": "$.id: expected the request's id"}
        if not isinstance(tool, str) or not 0 < len(tool) <= MAX_TOOL:
            return {"refused": f"tool: expected a tool's name of 1 to {MAX_TOOL} characters"}
        if not isinstance(call, str) or len(call) > MAX_CALL or not isinstance(cut, bool):
            return {"refused": f"call: expected the call's text, at most {MAX_CALL} "
                               f"characters, and whether it was cut"}
        found = [spec for rule, spec in self.rules if rule.matches(tool, call, cut)]
        # the strictest rule that names it decides: one whose default denies, if any (a
        # rule added above another cannot loosen it)
        found = next((s for s in found if s.default is not ApprovalDefault.ALLOW),
                     found[0] if found else None)
        rid = str(request["id"])
        if found is None or tool.startswith(OWN_TOOLS):
            self._reply(rid, {"decision": "pass"})
            return None
        text = (f"Approve this tool call? {tool}: {call[:SHOWN]}"
                + (" [cut]" if cut or len(call) > SHOWN else "")
                + f"\n(rule {found.rule}; answer allow, deny, or your reason to deny it, "
                  f"which the agent is shown)")
        question = self._open_same(text, run)
        if question is None:
            decided = self._decided_same(text, run)
            if decided is not None:
                self._reuse(decided, rid, run)
                return None
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
        question.late_answer_delivered = True   # its answer decides this call, and no other
        self.session.questions.save(question)
        self.session.once(record_key("approval.reused", question.id), "approval.reused", {
            "id": question.id, "decision": "allow" if allowed else "deny"},
            source=run.role, run=run.id)
        self._reply(rid, _reply(allowed, reason))

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
        self._wake_at(question)
        self._announce(question)
        return question

    def _wake_at(self, question: questions.Question) -> None:
        seconds = max(0.0, (question.deadline - self.clock.now()).total_seconds())
        timer = threading.Timer(seconds, self._wakeup.set)
        timer.daemon = True
        timer.start()
        self._timers[question.id] = timer

    def _close(self, qid: str) -> None:
        self._open.discard(qid)
        timer = self._timers.pop(qid, None)
        if timer is not None:
            timer.cancel()

    def serve(self) -> None:
        """Answers and passed deadlines of open approvals: recorded, replied to whoever
        waits, resolved (on every wakeup while an agent runs)."""
        asked = self.session.questions
        for qid in sorted(self._open):
            try:
                question = asked.load(qid)
                answer = asked.read_answer(qid)
            except BadInput:
                self._close(qid)
                continue
            now = self.clock.now()
            if answer is None and question.status is Q.PENDING and now < question.deadline:
                continue
            allowed, reason = _decision(question, answer)
            by = {"by": "human", "channel": answer.channel} if answer else {"by": "timeout"}
            waiters = self._waiting.pop(qid, [])
            # recorded, then resolved (its commit point: a crash before it leaves it open,
            # and the next engine records nothing twice), then replied: a crash before the
            # reply loses it with the run, and the call, made again, is asked again
            self.session.once(record_key("approval.decided", qid), "approval.decided", {
                "id": qid, "decision": "allow" if allowed else "deny", **by,
                **({"reason": reason} if reason else {}),
                **({} if waiters else {"asker_gone": True})})
            if waiters and answer is not None:
                question.late_answer_delivered = True   # used: no later call takes it
            if question.status is Q.PENDING:
                asked.resolve(question, Q.ANSWERED if answer else Q.TIMED_OUT, now)
            elif question.late_answer_delivered:
                asked.save(question)
            for rid, _ in waiters:
                self._reply(rid, _reply(allowed, reason))
            self._close(qid)

    def cancel_open(self) -> None:
        """The session is over: no call waits for its open approvals any more (each is
        recorded as denied by the session's end, and takes no answer)."""
        for qid in sorted(self._open):
            try:
                question = self.session.questions.load(qid)
            except BadInput:
                self._close(qid)
                continue
            self.session.once(record_key("approval.decided", qid), "approval.decided", {
                "id": qid, "decision": "deny", "by": "session_end"})
            if question.status is Q.PENDING:
                self.session.questions.resolve(question, Q.CANCELLED, self.clock.now())
            self._close(qid)

    def end_run(self, run_id: str) -> None:
        """The run is over: its hooks wait no more (their questions stay open)."""
        for qid, waiters in list(self._waiting.items()):
            kept = [w for w in waiters if w[1] != run_id]
            if kept:
                self._waiting[qid] = kept
            else:
                del self._waiting[qid]


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
