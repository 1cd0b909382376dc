"""The engine's parts in-process, table by table, on a clock the test moves (no
subprocess, no sleep):

  1. the mailbox: per signal type, target, state and polling mode, what is taken, kept
     for a role, left waiting or rejected (and why);
  2. the human desk: a loop question past its deadline under each on_timeout policy;
  3. attempt streaks: run_until_outcome over scripted runs (thrashing, no progress, ...);
  4. the agent runner, played by the recording agent: gates, the completion line, usage.

The subprocess suites (test_signals, test_humans, test_gates, ...) show the same
behaviours end to end; these rows are where a rule is read and changed.
"""
from __future__ import annotations

from datetime import timedelta

import pytest

from ralph.engine.policy.attempts import run_until_outcome
from ralph.engine.mailbox import Mailbox, Mode, Rerun
from ralph.session_store import PauseKind, PlannedTask, State, questions, signals
from ralph.states import Next, Trigger
from ralph.states.context import RoleRun, Streaks
from support import EVIDENCE, REVIEW_OK, events, metadata, signal_files, taken_marks, topics
from support.engines import config, engine_for
from support.recording import SUCCEED, RecordingAgent

Q = questions.QuestionStatus


# --- 1. the mailbox --------------------------------------------------------------------

def _drop(session, clock, spec) -> str:
    """Drop a signal (a dict of its fields) as `ralph signal` does, or raw bytes as a
    careless writer would."""
    if isinstance(spec, bytes):
        name = "signal.000000-000000-000-raw.yaml"
        with open(f"{session.dir}/signals/inputs/{name}", "wb") as f:
            f.write(spec)
        return name
    spec = dict(spec)
    kind = spec.pop("type")
    return signals.drop(session.dir, kind, spec.pop("message", f"{kind} message"),
                        now=clock.now(), **spec)


def _returned(decision) -> str | None:
    """What a poll or a hold returned: None, pause, abort (a Next), rerun (a Rerun)."""
    if decision is None:
        return None
    if isinstance(decision, Rerun):
        return "rerun"
    return {Trigger.PAUSE: "pause", Trigger.ABORT: "abort"}[decision.trigger]


def _mailbox(session, clock, state: State):
    def decide(signal) -> str:   # the knowledge keeper's part: APPROVE / SKIP -> its action
        return f"decided {signal.type}"
    return Mailbox(session, clock, state=lambda: state, decide_knowledge=decide)


T, A, C, K, R = Mode.TRANSITION, Mode.AGENT, Mode.CHECKPOINT, Mode.KNOWLEDGE, Mode.RESUME
P, E, V, KA = State.PLANNING, State.EXECUTING_BATCH, State.REVIEWING_BATCH, \
    State.KNOWLEDGE_APPROVAL

