"""Deadlines, timeouts and waits on the clock the test moves (freezegun, through the
`clock` fixture: support/clock.py): a question's timeout policies, a deadline that
passes while no engine runs, a late answer, a knowledge approval's timeout, a usage
limit's wait and its caps, the cooldown, the fallback's no-progress timer. The engine
runs in-process; its every timed wait (engine.clock's `wait`) moves the frozen time
instead of waiting it out, so a wait of an hour costs what a wait of a second does. The
real `ralph` keeps one test of a wiring with a short real wait, said beside it
(test_humans: a question's timeout; test_limits: a limit's; test_signals: knowledge's).
"""
from __future__ import annotations

from datetime import timedelta

import pytest

from ralph.engine.agents import UsageLimit
from ralph.session_store import load, questions, signals
from support import EVIDENCE, events, metadata, progress_markers, ralph, topics
from support.engines import config, engine_for
from support.recording import SUCCEED, RecordingAgent
from support.sessions import new_session

Q = questions.QuestionStatus
PLAN = {"role": "planner", "emit": [("plan.ready", {"tasks": [{"id": "t1", "title": "T1"}]})]}
ASK = {"role": "executor", "task": "t1",
       "emit": [("human.interact", {"text": "Which database?", "options": ["postgres", "sqlite"]})]}


class Killed(BaseException):
    """The engine's end in the middle of a wait, as kill -9 ends it (in-process, its
    `finally` blocks run; they release the session and save no state)."""


def killed_in_its_first_wait(clock, monkeypatch):
    def wait(wakeup, seconds):
        raise Killed
    monkeypatch.setattr(clock, "wait", wait)


def resumed(workspace, agent, clock, cfg=None, **run):
    """A new engine over the session as the store has it (`ralph session resume`)."""
    session = load(str(workspace), "s1")
    return engine_for(session, agent, clock=clock, config=cfg).run(resume=True, **run)


# --- a loop question's deadline ---

def test_timeout_continue_goes_on_and_the_next_prompt_is_told(workspace, clock):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, ASK], otherwise=SUCCEED)
    engine = engine_for(session, agent, clock=clock,
                        config=config({"RObot": {"timeout_seconds": 3600,
                                                 "on_timeout": "continue"}}))
    asked = clock.now()
    assert engine.run() == 0
    [q] = questions.questions(session.dir)
    assert q.status is Q.TIMED_OUT and clock.now() >= asked + timedelta(hours=1)
    second = agent.prompts("executor", "t1")[1]
    assert "human.timeout" in second and "Which database?" in second
    assert topics(session.dir).count("human.timeout") == 1


def test_timeout_pause_keeps_the_question_answerable_until_the_resume(workspace, clock):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, ASK], otherwise=SUCCEED)
    cfg = config({"RObot": {"timeout_seconds": 60, "on_timeout": "pause"}})
    assert engine_for(session, agent, clock=clock, config=cfg).run() == 3
    meta = metadata(session.dir)
    assert "unanswered" in meta["orchestrator"]["pause_reason"]
    [q] = questions.questions(session.dir)
    assert q.status is Q.PENDING
    clock.advance(7 * 24 * 3600)   # a week later the answer still lands
    questions.answer(session.dir, q.id, "sqlite", now=clock.now())
    assert resumed(workspace, agent, clock, cfg) == 0
    assert "sqlite" in agent.prompts("executor", "t1")[1]
    [q] = questions.questions(session.dir)
    assert q.status is Q.ANSWERED


def test_timeout_abort_aborts_and_fails_the_task(workspace, clock):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, ASK], otherwise=SUCCEED)
    cfg = config({"RObot": {"timeout_seconds": 60, "on_timeout": "abort"}})
    assert engine_for(session, agent, clock=clock, config=cfg).run() == 4
    assert metadata(session.dir)["status"] == "aborted"
    assert progress_markers(session.dir)["1"]["t1"] == "F"


def test_a_deadline_that_passes_while_no_engine_runs_is_applied_once(workspace, clock,
                                                                       monkeypatch):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, ASK], otherwise=SUCCEED)
    cfg = config({"RObot": {"timeout_seconds": 2, "on_timeout": "continue"}})
    killed_in_its_first_wait(clock, monkeypatch)
    with pytest.raises(Killed):
        engine_for(session, agent, clock=clock, config=cfg).run()
    monkeypatch.undo()
    [q] = questions.questions(session.dir)
    clock.advance_to(q.deadline + timedelta(hours=1))   # the engine is down meanwhile
    assert resumed(workspace, agent, clock, cfg) == 0
    assert topics(session.dir).count("human.timeout") == 1
    assert agent.prompts("executor", "t1")[1].count("human.timeout") == 1
    # a late answer is kept and reaches a later prompt as guidance
    questions.answer(session.dir, q.id, "late but sure", now=clock.now())


