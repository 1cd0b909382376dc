"""Blockers (seed 003), the confidence assessor and the conversation-driven fallback
(seed 004), and the priority STEER."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from support import (DONE, EVIDENCE, events, metadata, only_session, plan, progress_markers,
                     prompts, question_files, ralph, recorded, run_logs, script_agent,
                     session_dir, spawn, wait_for, write_config, write_scenario)
from support import start as start_demo
from ralph.engine.humans import fallback
from ralph.engine.config import Fallback
from ralph.session_store import Observations, TaskCounts

NOW = datetime(2026, 11, 22, tzinfo=timezone.utc)
FACTORS = list(fallback.WEIGHTS)


# --- the assessor's arithmetic ---

@pytest.mark.parametrize("scores, expected", [
    ({}, 1.0),
    ({"task_clarity": 0.0}, 0.75),
    ({"task_clarity": 0.0, "solution_certainty": 0.8}, 0.69),
    ({"task_clarity": 0.5, "solution_certainty": 0.5, "verification_success": 0.5,
      "precedent_match": 0.5, "resource_availability": 0.5}, 0.5),
    ({k: 0.0 for k in FACTORS}, 0.0),
    ({"solution_certainty": 0.0, "resource_availability": 0.0}, 0.6),
])
def test_confidence_by_hand(scores, expected):
    factors = {k: scores.get(k, 1.0) for k in FACTORS}
    assert fallback.confidence(factors) == pytest.approx(expected)


unit = st.floats(min_value=0, max_value=1, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({k: unit for k in FACTORS}), st.sampled_from(FACTORS), unit)
def test_confidence_is_bounded_and_monotone(factors, factor, higher):
    score = fallback.confidence(factors)
    assert 0.0 <= score <= 1.0
    raised = dict(factors, **{factor: max(factors[factor], higher)})
    assert fallback.confidence(raised) >= score - 1e-12


@settings(max_examples=100, deadline=None)
@given(st.fixed_dictionaries({k: st.floats(min_value=-5, max_value=5, allow_nan=False)
                              for k in FACTORS}))
def test_confidence_is_clamped(factors):
    assert 0.0 <= fallback.confidence(factors) <= 1.0


def test_engine_observations_take_precedence_over_reports():
    obs = Observations(reported={"verification_success": 1.0, "precedent_match": 1.0},
                       gates_passed=1, gates_failed=3, blockers_in_iteration=1)
    factors = fallback.factors_of(obs, TaskCounts(total=4, completed=1, failed=3))
    assert factors["verification_success"] == 0.25
    assert factors["precedent_match"] == 0.25
    assert factors["resource_availability"] == 0.5


@pytest.mark.parametrize("obs, runtime, kind, why", [
    (Observations(reported={"task_clarity": 0.0, "solution_certainty": 0.8}), 0,
     "clarification", "low confidence"),
    (Observations(errors=3, error_unit="1/executor/t1"), 0, "error_recovery",
     "3 consecutive failures of executor t1"),
    (Observations(), 31 * 60, "guidance", "no task completed for 31.0 minutes"),
    (Observations(reported={"complexity": 9}), 0, "escalation", "complexity 9"),
    (Observations(reported={"risk": 0.9}), 0, "approval", "risk 0.90"),
    (Observations(approaches=["a", "b", "c", "d"]), 0, "guidance", "4 possible approaches"),
    (Observations(reported={"ambiguity": 0.8}), 0, "clarification", "ambiguity 0.80"),
    (Observations(missing=["the API key"]), 0, "clarification", "missing information"),
    (Observations(), 0, None, None),
])
def test_each_trigger_and_its_fallback_type(obs, runtime, kind, why):
    a = fallback.assess(obs, TaskCounts(), runtime, Fallback(), NOW)
    assert a.fallback_type == kind
    if why:
        assert any(why in t for t in a.triggers), a.triggers
    else:
        assert a.triggers == []


# --- triggers in real sessions: the structured question and the captured work state ---

SECTIONS = ("Current task:", "Issue", "Confidence level", "Progress so far:",
            "What I need:", "Options I've considered:")
WORK_STATE = ("## Current step", "## Completed steps", "## Changed files",
              "## Latest test results", "## Decisions", "## Next steps",
              "## Confidence breakdown")


def start(workspace, steps, config=None, sid="fb"):
    return start_demo(workspace, steps, objective="fallback objective", sid=sid,
                      config={"RObot": {"timeout_seconds": 120}, **(config or {})})


def reporting(payload, **extra):
    """An executor step for t1 that reports confidence and builds."""
    return {"role": "executor", "task": "t1", "attempt": 1, **extra, "emit": [
        {"topic": "confidence", "json": payload}, {"topic": "build.done", "payload": EVIDENCE}]}


def wait_question(sd, kind="fallback"):
    return wait_for(lambda: next((q for q in question_files(sd) if q["kind"] == kind
                                  and q["status"] == "pending"), None) if sd.exists() else None,
                    timeout=60)


@pytest.mark.parametrize("report, config, issue, options", [
    ({"task_clarity": 0.0, "solution_certainty": 0.8}, {}, "Clarification", None),
    ({"complexity": 9}, {}, "Escalation", None),
    ({"risk": 0.95}, {}, "Approval", None),
    ({"approaches": ["REST", "GraphQL", "gRPC", "SOAP"]}, {}, "Guidance",
     ["REST", "GraphQL", "gRPC", "SOAP"]),
    ({"ambiguity": 0.9}, {}, "Clarification", None),
    ({"missing": ["the staging URL"]}, {}, "Clarification", None),
])
def test_trigger_asks_the_structured_question(workspace, report, config, issue, options):
    proc = start(workspace, [plan("t1"), reporting(report), *DONE], config)
    sd = session_dir(workspace, "fb")
    q = wait_question(sd)
    for section in SECTIONS:
        assert section in q["text"], (section, q["text"])
    assert f"Issue: {issue}" in q["text"]
    assert q["options"] == (options or [fallback.CONTINUE, fallback.COLLABORATE, fallback.PAUSE])
    work_state = (sd / "iterations/1/work-state-1.md").read_text()
    for section in WORK_STATE:
        assert section in work_state
    assert "| **confidence** |" in work_state
    status = json.loads(ralph(workspace, "session", "status", "fb", "--json").stdout)
    assert status["assessment"]["fallback_type"] == q["fallback_type"]
    assert status["assessment"]["triggers"]
    assert "confidence" in ralph(workspace, "session", "status", "fb").stdout
    assert ralph(workspace, "session", "answer", "fb", "Use the simplest thing").returncode == 0
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "Use the simplest thing" in prompts(sd, "reviewer", "t1")[0]  # the answer goes on


def test_errors_trigger_error_recovery(workspace):
    proc = start(workspace, [plan("t1", "t2"),
                             {"role": "executor", "task": "t1", "emit": [
                                 {"topic": "build.done", "payload": "trust me"}]}, *DONE])
    sd = session_dir(workspace, "fb")
    q = wait_question(sd)
    assert "Issue: Error Recovery" in q["text"] and "3 consecutive failures of executor t1" in q["text"]
    ralph(workspace, "session", "answer", "fb", fallback.CONTINUE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err


def test_answer_above_autonomous_continue_goes_back_to_autonomous(workspace):
    proc = start(workspace, [{"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready",
                 "json": {"tasks": [{"id": "t1", "title": "A"}, {"id": "t2", "title": "B", "batch": 2}]}}]},
                 reporting({"task_clarity": 0.0, "solution_certainty": 0.8}), *DONE])
    sd = session_dir(workspace, "fb")
    q = wait_question(sd)
    assert q["fallback_type"] == "clarification"
    ralph(workspace, "session", "answer", "fb", "It is a greeting CLI")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    resolved = [e["payload"] for e in events(sd) if e["topic"] == "fallback.resolved"]
    assert resolved[0]["mode"] == "autonomous" and resolved[0]["confidence"] > 0.8
    assert not [q for q in question_files(sd) if q["kind"] == "checkin"]


def test_answer_in_the_middle_band_stays_collaborative(workspace):
    proc = start(workspace, [{"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready",
                 "json": {"tasks": [{"id": "t1", "title": "A"}, {"id": "t2", "title": "B", "batch": 2}]}}]},
                 reporting({"task_clarity": 0.0, "solution_certainty": 0.0}), *DONE])
    sd = session_dir(workspace, "fb")
    q = wait_question(sd)
    assert q["fallback_type"] == "guidance"
    ralph(workspace, "session", "answer", "fb", "Go with the CLI approach")
    checkin = wait_question(sd, kind="checkin")   # asked before the next task starts
    assert "t2" in checkin["text"] and checkin["context"]["task"] == "t2"
    assert not prompts(sd, "executor", "t2")      # it waits for the human
    ralph(workspace, "session", "answer", "fb", "go")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    resolved = [e["payload"] for e in events(sd) if e["topic"] == "fallback.resolved"]
    assert resolved[0]["mode"] == "collaborative"
    assert 0.3 <= resolved[0]["confidence"] <= 0.8
    assert metadata(sd)["fallback"]["mode"] == "collaborative"


def test_answer_below_full_human_control_pauses(workspace):
    steps = [{"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
                 "tasks": [{"id": "t1", "title": "A"}, {"id": "t2", "title": "B", "batch": 2}]}}]},
             {"role": "executor", "task": "t1", "emit": [
                 {"topic": "confidence", "json": {"task_clarity": 0, "solution_certainty": 0,
                                                  "resource_availability": 0}},
                 {"topic": "build.done", "payload": "trust me"}]},
             *DONE]
    scenario = write_scenario(workspace, steps)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    r = ralph(workspace, "session", "start", "obj", "--id", "fb")  # batch 1 all failed: pause
    assert r.returncode == 3, r.stdout + r.stderr
    sd = only_session(workspace)
    proc = spawn(workspace, "session", "resume", "fb")
    q = wait_question(sd)
    assert q["fallback_type"] == "error_recovery"
    ralph(workspace, "session", "answer", "fb", "try again")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, out + err
    meta = metadata(sd)
    assert "below 0.3" in meta["orchestrator"]["pause_reason"]
    assert meta["fallback"]["last"]["confidence"] < 0.3


# --- blockers ---

def blocker(cause: str) -> dict:
    return {"type": "blocker", "timestamp": "2026-11-22T10:00:00Z", "project": "demo",
            "issue": 7, "attempting": "run the integration tests", "cause": cause,
            "attempted_resolution": ["searched the workspace", "tried the mock"],
            "interpretation": "Cannot proceed without the credential."}


def test_the_same_blocker_three_times_pauses_with_the_trace(workspace):
    causes = ["API key missing", "api key  MISSING!", "Api key missing."]
    steps = [plan("t1", "t2", "t3"),
             *[{"role": "executor", "task": f"t{i + 1}", "emit": [
                 {"topic": "blocker", "json": blocker(c)}, {"topic": "build.done", "payload": EVIDENCE}]}
               for i, c in enumerate(causes)], *DONE]
    scenario = write_scenario(workspace, steps)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)},
                             "blockers": {"trace_path": "graph/events.jsonl"},
                             "fallback": {"enabled": False}})
    r = ralph(workspace, "session", "start", "obj", "--id", "b")
    assert r.returncode == 3, r.stdout + r.stderr
    sd = only_session(workspace)
    reason = metadata(sd)["orchestrator"]["pause_reason"]
    assert reason.startswith("the same blocker 3 times") and "run the integration tests" in reason
    trace = [json.loads(x) for x in (workspace / "graph/events.jsonl").read_text().splitlines()]
    assert len(trace) == 3 and {t["session"] for t in trace} == {"b"}
    assert [e["topic"] for e in events(sd)].count("blocker") == 3
    assert "Blockers (last resort)" in prompts(sd, "executor", "t1")[0]


def test_each_blocker_is_counted_once_by_the_bus_and_an_agents_count_record_counts_nothing(
        session):
    """The count is the engine's blocker.counted records (each through the store's once,
    keyed by the blocker's seq): a new engine after a crash never counts one again."""
    from types import SimpleNamespace

    from ralph.engine.humans.blockers import COUNTED, BlockerLedger
    from ralph.states import Trigger
    settings, seen = SimpleNamespace(trace_path=None, repeat_limit=2), Observations()

    def ledger():   # a new engine's
        return BlockerLedger(session, settings, lambda: seen)
    session.append_event(COUNTED, {"cause": "api key missing", "seq": 1, "count": 9},
                         source="executor")   # an agent's words, not the engine's count
    first = session.append_event("blocker", blocker("API key missing"), source="executor")
    assert ledger().observe([first]) is None and seen.blockers_in_iteration == 1
    assert ledger().observe([first]) is None and seen.blockers_in_iteration == 1
    second = session.append_event("blocker", blocker("api key MISSING!"), source="executor")
    decision = ledger().observe([second])
    assert decision.trigger is Trigger.PAUSE and "the same blocker 2 times" in decision.reason
    assert [r["payload"]["count"] for r in events(session.dir)
            if str(r.get("once")).startswith(COUNTED)] == [1, 2]


