"""Humans in the loop (seed 000, DESIGN §7): the loop-level block of `human.interact`.

An agent's `human.interact` makes the engine ask after that run; no agent runs and no
transition happens until the question is answered or its deadline passes. The answer
reaches the next prompt as `human.response`; a timeout applies `RObot.on_timeout`.
Every step is keyed by the question id, so a crash never applies an answer twice, and
a deadline that passed while the engine was down is applied once, on resume.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Callable

from session_store import BadInput, PauseKind, questions
from states import Next, Trigger

from ..mailbox import Mode

Q = questions.QuestionStatus
AnswerObserver = Callable[[questions.Question, "str | None"], "Next | None"]


class HumanDesk:
    def __init__(self, session, clock, tracker, mailbox, robot, *, wait, say, state):
        self.session = session
        self.clock = clock
        self.tracker = tracker
        self.mailbox = mailbox
        self.robot = robot               # RObot config: timeout_seconds, on_timeout
        self._wait = wait                # wait(deadline): sleep until it or a wakeup
        self._say = say
        self._state = state              # the machine's current state
        self.on_answer: list[AnswerObserver] = []   # the runner's cooldown, the assessor
        # qid -> settled | timed_out: what deliver_late_answers need not read again
        self._question_states: dict[str, str] = {}

    @property
    def _dir(self) -> str:
        return self.session.dir

    def ask(self, text: str, *, options=(), default: str | None = None, kind: str = "loop",
            role: str | None = None, task_id: str | None = None,
            fallback_type: str | None = None, on_timeout: str | None = None) -> questions.Question:
        """Ask on behalf of the loop: the question file is the commit point, then the
        session records it as pending; the hold that follows waits for it."""
        now = self.clock.now()
        m = self.tracker.metadata
        question = questions.ask(self._dir, questions.Question(
            id=questions.new_question_id(now), text=text, asked_at=now,
            deadline=now + timedelta(seconds=self.robot.timeout_seconds),
            on_timeout=on_timeout or self.robot.on_timeout.value, options=list(options),
            default=default, kind=kind, fallback_type=fallback_type,
            context=questions.QuestionContext(session=self.session.id, state=self._state().value,
                                              iteration=m.iteration, role=role, task=task_id)))
        m.pending_question = question.id
        self.tracker.save()
        self._record_question(question)
        self._say(f"question {question.id} for a human: {question.text.splitlines()[0]}  "
                  f"(answer: ralph session answer {self.session.id} \"...\")")
        return question

    def ask_from_event(self, event: dict, role: str, task) -> questions.Question:
        """An agent's `human.interact`: its payload is the text, or {text, options, default}."""
        payload = event.get("payload")
        text, options, default = payload, [], None
        if isinstance(payload, dict):
            text = payload.get("text") or payload.get("question") or str(payload)
            options = [str(o) for o in payload.get("options") or []]
            default = payload.get("default")
        return self.ask(str(text or "(no question text)"), options=options,
                        default=None if default is None else str(default), role=role,
                        task_id=task.id if task else None)

    def _record_question(self, question: questions.Question) -> None:
        self.session.append_event("human.question", {
            "id": question.id, "text": question.text, "kind": question.kind,
            "deadline": question.deadline.isoformat()})

    # --- the hold ---

    def hold(self) -> Next | None:
        """Block while the loop's question is pending; apply its answer or its timeout.
        PAUSE / ABORT still work while it waits: their Next comes back."""
        self.deliver_late_answers()
        qid = self.tracker.metadata.pending_question
        if not qid:
            return None
        question = questions.load_question(self._dir, qid)
        while True:
            answer = questions.read_answer(self._dir, qid)
            if question.status is Q.ANSWERED or answer is not None:
                return self._apply_answer(question, answer)
            if question.status is Q.TIMED_OUT or self.clock.now() >= question.deadline:
                return self._apply_timeout(question)
            stop = self.mailbox.poll(Mode.CHECKPOINT)
            if stop is not None:
                return stop
            self._wait(question.deadline)
            # read again: a channel that cannot deliver it moves its deadline to now
            question = questions.load_question(self._dir, qid)

    def _apply_answer(self, question: questions.Question, answer) -> Next | None:
        if answer is not None:
            self.mailbox.queue_event(f"human.response-{question.id}", "human.response",
                                     {"question": question.text, "answer": answer.text,
                                      "id": question.id})
        response = {"id": question.id, "answer": answer.text if answer else None,
                    "channel": answer.channel if answer else None}
        if question.status is not Q.ANSWERED:
            questions.resolve(self._dir, question, Q.ANSWERED, self.clock.now())
            self.session.append_event("human.response", response)
        elif not self._on_bus("human.response", question.id):
            # resolved, then a crash before its record: the record is written now, once
            self.session.append_event("human.response", response)
        self.tracker.metadata.pending_question = None
        self.tracker.save()
        text = answer.text if answer else None
        for observer in self.on_answer:
            decision = observer(question, text)
            if decision is not None:
                return decision
        return None

    def _apply_timeout(self, question: questions.Question) -> Next | None:
        """The policy of an unanswered question: continue (the next prompt is told), pause
        (the question stays answerable; resume goes on with its answer), abort."""
        policy = question.on_timeout
        timeout = {"id": question.id, "policy": policy,
                   **({"delivery_failed": True} if question.delivery_failed else {})}
        if policy == "pause" and not question.timeout_paused:
            # the session pauses, once: the question is marked `timeout_paused` when it is
            # resumed from that pause (note_resumed), so a crash before the pause is durable
            # pauses again rather than going on as if it had paused
            if not self._on_bus("human.timeout", question.id):
                self.session.append_event("human.timeout", timeout)
            return Next(Trigger.PAUSE, f"question {question.id} unanswered by its deadline: "
                                       f"{question.text}", PauseKind.QUESTION)
        if question.status is not Q.TIMED_OUT:
            questions.resolve(self._dir, question, Q.TIMED_OUT, self.clock.now())
            if policy != "pause":
                self.session.append_event("human.timeout", timeout)
        elif policy != "pause" and not self._on_bus("human.timeout", question.id):
            # resolved, then a crash before its record: the record is written now, once
            self.session.append_event("human.timeout", timeout)
        self.mailbox.queue_event(f"human.timeout-{question.id}", "human.timeout",
                                 {"id": question.id, "question": question.text,
                                  "policy": policy, "default": question.default})
        self.tracker.metadata.pending_question = None
        self.tracker.save()
        if policy == "abort":
            return Next(Trigger.ABORT, f"question {question.id} unanswered by its deadline")
        return None

    def note_resumed(self) -> None:
        """A session paused by its question's timeout (on_timeout: pause) is being resumed:
        that pause happened, so the question's timeout now goes on without pausing again
        (an answer is still welcome). Idempotent: a crash before the resume is durable
        repeats it."""
        m = self.tracker.metadata
        if m.orchestrator.pause_kind is not PauseKind.QUESTION or not m.pending_question:
            return
        question = questions.load_question(self._dir, m.pending_question)
        if not question.timeout_paused:
            question.timeout_paused = True
            questions.save_question(self._dir, question)

    def _on_bus(self, topic: str, qid: str) -> bool:
        """Whether the engine recorded `topic` for question `qid` (asked only on the paths
        a crash leads to; read from the end of the bus back)."""
        return self.session.last_event(
            lambda r: r["topic"] == topic and r.get("source") == "engine"
            and isinstance(r["payload"], dict) and r["payload"].get("id") == qid) is not None

    # --- late answers and recovery ---

    def deliver_late_answers(self) -> None:
        """An answer that came after its question timed out is kept and reaches the next
        prompt as guidance, once.

        Called before every agent run and transition, so it reads only what can still
        change: a settled question is never read again, and one that timed out is read
        again only once an answer file exists for it; reading every question file each
        time made a long session's every step slower with each question asked."""
        known = self._question_states
        late = []
        for qid in questions.ids(self._dir):
            if known.get(qid) == "settled":
                continue
            if known.get(qid) == "timed_out" and not questions.has_answer(self._dir, qid):
                continue
            try:
                question = questions.load_question(self._dir, qid)
            except BadInput:
                continue
            if question.status in (Q.ANSWERED, Q.CANCELLED) or question.late_answer_delivered:
                known[qid] = "settled"
            elif question.status is Q.TIMED_OUT:
                known[qid] = "timed_out"
                late.append(question)
        for question in sorted(late, key=lambda q: q.asked_at):
            answer = questions.read_answer(self._dir, question.id)
            if answer is None:
                continue
            self.mailbox.queue_note(f"late-{question.id}",
                                    f"Late answer to \"{question.text}\": {answer.text}")
            self.session.append_scratchpad(
                (f"- {answer.answered_at.isoformat(timespec='seconds')} late answer to "
                 f"{question.id}: {answer.text}", f"late answer to {question.id}"))
            question.late_answer_delivered = True
            questions.save_question(self._dir, question)
            known[question.id] = "settled"

    def recover(self) -> None:
        """After a crash: a loop question written just before the engine died is adopted
        (the question file is the commit point of asking); an in-run `ask` whose agent
        died with the engine waits for nobody and is cancelled (the re-run asks again)."""
        m = self.tracker.metadata
        for question in questions.questions(self._dir):
            if question.status is not Q.PENDING:
                continue
            if question.kind == "in_run":
                questions.resolve(self._dir, question, Q.CANCELLED, self.clock.now())
            elif m.pending_question is None:
                m.pending_question = question.id
                self.tracker.save()
        # the question file is the commit point of asking, its bus record comes after: a
        # crash in between left the question without its record (which `tail`, the status
        # view and the bus's readers go by), so it is written now, once
        if m.pending_question and not self._on_bus("human.question", m.pending_question):
            self._record_question(questions.load_question(self._dir, m.pending_question))