# (mode, state, signal) -> what poll returns, where the signal ends, why, and the role
# its guidance is kept for. where: waiting (still in inputs/), taken (taken, to be marked
# once the transition it asks for is persisted), handled (marked, with its action),
# rejected (with its reason).
MAILBOX = [
    ("PAUSE for ALL at a transition", T, E, {"type": "PAUSE", "message": "lunch"},
     "pause", "taken", None, None),
    ("ABORT for the Orchestrator at a transition", T, V,
     {"type": "ABORT", "target": "Orchestrator"}, "abort", "taken", None, None),
    ("STEER for the Executor is kept for it", T, P, {"type": "STEER", "target": "Executor"},
     None, "handled", "queued for Executor", "executor"),
    ("INFO for ALL is kept for any role", C, E, {"type": "INFO"},
     None, "handled", "queued for the next invocation of any role", "all"),
    ("a Ralph- target is the role", K, P, {"type": "STEER", "target": "Ralph-Reviewer"},
     None, "handled", "queued for Reviewer", "reviewer"),
    ("STEER waits while an agent runs", A, E, {"type": "STEER", "target": "Executor"},
     None, "waiting", None, None),
    ("INFO waits while an agent runs", A, E, {"type": "INFO"}, None, "waiting", None, None),
    ("PAUSE stops a running agent", A, E, {"type": "PAUSE"}, "pause", "taken", None, None),
    ("ABORT stops a running agent", A, P, {"type": "ABORT"}, "abort", "taken", None, None),
    ("a priority STEER re-runs the running agent", A, E,
     {"type": "STEER", "target": "Executor", "priority": True}, "rerun", "handled",
     "interrupted the running agent to re-run it with the message", "executor"),
    ("a priority STEER between runs is guidance", T, E,
     {"type": "STEER", "target": "Executor", "priority": True}, None, "handled",
     "queued for Executor", "executor"),
    ("APPROVE waits outside KNOWLEDGE_APPROVAL", T, E, {"type": "APPROVE"},
     None, "waiting", None, None),
    ("SKIP waits at a checkpoint", C, V, {"type": "SKIP"}, None, "waiting", None, None),
    ("APPROVE waits for the knowledge poll", T, KA, {"type": "APPROVE"},
     None, "waiting", None, None),
    ("APPROVE waits in another state", K, E, {"type": "APPROVE"}, None, "waiting", None, None),
    ("APPROVE of this iteration is decided", K, KA, {"type": "APPROVE", "iteration": 1},
     None, "handled", "decided APPROVE", None),
    ("SKIP without an iteration is decided", K, KA, {"type": "SKIP"},
     None, "handled", "decided SKIP", None),
    ("a stale APPROVE is rejected", K, KA, {"type": "APPROVE", "iteration": 3}, None,
     "rejected", "stale: for iteration 3, the session is in iteration 1", None),
    ("a PAUSE is void while resuming", R, State.PAUSED, {"type": "PAUSE"}, None, "handled",
     "ignored: the session was paused already and is being resumed", None),
    ("a PAUSE is void while paused", C, State.PAUSED, {"type": "PAUSE"}, None, "handled",
     "ignored: the session was paused already and is being resumed", None),
    ("an ABORT while resuming aborts", R, State.PAUSED, {"type": "ABORT"},
     "abort", "taken", None, None),
    ("an ABORT of a complete session is ignored", T, State.COMPLETE, {"type": "ABORT"},
     None, "handled", "ignored: the session is complete", None),
    ("an unknown type is rejected", T, P, b"type: BOGUS\nmessage: hi\n", None, "rejected",
     "$.type: expected one of STEER, INFO, PAUSE, ABORT, APPROVE, SKIP", None),
    ("an unknown target is rejected", A, E, b"type: PAUSE\ntarget: Nobody\n", None,
     "rejected", "$.target: expected one of", None),
    ("an unknown field is rejected", T, P, b"type: INFO\ncolour: red\n", None, "rejected",
     "$: unknown field colour", None),
    ("a priority INFO is rejected", T, P, b"type: INFO\npriority: true\n", None, "rejected",
     "$.priority: only a STEER can be a priority signal", None),
    ("a list is rejected", C, P, b"- PAUSE\n", None, "rejected",
     "$: expected a mapping with type, target, message", None),
    ("broken YAML is rejected", T, P, b"type: [PAUSE\n", None, "rejected",
     "not valid YAML", None),
]


@pytest.mark.parametrize("mode, state, spec, returns, where, why, kept_for",
                         [row[1:] for row in MAILBOX], ids=[row[0] for row in MAILBOX])
