"""Seed 002's gates, with no bypass; thrashing and fallback; presets; cost; the bus
under concurrent emitters."""
from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from datetime import datetime, timezone

import pytest

from support import (DONE, EVIDENCE, QUALITY, base_env, events, metadata, only_session, plan,
                     progress_markers, prompts, ralph, recorded, script_agent, start,
                     write_config)
from ralph.engine.policy import gates
from ralph.engine.agents.approval_hooks import CLAUDE_SANDBOX


def run_scenario(workspace, steps, *args, config=None) -> tuple:
    """A session on a demo scenario; the fallback assessor is off unless `config` turns it
    on (these scenarios fail on purpose, and no human is there to ask)."""
    r = start(workspace, steps, objective="gate objective", sid="g", args=args, wait=True,
              config={"fallback": {"enabled": False}, **(config or {})})
    return r, only_session(workspace)


# --- the table, row by row (pure) ---

@pytest.mark.parametrize("topic, payload, expected", [
    ("build.done", EVIDENCE, "build.done"),
    ("build.done", {"tests": "pass", "lint": "pass", "typecheck": "pass", "audit": "pass",
                    "coverage": 85, "complexity": 2, "duplication": "pass"}, "build.done"),
    ("build.done", "tests: pass, lint: pass, typecheck: pass", "build.blocked"),
    ("build.done", EVIDENCE.replace("tests: pass", "tests: fail"), "build.blocked"),
    ("build.done", EVIDENCE.replace("coverage: 91", "coverage: 42"), "build.blocked"),
    ("build.done", EVIDENCE.replace("complexity: 3", "complexity: 14"), "build.blocked"),
    ("build.done", "\x1b[32mtests: pass\x1b[0m" + EVIDENCE[11:], "build.done"),
    ("build.done", None, "build.blocked"),
    ("review.done", "tests: pass, build: pass", "review.done"),
    ("review.done", {"status": "approved", "issues": 0}, "review.blocked"),
    ("review.done", "tests: pass", "review.blocked"),
    ("verify.passed", QUALITY, "verify.passed"),
    ("verify.passed", QUALITY.replace("quality.coverage: 95", "quality.coverage: 79"), "verify.failed"),
    ("verify.passed", QUALITY.replace("quality.mutation: 85", "quality.mutation: 69"), "verify.failed"),
    ("verify.passed", QUALITY.replace("quality.complexity: 4", "quality.complexity: 11"), "verify.failed"),
    ("verify.passed", QUALITY.replace("quality.audit: pass", "quality.audit: fail"), "verify.failed"),
    ("verify.passed", QUALITY + ", quality.specs: fail", "verify.failed"),
    ("verify.failed", "quality.tests: fail", "verify.failed"),
    ("feature.done", "anything", "feature.done"),
])
def test_gate_table(topic, payload, expected):
    gated, reason, _warning = gates.judge(topic, payload)
    assert gated == expected
    assert (reason is None) == (gated == topic)


def test_verify_failed_without_report_warns_and_passes():
    assert gates.judge("verify.failed", "it broke") == ("verify.failed", None,
                                                        "verify.failed without a quality report")


def test_completion_must_be_last_of_its_run():
    run = [{"seq": 1, "topic": "LOOP_COMPLETE", "payload": None},
           {"seq": 2, "topic": "note", "payload": None}]
    judged = gates.judge_run(run)
    assert "ignored" in judged[0]["gate"] and "gate" not in judged[1]
    assert "gate" not in gates.judge_run(run[::-1])[1]


def test_engine_injected_events_are_gated_too(workspace):
    """No bypass: what the engine publishes itself meets the same gate."""
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.session_store import create
    session = create(str(workspace), "obj", now=datetime.now(timezone.utc), session_id="inj")
    engine = Engine(session, Config(), out=io.StringIO())
    record = engine.publish("build.done", "")  # a default with no evidence
    assert record["topic"] == "build.blocked" and record["source"] == "engine"
    assert "typecheck: missing" in record["payload"]["reason"]
    assert engine.publish("review.done", {"status": "approved"})["topic"] == "review.blocked"
    assert engine.publish("task.resume", {"retry": 1})["topic"] == "task.resume"