BAD_BLOCKERS = [({**blocker("x"), "cause": 3}, "$.cause"),
                ({k: v for k, v in blocker("x").items() if k != "attempting"}, "$.attempting"),
                ({**blocker("x"), "severity": "high"}, "$.severity"),
                ({**blocker("x"), "timestamp": "yesterday"}, "$.timestamp"),
                ({**blocker("x"), "attempted_resolution": ["ok", 1]},
                 "$.attempted_resolution[1]")]


def test_a_bad_blocker_is_refused_with_its_path(workspace):
    """`ralph emit blocker` refuses a bad report in one line naming the field; the engine
    refuses it too when an agent writes it to the outbox itself, past the CLI."""
    payloads = [json.dumps(p) for p, _ in BAD_BLOCKERS]
    script_agent(workspace, f"""
        from ralph.engine.tools.emit import run_id
        from ralph.session_store import outbox
        record("bad", [ralph("emit", "blocker", "--json", p) for p in {payloads!r}])
        record("good", ralph("emit", "blocker", "--json", {json.dumps(blocker("x"))!r}))
        record("confidence", ralph("emit", "confidence", "--json", '{{"task_clarity": 3}}'))
        outbox.post(os.environ["RALPH_SESSION_DIR"], {{
            "kind": "event", "id": outbox.new_request_id(), "run": run_id(),
            "topic": "blocker", "payload": json.loads({payloads[0]!r})}})
    """, {"fallback": {"enabled": False}})
    r = ralph(workspace, "session", "start", "obj", "--id", "b")
    assert r.returncode == 0, r.stdout + r.stderr
    for r, (_, path) in zip(recorded(workspace, "bad", "b"), BAD_BLOCKERS):
        assert r["code"] == 2 and path in r["err"], (path, r["err"])
        assert len(r["err"].strip().splitlines()) == 1, r["err"]
    assert recorded(workspace, "good", "b")["code"] == 0
    r = recorded(workspace, "confidence", "b")
    assert r["code"] == 2 and "$.task_clarity" in r["err"]
    evs = events(only_session(workspace))
    assert [(e["payload"], e["source"]) for e in evs if e["topic"] == "blocker"] == [
        (blocker("x"), "executor")]
    assert len([e for e in evs if e["topic"] == "cli.refused"]) == len(BAD_BLOCKERS) + 1
    past_the_cli = [e["payload"] for e in evs if e["topic"] == "emit.refused"]
    assert len(past_the_cli) == 1 and past_the_cli[0]["topic"] == "blocker"
    assert "$.cause" in past_the_cli[0]["why"], past_the_cli