def test_mailbox_routing(session, clock, mode, state, spec, returns, where, why, kept_for):
    mailbox = _mailbox(session, clock, state)
    name = _drop(session, clock, spec)
    decision = mailbox.poll(mode)

    assert _returned(decision) == returns, decision
    sd = session.dir
    place = ("waiting" if name in signals.waiting(sd) else "taken" if name in taken_marks(sd)
             else "handled" if name in signal_files(sd, "processed")
             else "rejected" if name in signal_files(sd, "rejected") else "gone")
    assert place == where
    if where == "handled":
        assert why == signal_files(sd, "processed")[name]["handling_metadata"]["action_taken"]
    if where == "rejected":
        assert why in signal_files(sd, "rejected")[name]["rejection"]["reason"]
    kept = [g["target"] for g in signals.guidance(sd)
            if g["id"] == name and g["type"] in ("STEER", "INFO")]
    assert kept == ([kept_for] if kept_for else [])
    if where == "taken":   # marked once the transition it asked for is persisted
        assert decision.kind is (PauseKind.SIGNAL if returns == "pause" else None)
        assert decision.signal.name == name
        mailbox.mark_applied(decision.signal, decision.trigger)
        action = signal_files(sd, "processed")[name]["handling_metadata"]["action_taken"]
        assert action == ("paused the session" if returns == "pause" else "aborted the session")
        assert taken_marks(sd) == []


def test_mailbox_takes_oldest_first_and_stops_at_a_pause(session, clock):
    """Guidance taken before a PAUSE is queued (in arrival order); what comes after the
    PAUSE waits for the next poll."""
    mailbox = _mailbox(session, clock, State.EXECUTING_BATCH)
    names = []
    for spec in ({"type": "INFO", "message": "first"},
                 {"type": "STEER", "target": "Planner", "message": "second"},
                 {"type": "PAUSE", "message": "stop here"},
                 {"type": "INFO", "message": "after"}):
        names.append(_drop(session, clock, spec))
        clock.advance(0.01)   # names carry the time: arrival order
    decision = mailbox.poll(Mode.TRANSITION)
    assert decision.trigger is Trigger.PAUSE and decision.reason == "stop here"
    assert [(g["target"], g["message"]) for g in signals.guidance(session.dir)] == [
        ("all", "first"), ("planner", "second"), ("all", "stop here")]   # the pause's note
    assert signals.waiting(session.dir) == [names[3]]
    # a role's guidance is for that role's prompt (or every role's), delivered once a run
    unit = "1/executor/t1"
    assert [g["message"] for g in mailbox.guidance_for("executor", "t1", unit)] == [
        "first", "stop here"]


# --- 2. the human desk: a loop question's timeout policies -----------------------------

def _answer(session, clock, qid):
    questions.answer(session.dir, qid, "sqlite", now=clock.now())


def _undeliverable(session, clock, qid):
    questions.mark_undeliverable(session.dir, qid, clock.now())


def _pause_signal(session, clock, qid):
    signals.drop(session.dir, "PAUSE", "not now", now=clock.now())


# how the hold meets the question: past its deadline already (the clock moved), waiting
# for it (the in-process engine's wait moves the clock to the deadline), undeliverable
# (a channel gave up: its deadline is now), answered, or a PAUSE dropped meanwhile
PAST, WAITS = "past", "waits"
DESK = [
    ("continue: the session goes on, the next prompt is told", "continue", PAST, None,
     Q.TIMED_OUT, False, 1),
    ("pause: the session pauses, the question stays answerable", "pause", PAST, "pause",
     Q.PENDING, True, 1),
    ("abort: the session is aborted", "abort", PAST, "abort", Q.TIMED_OUT, False, 1),
    ("the hold waits until the deadline", "continue", WAITS, None, Q.TIMED_OUT, False, 1),
    ("an undeliverable question times out at once", "abort", _undeliverable, "abort",
     Q.TIMED_OUT, False, 1),
    ("an answer before the deadline", "abort", _answer, None, Q.ANSWERED, False, 0),
    ("a PAUSE signal while it waits", "continue", _pause_signal, "pause", Q.PENDING, True, 0),
]


@pytest.mark.parametrize("policy, how, returns, status, still_pending, timeouts",
                         [row[1:] for row in DESK], ids=[row[0] for row in DESK])