# --- each row in a real session: the rewritten topic, and the reason the agent sees next ---

def test_build_done_without_evidence_comes_back_blocked(workspace):
    r, sd = run_scenario(workspace, [
        plan("t1"),
        {"role": "executor", "attempt": 1, "emit": [{"topic": "build.done", "payload": "done!"}]},
        *DONE])
    assert r.returncode == 0, r.stdout + r.stderr
    blocked = [e for e in events(sd) if e["topic"] == "build.blocked"]
    assert len(blocked) == 1 and blocked[0]["source"] == "engine"
    assert blocked[0]["payload"]["rewritten_from"] == "build.done"
    second = prompts(sd, "executor", "t1")[1]
    assert "build.blocked" in second and "lint: missing" in second
    assert progress_markers(sd) == {"1": {"t1": "x"}}


def test_review_done_without_literals_comes_back_blocked(workspace):
    r, sd = run_scenario(workspace, [
        plan("t1"),
        {"role": "reviewer", "attempt": 1, "emit": [{"topic": "review.done",
                                                    "json": {"status": "approved"}}]},
        *DONE])
    assert r.returncode == 0, r.stdout + r.stderr
    assert [e["payload"]["rewritten_from"] for e in events(sd)
            if e["topic"] == "review.blocked"] == ["review.done"]
    second = prompts(sd, "reviewer", "t1")[1]
    assert "review.blocked" in second and "'build: pass'" in second
    assert "approved" in (sd / "iterations/1/reviews/t1.md").read_text()