def test_a_late_answer_reaches_the_next_prompt_as_guidance(workspace, clock):
    session = new_session(workspace, clock=clock)

    def answered_late(inv):   # while t2 runs, after t1's question timed out
        [q] = questions.questions(session.dir)
        assert q.status is Q.TIMED_OUT
        questions.answer(session.dir, q.id, "spaces", now=clock.now())
    plan = {"role": "planner", "emit": [("plan.ready", {"tasks": [
        {"id": "t1", "title": "T1"}, {"id": "t2", "title": "T2"}]})]}
    agent = RecordingAgent([
        plan, {"role": "executor", "task": "t1", "emit": [("human.interact", "Tabs or spaces?")]},
        {"role": "executor", "task": "t2", "during": answered_late,
         "emit": [("build.done", EVIDENCE)]}], otherwise=SUCCEED)
    cfg = config({"RObot": {"timeout_seconds": 60}})
    assert engine_for(session, agent, clock=clock, config=cfg).run() == 0
    reviewer = agent.prompts("reviewer", "t1")[0]
    assert "## ROBOT GUIDANCE" in reviewer and "Late answer" in reviewer and "spaces" in reviewer
    assert "late answer to" in open(f"{session.work_dir}/scratchpad.md").read()


# --- a knowledge approval's timeout ---

LIBRARIAN = {"role": "librarian",
             "write_iteration": {"knowledge/notes.md": "# notes\n\nlearned things\n"},
             "emit": [("knowledge.staged", "notes.md")]}


def test_knowledge_unapproved_by_its_timeout_is_carried_to_the_next_iteration(workspace,
                                                                               clock):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, LIBRARIAN], otherwise=SUCCEED)
    cfg = config({"knowledge": {"approval": "required", "timeout_seconds": 3600}})
    began = clock.now()
    assert engine_for(session, agent, clock=clock, config=cfg).run() == 0
    assert clock.now() >= began + timedelta(hours=1)   # it waited out the hour
    work = session.work_dir
    assert not (workspace / ".docs").exists()
    assert open(f"{work}/iterations/2/knowledge/notes.md").read() == \
        "# notes\n\nlearned things\n"
    assert session.iteration(1).load().knowledge_decision == "carried"


# --- a usage limit's wait ---

def limited(clock, seconds: float | None, **step) -> dict:
    """The executor's run, at its CLI's limit, which says it resets in `seconds` (None:
    says no time)."""
    until = clock.now() + timedelta(seconds=seconds) if seconds is not None else None
    return {"role": "executor", "task": "t1", "limit": UsageLimit(until, "usage limit"),
            **step}


def attempts(session, task: str = "t1") -> list[str]:
    return session.iteration(1).load().task_progress(task).attempts


def test_a_limit_is_waited_out_to_its_reset_and_the_step_retried_with_nothing_spent(
        workspace, clock):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, limited(clock, 5 * 3600)], otherwise=SUCCEED)
    reset = clock.now() + timedelta(hours=5)
    assert engine_for(session, agent, clock=clock).run() == 0
    [reached] = [e["payload"] for e in events(session.dir) if e["topic"] == "limit.reached"]
    [over] = [e["payload"] for e in events(session.dir) if e["topic"] == "limit.over"]
    assert reached["action"] == "wait" and reached["retry_at"] == reset.isoformat()
    assert over["why"] == "the limit reset" and over["waited_seconds"] >= 5 * 3600
    assert attempts(session) == ["done"]
    assert len(agent.runs("executor", "t1")) >= 2   # the same step, run again
    # the wait was no work: the five hours are not in the runtime
    assert metadata(session.dir)["usage"]["runtime_seconds"] < 60


def test_no_reset_said_waits_the_configured_time_and_max_caps_a_long_one(workspace, clock):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, limited(clock, None), limited(clock, 3600)],
                           otherwise=SUCCEED)
    cfg = config({"agent": {"limit_wait_seconds": 120, "max_limit_wait_seconds": 300}})
    assert engine_for(session, agent, clock=clock, config=cfg).run() == 0
    reached = [e for e in events(session.dir) if e["topic"] == "limit.reached"]
    waits = [(e["payload"]["reset"], (_at(e["payload"]["retry_at"]) - _at(e["ts"])).total_seconds())
             for e in reached]
    assert waits == [(None, 120.0), (waits[1][0], 300.0)] and waits[1][0] is not None
    assert attempts(session) == ["done"]