def test_desk_timeout_policy(session, clock, policy, how, returns, status, still_pending,
                             timeouts):
    engine = engine_for(session, RecordingAgent(), clock=clock)
    desk, timeout = engine.desk, engine.config.RObot.timeout_seconds
    asked_at = clock.now()
    question = desk.ask("Which database?", options=["postgres", "sqlite"], role="executor",
                        task_id="t1", on_timeout=policy)
    assert question.deadline == asked_at + timedelta(seconds=timeout)
    if how == PAST:
        clock.advance(timeout + 1)
    elif callable(how):
        how(session, clock, question.id)

    decision = desk.hold()

    assert _returned(decision) == returns, decision
    if how == WAITS:
        assert clock.now() == question.deadline   # waited, on the fake clock, to the deadline
    if how in (_undeliverable, _answer, _pause_signal):
        assert clock.now() == asked_at            # nothing waited
    assert questions.load_question(session.dir, question.id).status is status
    assert (session.metadata.pending_question == question.id) is still_pending
    timed_out = [e["payload"] for e in events(session.dir) if e["topic"] == "human.timeout"]
    assert [t["policy"] for t in timed_out] == [policy] * timeouts
    if how == _undeliverable:
        assert timed_out[0]["delivery_failed"] is True
    if returns == "pause" and how == PAST:
        assert decision.kind is PauseKind.QUESTION
        assert decision.reason == (f"question {question.id} unanswered by its deadline: "
                                   f"Which database?")
    news = [g["topic"] for g in signals.guidance(session.dir) if g["type"] == "EVENT"]
    assert news == {Q.TIMED_OUT: ["human.timeout"], Q.ANSWERED: ["human.response"],
                    Q.PENDING: []}[status]


def test_desk_pause_policy_goes_on_after_the_resume(session, clock):
    """on_timeout: pause pauses once; resumed from that pause, the timeout goes on as
    `continue` would, and human.timeout is on the bus once."""
    engine = engine_for(session, RecordingAgent(), clock=clock)
    question = engine.desk.ask("Deploy now?", on_timeout="pause")
    clock.advance(engine.config.RObot.timeout_seconds + 1)
    assert engine.desk.hold().trigger is Trigger.PAUSE
    session.metadata.orchestrator.pause_kind = PauseKind.QUESTION   # as the pause left it
    engine.desk.note_resumed()
    assert engine.desk.hold() is None
    assert questions.load_question(session.dir, question.id).status is Q.TIMED_OUT
    assert topics(session.dir).count("human.timeout") == 1
    assert session.metadata.pending_question is None


# --- 3. attempt streaks: run_until_outcome over scripted runs ---------------------------

def _ran(*emitted, exit_code=0, timed_out=False, stderr="") -> RoleRun:
    return RoleRun("executor", [{"seq": n, "topic": t, "payload": p}
                                for n, (t, p) in enumerate(emitted, 1)],
                   exit_code, timed_out, 1.0, "", stderr)


RUNS = {
    "done": _ran(("build.done", EVIDENCE)),
    "failed": _ran(("task.failed", "disk full")),
    "blocked": _ran(("build.blocked", {"reason": "no database"})),
    "empty": _ran(),
    "crashed": _ran(exit_code=1, stderr="error: no API key"),
    "asked": _ran(("human.interact", "Which database?")),
    "timeout": _ran(timed_out=True),
    "pause": Next(Trigger.PAUSE, "PAUSE signal", PauseKind.SIGNAL),
}
# what the next run is handed after each attempt
PENDING_AFTER = {"blocked": ["build.blocked"], "empty": ["task.resume"],
                 "crashed": ["task.resume"], "asked": []}


class ScriptedRunner:
    """The runner's two verbs: run (the scripted results, in order) and publish."""

    def __init__(self, script: list[str]):
        self.script = list(script)
        self.handed: list[list[str]] = []     # the topics each run was handed
        self.published: list[dict] = []

    def run(self, role, task, pending):
        self.handed.append([e["topic"] for e in pending])
        return RUNS[self.script.pop(0)]

    def publish(self, topic, payload, source="engine") -> dict:
        self.published.append({"seq": 100 + len(self.published), "topic": topic,
                               "payload": payload})
        return self.published[-1]