def test_verify_passed_rewritten_and_verify_failed_warned(workspace):
    r, sd = run_scenario(workspace, [
        plan("t1", "t2"),
        {"role": "executor", "task": "t1", "attempt": 1, "emit": [
            {"topic": "verify.passed", "payload": "quality.tests: pass, quality.coverage: 50"},
            {"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "executor", "task": "t2", "attempt": 1, "emit": [
            {"topic": "verify.failed", "payload": "it broke"},
            {"topic": "build.done", "payload": EVIDENCE}]},
        *DONE])
    assert r.returncode == 0, r.stdout + r.stderr
    evs = events(sd)
    failed = [e for e in evs if e["topic"] == "verify.failed" and e["source"] == "engine"]
    assert failed and "quality.coverage: 50 (needs >= 80)" in failed[0]["payload"]["reason"]
    notes = [e["payload"] for e in evs if e["topic"] == "gate.note"]
    assert notes == [{"warning": "verify.failed without a quality report",
                      "topic": "verify.failed", "original_seq": notes[0]["original_seq"]}]
    # the next executor prompt carries what the gate did to the previous run
    assert "quality.coverage: 50 (needs >= 80)" in prompts(sd, "executor", "t2")[0]
    assert progress_markers(sd) == {"1": {"t1": "x", "t2": "x"}}


# seed 002's docs reviewer: its instructions map the quality report to its own domain
DOCS_REVIEWER = {"roles": {"reviewer": {"instructions": (
    "You review documentation. Map accuracy to quality.tests, formatting to quality.lint, "
    "completeness to quality.audit, section coverage to quality.coverage, freshness to "
    "quality.mutation and readability to quality.complexity; publish verify.passed with "
    "them, or verify.failed with them and what needs fixing.")}}}


def test_a_non_code_reviewer_is_judged_by_the_verify_gate(workspace):
    """verify.passed approves once its report passes: a failing one comes back to the
    reviewer as verify.failed with the reason, and the next attempt is judged again."""
    r, sd = run_scenario(workspace, [
        plan("docs"),
        {"role": "reviewer", "attempt": 1, "emit": [{"topic": "verify.passed", "payload":
                                                    QUALITY.replace("coverage: 95", "coverage: 60")}]},
        {"role": "reviewer", "attempt": 2, "emit": [{"topic": "verify.passed",
                                                    "payload": QUALITY}]},
        *DONE], config=DOCS_REVIEWER)
    assert r.returncode == 0, r.stdout + r.stderr
    rewritten = [e["payload"] for e in events(sd) if e["topic"] == "verify.failed"]
    assert [p["rewritten_from"] for p in rewritten] == ["verify.passed"]
    first, second = prompts(sd, "reviewer", "docs")
    assert "You review documentation." in first
    assert "verify.failed" in second and "quality.coverage: 60 (needs >= 80)" in second
    review = (sd / "iterations/1/reviews/docs.md").read_text()
    assert "approved" in review and "quality.coverage: 95" in review
    assert progress_markers(sd) == {"1": {"docs": "x"}}


def test_a_reviewers_verify_failed_rejects_and_warns_without_a_report(workspace):
    """The reviewer's own verify.failed passes through the gate (with seed 002's warning
    when it carries no quality report) and rejects: the task goes back to planning."""
    r, sd = run_scenario(workspace, [
        plan("docs"),
        {"role": "reviewer", "iteration": 1, "emit": [
            {"topic": "verify.failed", "payload": "the install section is stale"}]},
        *DONE], config=DOCS_REVIEWER)
    assert r.returncode == 0, r.stdout + r.stderr
    evs = events(sd)
    assert [e["payload"]["warning"] for e in evs if e["topic"] == "gate.note"] == [
        "verify.failed without a quality report"]
    assert not [e for e in evs if e["topic"] == "verify.failed" and e["source"] == "engine"]
    assert len(prompts(sd, "reviewer", "docs")) == 1
    assert "rejected" in (sd / "iterations/1/reviews/docs.md").read_text()
    planning = prompts(sd, "planner", iteration=2)[0]
    assert "review.rejected" in planning and "the install section is stale" in planning


def test_three_failing_verify_reports_abandon_the_review(workspace):
    r, sd = run_scenario(workspace, [
        plan("docs"),
        {"role": "reviewer", "iteration": 1, "emit": [{"topic": "verify.passed",
                                                      "payload": "quality.tests: pass"}]},
        *DONE], config=DOCS_REVIEWER)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(prompts(sd, "reviewer", "docs")) == 3
    review = (sd / "iterations/1/reviews/docs.md").read_text()
    assert "rejected" in review and "abandoned after 3 consecutive verify.failed" in review


def test_completion_not_last_is_ignored_then_accepted(workspace):
    r, sd = run_scenario(workspace, [
        plan("t1"),
        {"role": "planner", "iteration": 2, "attempt": 1, "emit": [
            {"topic": "LOOP_COMPLETE"}, {"topic": "afterthought", "payload": "one more"}]},
        *DONE])
    assert r.returncode == 0, r.stdout + r.stderr
    assert any(e["topic"] == "gate.note" and "must be the last" in e["payload"]["ignored"]
               for e in events(sd))
    second = prompts(sd, "planner", iteration=2)[1]
    assert "task.resume" in second and "must be the last event of its run" in second


# --- thrashing and fallback ---

def test_three_blocked_builds_abandon_the_task(workspace):
    r, sd = run_scenario(workspace, [
        plan("bad", "good"),
        {"role": "executor", "task": "bad", "emit": [{"topic": "build.done", "payload": "trust me"}]},
        *DONE])
    assert r.returncode == 0, r.stdout + r.stderr
    assert progress_markers(sd) == {"1": {"bad": "F", "good": "x"}}
    assert "abandoned after 3 consecutive build.blocked" in (sd / "iterations/1/progress.md").read_text()
    assert len(prompts(sd, "executor", "bad")) == 3
    assert (sd / "iterations/1/reports/bad-report-r3.md").exists()


def test_three_empty_runs_fail_the_task(workspace):
    r, sd = run_scenario(workspace, [
        plan("quiet", "good"),
        {"role": "executor", "task": "quiet", "stdout": "thinking..."},
        *DONE])
    assert r.returncode == 0, r.stdout + r.stderr
    assert progress_markers(sd)["1"]["quiet"] == "F"
    resumes = [e for e in events(sd) if e["topic"] == "task.resume"]
    assert [e["payload"]["retry"] for e in resumes] == [1, 2, 3]
    assert len(prompts(sd, "executor", "quiet")) == 4
    assert "task.resume" in prompts(sd, "executor", "quiet")[1]


def test_rejected_review_reaches_the_next_planning_prompt(workspace):
    r, sd = run_scenario(workspace, [
        plan("t1"),
        {"role": "reviewer", "iteration": 1, "emit": [
            {"topic": "review.rejected", "payload": "the greeting is rude"}]},
        *DONE])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rejected" in (sd / "iterations/1/reviews/t1.md").read_text()
    planning = prompts(sd, "planner", iteration=2)[0]
    assert "review.rejected" in planning and "the greeting is rude" in planning and "t1" in planning


def test_planner_without_a_plan_pauses(workspace):
    r, sd = run_scenario(workspace, [{"role": "planner", "stdout": "hmm"}])
    assert r.returncode == 3, r.stdout + r.stderr
    assert "the planner produced no plan" in metadata(sd)["orchestrator"]["pause_reason"]


# --- presets, cost, max_cost_usd ---

STANDIN = textwrap.dedent("""\
    #!{python}
    import json, os, subprocess, sys
    name = os.path.basename(sys.argv[0])
    stdin = sys.stdin.read()
    prompt = stdin or sys.argv[-1]
    with open(os.environ["STANDIN_LOG"], "a") as f:
        f.write(json.dumps({{"name": name, "argv": sys.argv[1:-1] if not stdin else sys.argv[1:],
                            "prompt_head": prompt[:13], "stdin": bool(stdin)}}) + "\\n")
    def emit(*a):
        subprocess.run([sys.executable, "-m", "ralph.engine", "emit", *a], check=True,
                       stdout=subprocess.DEVNULL)
    role = os.environ["RALPH_ROLE"]
    if role == "planner":
        if os.environ["RALPH_ITERATION"] == "1":
            emit("plan.ready", "--json", '{{"tasks": [{{"id": "a", "title": "A"}}, {{"id": "b", "title": "B"}}]}}')
        else:
            print("LOOP_COMPLETE")
    elif role == "executor":
        emit("build.done", "{evidence}")
    elif role == "reviewer":
        emit("review.done", "tests: pass, build: pass")
    if name == "claude":
        print(json.dumps({{"type": "system", "subtype": "init"}}))
        print(json.dumps({{"type": "result", "subtype": "success", "is_error": False,
                          "total_cost_usd": 0.25, "result": "ok"}}))
    elif name != "claude" and role == "executor":
        emit("cost", "--json", '{{"usd": 0.5}}')
    """)


@pytest.fixture
def standins(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("claude", "codex", "gemini"):
        path = bin_dir / name
        path.write_text(STANDIN.format(python=sys.executable, evidence=EVIDENCE))
        path.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("backend, argv, stdin, cost", [
    # Claude Code's own sandbox, in the settings ralph passes it inline
    ("claude", ["--print", "--output-format", "stream-json", "--verbose", "--permission-mode",
                "acceptEdits", "--allowedTools", "Bash",
                "--settings", json.dumps({"sandbox": CLAUDE_SANDBOX})], True, 0.25 * 7),
    ("codex", ["exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write",
               "--color", "never", "-"], True, 0.5 * 2),
    ("gemini", ["--approval-mode", "yolo", "--skip-trust", "--output-format", "json", "-p",
                "Follow the instructions above."], True, 0.5 * 2),
])
def test_presets(workspace, standins, backend, argv, stdin, cost):
    """How each preset hands a run to its CLI (the real Claude Code, Codex and Gemini run
    in test_real_agents.py, with ralph's MCP server wired in; here a stand-in records what
    it was given, without it)."""
    log = workspace / "standin.jsonl"
    env = base_env(PATH=f"{standins}{os.pathsep}{os.environ['PATH']}", STANDIN_LOG=log)
    write_config(workspace, {"agent": {"mcp": False}})
    r = ralph(workspace, "session", "start", "preset objective", "--agent", backend, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # planner, 2 executors, 2 reviewers, librarian, planner
    assert len(calls) == 7 and {c["name"] for c in calls} == {backend}
    assert all(c["argv"] == argv and c["stdin"] is stdin for c in calls)
    assert all(c["prompt_head"] == "## OBJECTIVE\n" for c in calls)
    assert metadata(only_session(workspace))["usage"]["cost_usd"] == pytest.approx(cost)


def test_agent_auto_picks_the_first_installed(workspace, standins):
    (standins / "claude").unlink()
    log = workspace / "standin.jsonl"
    env = base_env(PATH=f"{standins}{os.pathsep}/usr/bin:/bin", STANDIN_LOG=log)
    r = ralph(workspace, "session", "start", "auto", "--agent", "auto", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {json.loads(x)["name"] for x in log.read_text().splitlines()} == {"codex"}


def test_max_cost_pauses_with_exit_5(workspace, standins):
    env = base_env(PATH=f"{standins}{os.pathsep}{os.environ['PATH']}",
                   STANDIN_LOG=workspace / "standin.jsonl")
    r = ralph(workspace, "session", "start", "costly", "--agent", "claude", "--id", "c",
              "--max-cost", "0.6", env=env)
    assert r.returncode == 5, r.stdout + r.stderr
    sd = only_session(workspace)
    meta = metadata(sd)
    assert "max_cost_usd" in meta["orchestrator"]["pause_reason"]
    assert meta["usage"]["cost_usd"] == pytest.approx(0.75)  # 3 runs at 0.25, then the limit
    r = ralph(workspace, "session", "resume", "c", "--max-cost", "10", env=env)
    assert r.returncode == 0, r.stdout + r.stderr


# --- the bus: 8 processes x 500 emits, from inside one run ---

EMITTER = """
import io, json, sys
from ralph.engine.tools.emit import main
worker, sys.stdout = int(sys.argv[1]), io.StringIO()
sys.exit(max(main(["load.test", "--json", json.dumps({"w": worker, "i": i})])
             for i in range(500)))
"""


def test_eight_emitters_lose_nothing_and_never_interleave(workspace):
    """Eight processes of one agent run emit 500 events each through the outbox while the
    engine takes them: every one lands on the bus once, whole, in each emitter's order,
    as the run's."""
    script_agent(workspace, f"""
        emitters = [subprocess.Popen([sys.executable, "-c", {EMITTER!r}, str(w)])
                    for w in range(8)]
        record("emitters", [p.wait(timeout=300) for p in emitters])
    """, {"fallback": {"enabled": False}})
    r = ralph(workspace, "session", "start", "obj", "--id", "bus", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert recorded(workspace, "emitters", "bus") == [0] * 8
    sd = only_session(workspace)
    raw = (sd / "events.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in raw]  # every line is one whole record
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert not [r for r in records if r["topic"] in ("emit.refused", "cli.refused")]
    loaded = [r for r in records if r["topic"] == "load.test"]
    assert len(loaded) == 4000
    assert {(r["source"], r["run"]) for r in loaded} == {
        ("executor", next(r["run"] for r in records if r["topic"] == "build.done"))}
    seen = {(r["payload"]["w"], r["payload"]["i"]) for r in loaded}
    assert seen == {(w, i) for w in range(8) for i in range(500)}
    for w in range(8):  # each emitter's own order is kept
        mine = [r["payload"]["i"] for r in loaded if r["payload"]["w"] == w]
        assert mine == list(range(500))