def _at(iso: str):
    from datetime import datetime
    return datetime.fromisoformat(iso)


def test_killed_during_the_wait_a_resume_waits_for_the_same_reset(workspace, clock,
                                                                   monkeypatch):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, limited(clock, 3600)], otherwise=SUCCEED)
    reset = clock.now() + timedelta(hours=1)
    killed_in_its_first_wait(clock, monkeypatch)
    with pytest.raises(Killed):
        engine_for(session, agent, clock=clock).run()
    monkeypatch.undo()
    assert metadata(session.dir)["limit_wait"]["until"] is not None
    listed = ralph(workspace, "session", "list")
    assert "interrupted" in listed.stdout and "waiting for demo's usage limit" in listed.stdout
    clock.advance(600)   # down ten minutes
    assert resumed(workspace, agent, clock) == 0
    assert clock.now() >= reset
    assert topics(session.dir).count("limit.reached") == 1
    [over] = [e for e in events(session.dir) if e["topic"] == "limit.over"]
    assert over["payload"]["why"] == "the limit reset" and _at(over["ts"]) >= reset
    assert attempts(session) == ["done"]


def test_a_pause_acts_during_the_wait_and_resume_now_retries_at_once(workspace, clock,
                                                                      monkeypatch):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, limited(clock, 3600)], otherwise=SUCCEED)
    waited = clock.wait

    def a_pause_comes_during_the_wait(wakeup, seconds):
        signals.drop(session.dir, "PAUSE", "stop for now", now=clock.now())
        return waited(wakeup, 1)
    monkeypatch.setattr(clock, "wait", a_pause_comes_during_the_wait)
    asked = clock.now()
    assert engine_for(session, agent, clock=clock).run() == 3
    monkeypatch.undo()
    assert clock.now() - asked < timedelta(minutes=1)   # not the hour
    assert metadata(session.dir)["limit_wait"] is not None   # still waiting for its reset
    assert resumed(workspace, agent, clock, now=True) == 0
    assert clock.now() - asked < timedelta(minutes=1)
    over = [e["payload"]["why"] for e in events(session.dir) if e["topic"] == "limit.over"]
    assert over == ["ralph session resume --now"]
    assert attempts(session) == ["done"]


def test_on_limit_pause_pauses_and_a_resume_after_the_reset_retries(workspace, clock):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN, limited(clock, 3600)], otherwise=SUCCEED)
    cfg = config({"agent": {"on_limit": "pause"}})
    assert engine_for(session, agent, clock=clock, config=cfg).run() == 3
    m = metadata(session.dir)
    assert m["orchestrator"]["pause_kind"] == "usage_limit"
    assert "demo hit its usage limit" in m["orchestrator"]["pause_reason"]
    clock.advance(3600)
    assert resumed(workspace, agent, clock, cfg) == 0
    assert attempts(session) == ["done"]


# --- the cooldown between runs ---

def test_each_run_after_the_first_waits_the_cooldown(workspace, clock):
    session = new_session(workspace, clock=clock)
    agent = RecordingAgent([PLAN], otherwise=SUCCEED)
    cfg = config({"event_loop": {"cooldown_delay_seconds": 30}})
    assert engine_for(session, agent, clock=clock, config=cfg).run() == 0
    assert len(agent.played) >= 4 and clock.slept == [30.0] * (len(agent.played) - 1)


# --- the fallback's no-progress timer ---

def test_no_task_completed_for_longer_than_no_progress_minutes_asks_for_guidance(workspace,
                                                                                 clock):
    session = new_session(workspace, clock=clock)
    plan = {"role": "planner", "emit": [("plan.ready", {"tasks": [
        {"id": "t1", "title": "A"}, {"id": "t2", "title": "B", "batch": 2}]})]}
    slow_review = {"role": "reviewer", "task": "t1",
                   "during": lambda inv: clock.advance(20 * 60),   # the review takes 20 min
                   "emit": [("review.done", "tests: pass, build: pass")]}
    agent = RecordingAgent([plan, slow_review], otherwise=SUCCEED)
    cfg = config({"fallback": {"no_progress_minutes": 15}})
    assert engine_for(session, agent, clock=clock, config=cfg).run() == 0
    asked = [q.text for q in questions.questions(session.dir)]
    assert any("Issue: Guidance" in t and "no task completed for 20.0 minutes" in t
               for t in asked), asked