STREAKS = [
    ("done at once", ["done"], (0, 0), "done", None),
    ("failed", ["failed"], (0, 0), "failed", "task.failed: disk full"),
    ("blocked twice, then done", ["blocked", "blocked", "done"], (0, 0), "done", None),
    ("three blocked in a row: thrashing", ["blocked"] * 3, (0, 0), "thrashing",
     "abandoned after 3 consecutive build.blocked: no database"),
    ("two blocked before a resume, one after: thrashing", ["blocked"], (2, 0), "thrashing",
     "abandoned after 3 consecutive build.blocked: no database"),
    ("four empty runs: no progress", ["empty"] * 4, (0, 0), "no_progress",
     "no outcome after 3 task.resume retries"),
    ("four runs, the last crashed: its exit code and stderr in the reason",
     ["empty"] * 3 + ["crashed"], (0, 0), "no_progress",
     "no outcome after 3 task.resume retries (last exit code 1: error: no API key)"),
    ("three empty, then done", ["empty"] * 3 + ["done"], (0, 0), "done", None),
    ("a blocked run resets the empty streak", ["empty"] * 3 + ["blocked"] + ["empty"] * 3
     + ["done"], (0, 0), "done", None),
    ("an empty run resets the blocked streak", ["blocked", "blocked", "empty", "blocked",
                                                "blocked", "done"], (0, 0), "done", None),
    ("asking a human resets nothing: still four empty runs",
     ["empty", "empty", "asked", "empty", "empty"], (0, 0), "no_progress",
     "no outcome after 3 task.resume retries"),
    ("asking a human resets nothing: still three blocked",
     ["blocked", "blocked", "asked", "blocked"], (0, 0), "thrashing",
     "abandoned after 3 consecutive build.blocked"),
    ("three empty before a resume, one after", ["empty"], (0, 3), "no_progress",
     "no outcome after 3 task.resume retries"),
    ("timed out", ["timeout"], (0, 0), "timed_out", "the executor timed out"),
    ("a PAUSE is passed through as is", ["blocked", "pause"], (0, 0), "pause", "PAUSE signal"),
]


@pytest.mark.parametrize("script, streaks, kind, reason",
                         [row[1:] for row in STREAKS], ids=[row[0] for row in STREAKS])
def test_attempt_streaks(script, streaks, kind, reason):
    runner = ScriptedRunner(script)
    attempts = []
    got = run_until_outcome(runner, "executor", PlannedTask("t1", "T1"),
                            [{"seq": 1, "topic": "plan.ready", "payload": None}],
                            done=("build.done",), failed=("task.failed",),
                            blocked="build.blocked", streaks=Streaks(*streaks),
                            after_each=lambda run, attempt: attempts.append(attempt))
    if kind == "pause":
        assert got is RUNS["pause"]
    else:
        assert got.kind == kind, got
        assert got.reason is None if reason is None else reason in got.reason, got
    assert runner.script == []   # every scripted run, and no more
    ran = [name for name in script if name != "pause"]
    outcome = {"crashed": "empty", "timeout": "timed_out"}
    assert attempts == [outcome.get(name, name) for name in ran]
    assert runner.handed == [["plan.ready"]] + [PENDING_AFTER[name] for name in script[:-1]]
    retries = [p["payload"]["retry"] for p in runner.published if p["topic"] == "task.resume"]
    assert len(retries) == sum(PENDING_AFTER.get(name) == ["task.resume"]
                               for name in script[:-1])
    assert all(1 <= n <= 3 for n in retries)


# --- 4. the agent runner, played by the recording agent --------------------------------

T1 = PlannedTask("t1", "T1")
TASK_OF = {"executor": T1, "reviewer": T1}
MISSING = "lint: missing"

