"""Humans in the loop (seed 000, DESIGN §7): the loop-level block of `human.interact`.

An agent's `human.interact` makes the engine ask after that run; no agent runs and no
transition happens until the question is answered or its deadline passes. The answer
reaches the next prompt as `human.response`; a timeout applies `RObot.on_timeout`.
Every step is keyed by the question id, so a crash never applies an answer twice, and
a deadline that passed while the engine was down is applied once, on resume.
"""
from __future__ import annotations

import os
from datetime import timedelta

from session_store import BadInput, PauseKind, questions, read_events, signals

from .driver_types import Next, Preempted


def ask(engine, text: str, *, options=(), default: str | None = None, kind: str = "loop",
        role: str | None = None, task_id: str | None = None, fallback_type: str | None = None,
        on_timeout: str | None = None) -> questions.Question:
    """Ask the humans on behalf of the loop: the question file is the commit point, then
    the session records it as pending; the hold that follows waits for it."""
    now = engine.clock.now()
    robot = engine.config.RObot
    question = questions.ask(engine.session.dir, questions.Question(
        id=questions.new_question_id(now), text=text, asked_at=now,
        deadline=now + timedelta(seconds=robot.timeout_seconds),
        on_timeout=on_timeout or robot.on_timeout.value, options=list(options),
        default=default, kind=kind, fallback_type=fallback_type,
        context=questions.QuestionContext(session=engine.session.id, state=engine.current.value,
                                          iteration=engine.metadata.iteration, role=role,
                                          task=task_id)))
    engine.metadata.pending_question = question.id
    engine.save()
    _record_question(engine, question)
    engine.say(f"question {question.id} for a human: {question.text.splitlines()[0]}  "
               f"(answer: ralph session answer {engine.session.id} \"...\")")
    return question


def _record_question(engine, question: questions.Question) -> None:
    engine.session.append_event("human.question", {"id": question.id, "text": question.text,
                                                   "kind": question.kind,
                                                   "deadline": question.deadline.isoformat()})


def ask_from_event(engine, event: dict, role: str, task) -> questions.Question:
    """An agent's `human.interact`: its payload is the text, or {text, options, default}."""
    payload = event.get("payload")
    text, options, default = payload, [], None
    if isinstance(payload, dict):
        text = payload.get("text") or payload.get("question") or str(payload)
        options = [str(o) for o in payload.get("options") or []]
        default = payload.get("default")
    return ask(engine, str(text or "(no question text)"), options=options,
               default=None if default is None else str(default), role=role,
               task_id=task.id if task else None)


def hold(engine) -> None:
    """Block while the loop's question is pending; apply its answer or its timeout."""
    deliver_late_answers(engine)
    qid = engine.metadata.pending_question
    if not qid:
        return
    d = engine.session.dir
    question = questions.load_question(d, qid)
    while True:
        answer = questions.read_answer(d, qid)
        if question.status is questions.QuestionStatus.ANSWERED or answer is not None:
            _apply_answer(engine, question, answer)
            return
        timed_out = question.status is questions.QuestionStatus.TIMED_OUT or (
            engine.clock.now() >= question.deadline)
        if timed_out:
            _apply_timeout(engine, question)
            return
        engine.checkpoint()  # PAUSE / ABORT still work while we wait
        engine.wait(question.deadline)
        # read again: a channel that cannot deliver it moves its deadline to now
        question = questions.load_question(d, qid)


def _apply_answer(engine, question: questions.Question, answer) -> None:
    d = engine.session.dir
    if answer is not None:
        _queue_event(engine, question.id, "human.response",
                     {"question": question.text, "answer": answer.text, "id": question.id})
    response = {"id": question.id, "answer": answer.text if answer else None,
                "channel": answer.channel if answer else None}
    if question.status is not questions.QuestionStatus.ANSWERED:
        questions.resolve(d, question, questions.QuestionStatus.ANSWERED, engine.clock.now())
        engine.session.append_event("human.response", response)
    elif not _on_bus(engine, "human.response", question.id):
        # resolved, then a crash before its record: the record is written now, once
        engine.session.append_event("human.response", response)
    engine.metadata.pending_question = None
    engine.skip_cooldown = True   # a human answered: the next run starts at once
    engine.save()
    if question.kind in ("fallback", "checkin"):
        from . import fallback
        fallback.after_answer(engine, question, answer.text if answer else None)