# --- user control: the priority STEER ---

def test_priority_steer_interrupts_and_reruns_with_the_message(workspace):
    steps = [plan("t1"),
             {"role": "executor", "task": "t1", "attempt": 1, "sleep": 60},
             {"role": "executor", "task": "t1", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
             *DONE]
    proc = start(workspace, steps, {"fallback": {"enabled": False}})
    sd = session_dir(workspace, "fb")
    # underway: the demo agent's first line (its conversation) is in its log
    wait_for(lambda: [p for p in run_logs(sd, "*-executor-t1.stdout") if p.stat().st_size],
             timeout=30)
    started = time.monotonic()
    r = ralph(workspace, "signal", "steer", "Use Firefox only", "--priority", "--session", "fb")
    assert r.returncode == 0
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert time.monotonic() - started < 20   # not the 60 s the first run would have taken
    second = prompts(sd, "executor", "t1")[1]
    assert "## ROBOT GUIDANCE" in second and "Use Firefox only" in second
    handled = [yaml.safe_load(p.read_text()) for p in (sd / "signals/processed").glob("*.yaml")]
    assert handled[0]["priority"] is True
    assert "interrupted the running agent" in handled[0]["handling_metadata"]["action_taken"]
    assert progress_markers(sd) == {"1": {"t1": "x"}}
    r = ralph(workspace, "signal", "info", "x", "--priority", "--session", "fb")
    assert r.returncode == 2