# a role's run -> the topics it comes back with (gated), and what that same role's next
# prompt says (and another role's does not)
RUNNER = [
    ("build.done without evidence becomes build.blocked", "executor",
     {"emit": [("build.done", "done!")]}, ["build.blocked"], ["build.blocked", MISSING]),
    ("build.done with evidence stands", "executor",
     {"emit": [("build.done", EVIDENCE)]}, ["build.done"], []),
    ("review.done without its literals becomes review.blocked", "reviewer",
     {"emit": [("review.done", {"status": "approved"})]}, ["review.blocked"],
     ["review.blocked", "tests: pass"]),
    ("review.done with them stands", "reviewer", {"emit": [("review.done", REVIEW_OK)]},
     ["review.done"], []),
    ("verify.passed without its report becomes verify.failed", "executor",
     {"emit": [("verify.passed", "all green")]}, ["verify.failed"], ["verify.failed"]),
    ("LOOP_COMPLETE before another event is ignored, with a note", "planner",
     {"emit": [("LOOP_COMPLETE", None), ("note", "one more thing")]}, ["note"],
     ["gate.note", "must be the last event of its run"]),
    ("a LOOP_COMPLETE line in the final text counts", "planner",
     {"text": "Nothing is left to do.\nLOOP_COMPLETE"}, ["LOOP_COMPLETE"], []),
    ("a LOOP_COMPLETE line on stdout counts", "planner",
     {"stdout": "checked everything\n  LOOP_COMPLETE  \n"}, ["LOOP_COMPLETE"], []),
    ("LOOP_COMPLETE inside a sentence does not", "planner",
     {"text": "not LOOP_COMPLETE yet"}, [], []),
    ("the event and the line count once", "planner",
     {"emit": [("LOOP_COMPLETE", "done")], "text": "LOOP_COMPLETE"}, ["LOOP_COMPLETE"], []),
]


@pytest.mark.parametrize("role, step, judged, next_prompt_has",
                         [row[1:] for row in RUNNER], ids=[row[0] for row in RUNNER])
def test_runner_gates_and_completion(session, clock, role, step, judged, next_prompt_has):
    agent = RecordingAgent([{"role": role, **step}])
    engine = engine_for(session, agent, clock=clock)
    run = engine.runner.run(role, TASK_OF.get(role), [])
    assert isinstance(run, RoleRun)
    assert [e["topic"] for e in run.events] == judged
    other = "librarian"
    engine.runner.run(other, None, [])
    engine.runner.run(role, TASK_OF.get(role), [])
    other_prompt, next_prompt = agent.prompts(other)[0], agent.prompts(role)[1]
    for text in next_prompt_has:
        assert text in next_prompt and text not in other_prompt
    if not next_prompt_has:
        assert "## PENDING EVENTS\n\n(none)\n" in next_prompt
    assert [p.role for p in agent.played] == [role, other, role]


def test_runner_rewrite_is_recorded_by_the_engine(session, clock):
    agent = RecordingAgent([{"role": "executor", "emit": [("build.done", "done!")]}])
    engine = engine_for(session, agent, clock=clock)
    engine.runner.run("executor", T1, [])
    done, blocked = [e for e in events(session.dir) if e["topic"].startswith("build.")]
    assert (done["topic"], done["source"]) == ("build.done", "executor")
    assert (blocked["topic"], blocked["source"]) == ("build.blocked", "engine")
    assert blocked["payload"]["rewritten_from"] == "build.done"
    assert blocked["payload"]["original_seq"] == done["seq"]
    assert blocked["payload"]["task"] == "t1"
    assert MISSING in blocked["payload"]["reason"]


PRICED = {"agent": {"prices": {"input": 3.0, "output": 15.0}}}

