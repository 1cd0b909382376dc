"""Humans in the loop (seed 000, DESIGN §7): the loop-level block of `human.interact`.

An agent's `human.interact` makes the engine ask after that run; no agent runs and no
transition happens until the question is answered or its deadline passes. The answer
reaches the next prompt as `human.response`; a timeout applies `RObot.on_timeout`.
Every step is keyed by the question id, so a crash never applies an answer twice, and
a deadline that passed while the engine was down is applied once, on resume: each
question's records (human.question, human.response, human.timeout) go on the bus through
the store's `once`, keyed "<topic>:<question id>" (`record_key`).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Callable

from ralph.session_store import BadInput, PauseKind, progress, questions
from ralph.states import Next, Trigger

from ..mailbox import Mode
from ..safe_text import author, payload_text, printable
from .run_questions import record_key

Q = questions.QuestionStatus
PROGRESS_SHOWN = 2000   # characters of a progress note the console shows
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
        # (phase, question) before ("pre") and after ("post") a question is announced:
        # the lifecycle hooks
        self.on_question: list[Callable[[str, questions.Question], None]] = []
        # qid -> settled | timed_out: what deliver_answers need not read again
        self._question_states: dict[str, str] = {}
        self._announced: set[str] = set()
        self._feed = session.reader()   # the bus, for what agents tell humans

    def ask(self, text: str, *, options=(), default: str | None = None, kind: str = "loop",
            role: str | None = None, task_id: str | None = None,
            fallback_type: str | None = None, on_timeout: str | None = None) -> questions.Question:
        """Ask on behalf of the loop: the question file is the commit point, then the
        session records it as pending; the hold that follows waits for it."""
        now = self.clock.now()
        m = self.tracker.metadata
        question = self.session.questions.ask(questions.Question(
            id=questions.new_question_id(now), text=text, asked_at=now,
            deadline=now + timedelta(seconds=self.robot.timeout_seconds),
            on_timeout=on_timeout or self.robot.on_timeout.value, options=list(options),
            default=default, kind=kind, fallback_type=fallback_type,
            context=questions.QuestionContext(session=self.session.id, state=self._state().value,
                                              iteration=m.iteration, role=role, task=task_id)))
        self.tracker.set_pending_question(question.id)
        self._record_question(question)
        self.announce_question(question)
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

    def announce_question(self, question: questions.Question) -> None:
        """Once per engine: the whole question, its options, deadline and how to answer.
        An agent's words are quoted ("> "), each option kept to one line, under a header
        that says whose question it is; the lines after it are ralph's."""
        if question.id in self._announced:
            return
        self._announced.add(question.id)
        for observe in self.on_question:
            observe("pre", question)
        c = question.context
        who = f"the {c.role}" + (f" ({c.task})" if c.task else "") if c.role else "ralph"
        lines = [f"question {question.id} from {printable(who)}"
                 + ("; its agent waits for the answer:" if question.kind == "in_run" else
                    "; its tool call waits for approval:" if question.kind == "approval" else
                    "; the session waits for the answer:"),
                 *[f"  > {line}" for line in question.text.splitlines()]]
        if question.options:
            lines.append("  options: " + "  ".join(f"{i}. {printable(o)}"
                                                  for i, o in enumerate(question.options, 1)))
        if question.kind == "approval":
            then = f"the call is {'allowed' if question.default == 'allow' else 'denied'}"
        elif question.kind == "in_run":
            then = f"the agent gets the default: {printable(question.default)}" \
                if question.default else "the agent goes on without an answer"
        else:
            then = {"continue": "the session goes on without an answer",
                    "pause": "the session pauses", "abort": "the session is aborted"}.get(
                question.on_timeout, question.on_timeout)
        deadline = question.deadline.astimezone().isoformat(timespec="seconds")
        lines.append(f"  deadline {deadline}; then {then}")
        lines.append(f"  answer: ralph session answer {self.session.id} \"...\" "
                     f"--question {question.id}")
        self._say("\n".join(lines))
        for observe in self.on_question:
            observe("post", question)

    def announce(self) -> None:
        """What agents told the humans since the last look: in-run questions, progress,
        each under its author's name ("[executor t1] progress: ...")."""
        for record in self._feed.read_new():
            payload = record.get("payload")
            if record["topic"] == "human.progress":
                self._say(f"[{author(record)}] progress: "
                          f"{payload_text(payload, PROGRESS_SHOWN)}")
            elif record["topic"] == "human.question" and isinstance(payload, dict) \
                    and payload.get("in_run") and isinstance(payload.get("id"), str):
                try:
                    self.announce_question(self.session.questions.load(payload["id"]))
                except BadInput:
                    continue

    def _record_question(self, question: questions.Question) -> None:
        self.session.once(record_key("human.question", question.id), "human.question", {
            "id": question.id, "text": question.text, "kind": question.kind,
            "deadline": question.deadline.isoformat()})

    # --- the hold ---

    def hold(self) -> Next | None:
        """Block while the loop's question is pending; apply its answer or its timeout.
        PAUSE / ABORT still work while it waits: their Next comes back."""
        self.deliver_answers()
        qid = self.tracker.metadata.pending_question
        if not qid:
            return None
        question = self.session.questions.load(qid)
        self.announce_question(question)   # resumed into it: say what it waits for
        while True:
            answer = self.session.questions.read_answer(qid)
            if question.status is Q.ANSWERED or answer is not None:
                return self._apply_answer(question, answer)
            if question.status is Q.TIMED_OUT or self.clock.now() >= question.deadline:
                return self._apply_timeout(question)
            stop = self.mailbox.poll(Mode.CHECKPOINT)
            if stop is not None:
                return stop
            self._wait(question.deadline)
            # read again: a channel that cannot deliver it moves its deadline to now
            question = self.session.questions.load(qid)

    def _apply_answer(self, question: questions.Question, answer) -> Next | None:
        if answer is not None:
            self.mailbox.queue_event(f"human.response-{question.id}", "human.response",
                                     {"question": question.text, "answer": answer.text,
                                      "id": question.id})
        response = {"id": question.id, "answer": answer.text if answer else None,
                    "channel": answer.channel if answer else None}
        if question.status is not Q.ANSWERED:
            self.session.questions.resolve(question, Q.ANSWERED, self.clock.now())
        # resolved, then a crash before its record: the record is written now, once
        self.session.once(record_key("human.response", question.id), "human.response",
                          response)
        self.tracker.set_pending_question(None)
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
            self.session.once(record_key("human.timeout", question.id), "human.timeout",
                              timeout)
            return Next(Trigger.PAUSE, f"question {question.id} unanswered by its deadline: "
                                       f"{question.text}", PauseKind.QUESTION)
        if question.status is not Q.TIMED_OUT:
            self.session.questions.resolve(question, Q.TIMED_OUT, self.clock.now())
        if policy != "pause":   # (a pause recorded it when it paused)
            # resolved, then a crash before its record: the record is written now, once
            self.session.once(record_key("human.timeout", question.id), "human.timeout",
                              timeout)
        self.mailbox.queue_event(f"human.timeout-{question.id}", "human.timeout",
                                 {"id": question.id, "question": question.text,
                                  "policy": policy, "default": question.default})
        self.tracker.set_pending_question(None)
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
        question = self.session.questions.load(m.pending_question)
        if not question.timeout_paused:
            question.timeout_paused = True
            self.session.questions.save(question)

    # --- late answers and recovery ---

    def deliver_answers(self) -> None:
        """Answers nobody is waiting for reach the next prompt, once: a late answer (its
        question timed out) as guidance for any role; the answer to an in-run question
        whose asker is gone as a human.response for the next run of the unit that asked.
        An in-run question nobody waits for times out at its deadline.

        Called before every agent run and transition, so it reads only what can still
        change: a settled question is never read again, and one that timed out is read
        again only once an answer file exists for it; reading every question file each
        time made a long session's every step slower with each question asked."""
        known = self._question_states
        waiting = []
        for qid in self.session.questions.ids():
            if known.get(qid) == "settled":
                continue
            if known.get(qid) == "timed_out" and not self.session.questions.has_answer(qid):
                continue
            try:
                question = self.session.questions.load(qid)
            except BadInput:
                continue
            if question.status in (Q.ANSWERED, Q.CANCELLED) or question.late_answer_delivered \
                    or question.kind == "approval":   # about one call: the approvals'
                known[qid] = "settled"
            elif question.status is Q.TIMED_OUT:
                known[qid] = "timed_out"
                waiting.append(question)
            elif question.asker_gone:
                waiting.append(question)
        for question in sorted(waiting, key=lambda q: q.asked_at):
            answer = self.session.questions.read_answer(question.id)
            if question.status is Q.PENDING:
                self._settle_orphan(question, answer)
            elif answer is not None:
                self._deliver_late(question, answer)

    def _deliver_late(self, question: questions.Question, answer) -> None:
        self.mailbox.queue_note(f"late-{question.id}",
                                f"Late answer to \"{question.text}\": {answer.text}")
        self.session.append_scratchpad(
            (f"- {answer.answered_at.isoformat(timespec='seconds')} late answer to "
             f"{question.id}: {answer.text}", f"late answer to {question.id}"))
        question.late_answer_delivered = True
        self.session.questions.save(question)
        self._question_states[question.id] = "settled"

    def _settle_orphan(self, question: questions.Question, answer) -> None:
        """An in-run question whose asker is gone: its answer goes to the next run of the
        unit that asked (or of any role, once that unit is over); its deadline still holds.
        A timeout recorded before the engine stopped (its asker got the default) stands:
        an answer after it is a late one."""
        now = self.clock.now()
        timed_out = answer is not None and self.session.done(
            record_key("human.timeout", question.id))
        if answer is None or timed_out:
            if answer is None and now < question.deadline:
                return
            self.session.once(record_key("human.timeout", question.id), "human.timeout", {
                "id": question.id, "in_run": True, "asker_gone": True,
                "default": question.default})
            self.session.questions.resolve(question, Q.TIMED_OUT, now)
            self._question_states[question.id] = "timed_out"
            if timed_out:
                self._deliver_late(question, answer)
            return
        c = question.context
        ahead = c.role and c.iteration == self.tracker.metadata.iteration and (
            not c.task or self.tracker.marker(c.task) not in progress.FINISHED)
        self.mailbox.queue_event(
            f"human.response-{question.id}", "human.response",
            {"question": question.text, "answer": answer.text, "id": question.id},
            role=c.role if ahead else None, task=c.task if ahead else None)
        self.session.append_scratchpad(
            (f"- {answer.answered_at.isoformat(timespec='seconds')} answer to {question.id} "
             f"(\"{question.text}\"): {answer.text}", f"answer to {question.id}"))
        self.session.once(record_key("human.response", question.id), "human.response", {
            "id": question.id, "answer": answer.text, "channel": answer.channel,
            "asker_gone": True})
        self.session.questions.resolve(question, Q.ANSWERED, now)
        self._question_states[question.id] = "settled"

    def release_in_run_questions(self, unit: str | None = None) -> None:
        """A run ended (or, with no unit, the engine died under every run): an in-run
        question of it that is still pending has no asker waiting any more. It stays
        answerable; its answer goes to the next run of the unit (deliver_answers)."""
        for qid in self.session.questions.ids():
            if self._question_states.get(qid) == "settled":
                continue
            try:
                question = self.session.questions.load(qid)
            except BadInput:
                continue
            if question.kind == "in_run" and question.status is Q.PENDING and \
                    (unit is None or question.unit == unit):
                self.session.questions.mark_asker_gone(question)

    def recover(self) -> None:
        """After a crash: a loop question written just before the engine died is adopted
        (the question file is the commit point of asking); an in-run `ask` whose agent
        died with the engine has no asker any more (its answer goes to the unit's next
        run), and one asked just before is recorded as its run's."""
        self.release_in_run_questions()
        m = self.tracker.metadata
        for question in self.session.questions.all():
            if question.status is not Q.PENDING or question.kind == "approval":
                continue   # (an approval holds no loop: the approvals keep it)
            if question.kind == "in_run":
                self.session.once(record_key("human.question", question.id),
                                  "human.question", {
                                      "id": question.id, "text": question.text,
                                      "in_run": True, "asker_gone": True,
                                      "deadline": question.deadline.isoformat()},
                                  source=question.context.role or "engine")
                continue
            if m.pending_question is None:
                self.tracker.set_pending_question(question.id)
        # the question file is the commit point of asking, its bus record comes after: a
        # crash in between left the question without its record (which `tail`, the status
        # view and the bus's readers go by), so it is written now, once
        if m.pending_question:
            self._record_question(self.session.questions.load(m.pending_question))