def _apply_timeout(engine, question: questions.Question) -> None:
    """The policy of an unanswered question: continue (the next prompt is told), pause
    (the question stays answerable; resume goes on with its answer), abort."""
    d, now = engine.session.dir, engine.clock.now()
    policy = question.on_timeout
    timeout = {"id": question.id, "policy": policy, **_undelivered(question)}
    if policy == "pause" and not question.timeout_paused:
        # the session pauses, once: the question is marked `timeout_paused` when it is
        # resumed from that pause (note_resumed), so a crash before the pause is durable
        # pauses again rather than going on as if it had paused
        if not _on_bus(engine, "human.timeout", question.id):
            engine.session.append_event("human.timeout", timeout)
        raise Preempted(Next("pause", f"question {question.id} unanswered by its deadline: "
                                      f"{question.text}", PauseKind.QUESTION))
    if question.status is not questions.QuestionStatus.TIMED_OUT:
        questions.resolve(d, question, questions.QuestionStatus.TIMED_OUT, now)
        if policy != "pause":
            engine.session.append_event("human.timeout", timeout)
    elif policy != "pause" and not _on_bus(engine, "human.timeout", question.id):
        # resolved, then a crash before its record: the record is written now, once
        engine.session.append_event("human.timeout", timeout)
    _queue_event(engine, question.id, "human.timeout",
                 {"id": question.id, "question": question.text,
                  "policy": policy, "default": question.default})
    engine.metadata.pending_question = None
    engine.save()
    if policy == "abort":
        raise Preempted(Next("abort", f"question {question.id} unanswered by its deadline"))


def note_resumed(engine) -> None:
    """A session paused by its question's timeout (on_timeout: pause) is being resumed:
    that pause happened, so the question's timeout now goes on without pausing again (an
    answer is still welcome). Idempotent: a crash before the resume is durable repeats it."""
    qid = engine.metadata.pending_question
    if engine.metadata.orchestrator.pause_kind is not PauseKind.QUESTION or not qid:
        return
    question = questions.load_question(engine.session.dir, qid)
    if not question.timeout_paused:
        question.timeout_paused = True
        questions.save_question(engine.session.dir, question)


def _on_bus(engine, topic: str, qid: str) -> bool:
    """Whether the engine recorded `topic` for question `qid` (read only on the paths a
    crash leads to: the whole bus is read)."""
    records, _ = read_events(engine.session.dir)
    return any(r["topic"] == topic and r.get("source") == "engine"
               and isinstance(r["payload"], dict) and r["payload"].get("id") == qid
               for r in records)


def _undelivered(question: questions.Question) -> dict:
    return {"delivery_failed": True} if question.delivery_failed else {}


def deliver_late_answers(engine) -> None:
    """An answer that came after its question timed out is kept and reaches the next
    prompt as guidance, once.

    Called before every agent run and transition, so it reads only what can still change:
    a question settled (answered, cancelled, late answer delivered) is never read again,
    and one that timed out is read again only once an answer file exists for it
    (engine.question_states); reading every question file each time made a long
    session's every step slower with each question asked."""
    d = engine.session.dir
    known = engine.question_states
    folder = os.path.join(d, "questions")
    late = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        qid = name[:-5]
        if not name.endswith(".yaml") or name.startswith(".") or known.get(qid) == "settled":
            continue
        if known.get(qid) == "timed_out" and not os.path.exists(
                os.path.join(d, "answers", name)):
            continue
        try:
            question = questions.load_question(d, qid)
        except BadInput:
            continue
        if question.status in (questions.QuestionStatus.ANSWERED,
                               questions.QuestionStatus.CANCELLED) \
                or question.late_answer_delivered:
            known[qid] = "settled"
        elif question.status is questions.QuestionStatus.TIMED_OUT:
            known[qid] = "timed_out"
            late.append(question)
    for question in sorted(late, key=lambda q: q.asked_at):
        answer = questions.read_answer(d, question.id)
        if answer is None:
            continue
        signals.queue_guidance(d, {"id": f"late-{question.id}", "type": "INFO", "target": "all",
                                   "message": f"Late answer to \"{question.text}\": {answer.text}",
                                   "at": engine.clock.now().isoformat()})
        engine.session.append_scratchpad(
            (f"- {answer.answered_at.isoformat(timespec='seconds')} late answer to "
             f"{question.id}: {answer.text}", f"late answer to {question.id}"))
        question.late_answer_delivered = True
        questions.save_question(d, question)
        known[question.id] = "settled"


def recover(engine) -> None:
    """After a crash: a loop question written just before the engine died is adopted (the
    question file is the commit point of asking); an in-run `ask` whose agent died with
    the engine waits for nobody and is cancelled (the re-run asks again)."""
    d = engine.session.dir
    for question in questions.questions(d):
        if question.status is not questions.QuestionStatus.PENDING:
            continue
        if question.kind == "in_run":
            questions.resolve(d, question, questions.QuestionStatus.CANCELLED, engine.clock.now())
        elif engine.metadata.pending_question is None:
            engine.metadata.pending_question = question.id
            engine.save()
    # the question file is the commit point of asking, its bus record comes after: a
    # crash in between left the question without its record (which `tail`, the status
    # view and the bus's readers go by), so it is written now, once
    qid = engine.metadata.pending_question
    if qid and not _on_bus(engine, "human.question", qid):
        _record_question(engine, questions.load_question(d, qid))


def _queue_event(engine, qid: str, topic: str, payload: dict) -> None:
    signals.queue_guidance(engine.session.dir, {
        "id": f"{topic}-{qid}", "type": "EVENT", "topic": topic, "target": "all",
        "message": payload, "at": engine.clock.now().isoformat()})