# runs (role, step) -> metadata.usage: (cost, input tokens, output tokens) and by role
USAGE = [
    ("a cost event", [("executor", {"emit": [("cost", {"usd": 0.5})]})], None,
     (0.5, 0, 0), {"executor": (0.5, 0, 0)}),
    ("the cost and tokens the CLI reports", [("reviewer", {"tokens": (1000, 200),
                                                           "cost_usd": 0.25})], None,
     (0.25, 1000, 200), {"reviewer": (0.25, 1000, 200)}),
    ("a cost event and the CLI's cost add up",
     [("executor", {"emit": [("cost", {"usd": 0.5})], "cost_usd": 0.25})], None,
     (0.75, 0, 0), {"executor": (0.75, 0, 0)}),
    ("tokens without a cost are priced", [("planner", {"tokens": (1_000_000, 100_000)})],
     PRICED, (4.5, 1_000_000, 100_000), {"planner": (4.5, 1_000_000, 100_000)}),
    ("each role its own, the session the sum",
     [("planner", {"tokens": (10, 5), "cost_usd": 0.01}),
      ("executor", {"tokens": (100, 50), "emit": [("cost", {"usd": 0.5})]}),
      ("executor", {"tokens": (100, 50), "cost_usd": 0.1})], None,
     (0.61, 210, 105), {"planner": (0.01, 10, 5), "executor": (0.6, 200, 100)}),
    ("nothing reported, nothing added", [("executor", {})], None, (0.0, 0, 0), {}),
]


@pytest.mark.parametrize("runs, data, total, by_role",
                         [row[1:] for row in USAGE], ids=[row[0] for row in USAGE])
def test_runner_usage(session, clock, runs, data, total, by_role):
    agent = RecordingAgent([{"role": role, **step} for role, step in runs])
    engine = engine_for(session, agent, clock=clock, config=config(data))
    for role, _ in runs:
        engine.runner.run(role, TASK_OF.get(role), [])
    engine.tracker.save()
    usage = metadata(session.dir)["usage"]
    assert (usage["cost_usd"], usage["input_tokens"], usage["output_tokens"]) == \
        pytest.approx(total)
    assert usage["agent_invocations"] == len(runs)
    assert sorted(usage["by_role"]) == sorted(by_role)
    for role, (cost, tokens_in, tokens_out) in by_role.items():
        mine = usage["by_role"][role]
        assert (mine["cost_usd"], mine["input_tokens"], mine["output_tokens"]) == \
            pytest.approx((cost, tokens_in, tokens_out))


def test_a_whole_session_in_process(session, clock):
    """The engine end to end with the recording agent: the gate's note reaches the
    executor's next run, the planner's last words complete the session."""
    agent = RecordingAgent([
        {"role": "planner", "emit": [("plan.ready", {"tasks": [{"id": "t1", "title": "T1"}]})]},
        {"role": "executor", "emit": [("build.done", "done!")], "tokens": (100, 20)},
        {"role": "planner", "text": "All done.\nLOOP_COMPLETE"},
    ], otherwise=SUCCEED)
    engine = engine_for(session, agent, clock=clock)
    assert engine.run() == 0
    assert [(p.role, p.task) for p in agent.played] == [
        ("planner", None), ("executor", "t1"), ("executor", "t1"), ("reviewer", "t1"),
        ("librarian", None), ("planner", None)]
    assert MISSING not in agent.prompts("executor")[0]
    assert MISSING in agent.prompts("executor")[1]
    assert agent.unplayed == []
    meta = metadata(session.dir)
    assert (meta["status"], meta["orchestrator"]["state"]) == ("completed", "COMPLETE")
    assert meta["usage"]["by_role"]["executor"]["input_tokens"] == 100
    assert [t["trigger"] for t in (e["payload"] for e in events(session.dir)
                                   if e["topic"] == "session.transition")] == [
        "plan_ready", "batch_done", "next_iteration", "objective_met"]


def test_a_state_reads_an_iteration_it_cannot_change(tmp_path):
    from datetime import datetime, timezone

    from ralph.session_store import Iteration
    from ralph.states.context import IterationView
    it = Iteration(str(tmp_path), 1)
    it.make_work_dirs()
    meta = it.start(datetime(2026, 1, 1, tzinfo=timezone.utc))
    meta.tasks_defined = [PlannedTask("t1", "one")]
    view = IterationView(it, meta)
    assert view.tasks_defined == (PlannedTask("t1", "one"),) and not view.planning_completed
    with pytest.raises(AttributeError):
        view.planning_completed = True
    with pytest.raises(AttributeError):
        view.tasks_defined.append(PlannedTask("t2", "two"))
