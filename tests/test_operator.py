"""The operator's day (issue 13, the engine's side): what an operator who leaves a session
running and comes back must find — answers kept, no false alarms, queued stops honoured
at once, messages delivered, the Questioner run, and the console showing what to act on."""
from __future__ import annotations

import os
import signal
import time

import yaml

from support import (DONE, EVIDENCE, FAST, base_env, events, metadata, plan, prompts,
                     question_files, ralph, run_logs, session_dir, spawn, wait_for,
                     write_config)
from support import demo_config as demo   # a scenario and a ralph.yml playing it


def runs(sd) -> int:
    """Agent runs so far: each leaves its prompt in the logs."""
    return len(run_logs(sd, "*.prompt.md"))


def kill_engine_mid_run(workspace, sid: str, role_log: str):
    """Start, wait until `role_log` runs, SIGKILL the engine (its agent dies with it)."""
    proc = spawn(workspace, "session", "start", "operator objective", "--id", sid,
                 env=base_env())
    sd = session_dir(workspace, sid)
    wait_for(lambda: run_logs(sd, f"*-{role_log}.stdout"))
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    return sd


# --- 4. a queued ABORT or PAUSE on an interrupted session is read before any run ---

def test_queued_abort_on_an_interrupted_session_is_read_before_any_run(workspace):
    demo(workspace, [{"role": "planner", "sleep": 30}])
    sd = kill_engine_mid_run(workspace, "q4", "planner")
    assert metadata(sd)["status"] == "active"
    before = runs(sd)
    assert before > 0
    assert ralph(workspace, "signal", "abort", "enough", "--session", "q4").returncode == 0
    started = time.monotonic()
    r = ralph(workspace, "session", "resume", "q4", env=base_env(**FAST))
    assert r.returncode == 4, r.stdout + r.stderr
    assert runs(sd) == before, "an agent ran before the queued ABORT was read"
    assert time.monotonic() - started < 20


def test_queued_pause_on_an_interrupted_session_is_read_before_any_run(workspace):
    demo(workspace, [{"role": "planner", "sleep": 30}])
    sd = kill_engine_mid_run(workspace, "q4p", "planner")
    before = runs(sd)
    assert before > 0
    assert ralph(workspace, "signal", "pause", "hold on", "--session", "q4p").returncode == 0
    r = ralph(workspace, "session", "resume", "q4p", env=base_env(**FAST))
    assert r.returncode == 3, r.stdout + r.stderr
    assert runs(sd) == before
    assert metadata(sd)["orchestrator"]["pause_reason"] == "hold on"


# --- 6. the PAUSE signal's own message reaches the resumed run ---

def test_the_pause_message_reaches_the_resumed_run(workspace):
    demo(workspace, [plan("t1"), {"role": "executor", "attempt": 1, "sleep": 60},
                     {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
                     *DONE])
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "p6",
                 env=base_env())
    sd = session_dir(workspace, "p6")
    wait_for(lambda: prompts(sd, "executor", "t1"))
    assert ralph(workspace, "signal", "pause", "use the staging database from now on",
                 "--session", "p6").returncode == 0
    assert proc.wait(timeout=30) == 3
    r = ralph(workspace, "session", "resume", "p6", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    resumed = prompts(sd, "executor", "t1")[1]
    guidance = resumed.split("## ROBOT GUIDANCE")[1].split("## PENDING EVENTS")[0]
    assert "use the staging database from now on" in guidance
    later = prompts(sd, "reviewer", "t1") + prompts(sd, "planner", iteration=2)
    assert not any("use the staging database" in p for p in later), "delivered more than once"


# --- 2. no false fallback questions ---

def fallback_questions(sd):
    return [q for q in question_files(sd) if q["kind"] == "fallback"]


def test_failures_before_a_pause_raise_no_question_after_resume(workspace):
    """Four empty planner runs pause the session; after the operator's resume the planner
    succeeds: no "4 errors" question with a confidence of 100 %."""
    demo(workspace, [{"role": "planner", "iteration": 1, "attempt": n} for n in (1, 2, 3, 4)]
         + [plan("t1"), *DONE], {"RObot": {"timeout_seconds": 5}})
    r = ralph(workspace, "session", "start", "operator objective", "--id", "f2",
              env=base_env(**FAST))
    assert r.returncode == 3 and "no plan" in r.stdout, r.stdout + r.stderr
    sd = session_dir(workspace, "f2")
    asked_before = len(fallback_questions(sd))   # while it failed, it may ask: that is right
    r = ralph(workspace, "session", "resume", "f2", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    resumed = next(e["seq"] for e in events(sd) if e["topic"] == "session.transition"
                   and e["payload"]["trigger"] == "resume")
    assert not [e for e in events(sd) if e["topic"] == "fallback.triggered"
                and e["seq"] > resumed]
    assert len(fallback_questions(sd)) == asked_before


def test_a_librarian_that_stages_nothing_is_no_error(workspace):
    demo(workspace, [plan("t1"), *DONE], {"fallback": {"error_count_threshold": 1},
                                           "RObot": {"timeout_seconds": 5}})
    r = ralph(workspace, "session", "start", "operator objective", "--id", "f2l",
              env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    sd = session_dir(workspace, "f2l")
    assert not fallback_questions(sd), [q["text"] for q in fallback_questions(sd)]


def test_a_failure_of_another_unit_does_not_add_up(workspace):
    """One failed attempt of t1, then of t2, then of t3: no unit failed twice in a row."""
    steps = [plan("t1", "t2", "t3")]
    steps += [{"role": "executor", "task": t, "attempt": 1, "emit": [
        {"topic": "build.blocked", "payload": "flaky"}]} for t in ("t1", "t2", "t3")]
    demo(workspace, steps + [*DONE], {"fallback": {"error_count_threshold": 2},
                                      "RObot": {"timeout_seconds": 5}})
    r = ralph(workspace, "session", "start", "operator objective", "--id", "f2u",
              env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert not fallback_questions(session_dir(workspace, "f2u"))


def test_an_error_question_shows_a_confidence_that_agrees_with_it(workspace):
    demo(workspace, [plan("t1", "t2"), {"role": "executor", "task": "t1", "emit": [
        {"topic": "build.done", "payload": "trust me"}]}, *DONE],
         {"RObot": {"timeout_seconds": 120}})
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "f2c",
                 env=base_env(**FAST))
    sd = session_dir(workspace, "f2c")
    q = wait_for(lambda: next(iter(fallback_questions(sd)), None) if sd.exists() else None)
    assert "3 consecutive failures of executor t1" in q["text"], q["text"]
    shown = float(q["text"].split("Confidence level: ")[1].split("%")[0]) / 100
    assert shown < 0.7, q["text"]   # below confidence_threshold: it needs help, as it says
    assert len(prompts(sd, "executor", "t1")) == 3   # asked before anything else runs
    ralph(workspace, "session", "answer", "f2c", "Continue autonomously")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err


# --- 1. an answer to a question whose asker is gone reaches the next run of its unit ---

ASKING = [plan("t1"),
          {"role": "executor", "task": "t1", "attempt": 1,
           "ask": {"question": "Which port should it listen on?", "timeout": 300}},
          {"role": "executor", "task": "t1", "emit": [{"topic": "build.done",
                                                       "payload": EVIDENCE}]},
          *DONE]


def question_file(sd, qid):
    return yaml.safe_load((sd / "questions" / f"{qid}.yaml").read_text())


def in_run_question(sd):
    def find():
        qs = question_files(sd) if sd.exists() else []
        return next((q["id"] for q in qs if q["kind"] == "in_run" and q["status"] == "pending"),
                    None)
    return wait_for(find)


def pending_events(prompt: str) -> str:
    return prompt.split("## PENDING EVENTS")[1].split("## ROLE")[0]


def test_an_answer_given_while_paused_reaches_the_next_run_of_the_asker(workspace):
    demo(workspace, ASKING)
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "a1",
                 env=base_env())
    sd = session_dir(workspace, "a1")
    qid = in_run_question(sd)
    assert ralph(workspace, "signal", "pause", "", "--session", "a1").returncode == 0
    assert proc.wait(timeout=30) == 3
    assert question_file(sd, qid)["status"] == "pending", "the question was dropped"
    r = ralph(workspace, "session", "answer", "a1", "8080")
    assert r.returncode == 0, r.stderr
    assert "next run of executor t1" in r.stdout, r.stdout
    r = ralph(workspace, "session", "resume", "a1", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    second = pending_events(prompts(sd, "executor", "t1")[1])
    assert "Which port should it listen on?" in second and "8080" in second
    assert question_file(sd, qid)["status"] == "answered"
    assert not any("8080" in p for p in prompts(sd, "reviewer", "t1"))


def test_an_answer_after_the_engine_died_reaches_the_next_run_of_the_asker(workspace):
    demo(workspace, ASKING)
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "a1k",
                 env=base_env())
    sd = session_dir(workspace, "a1k")
    qid = in_run_question(sd)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    r = ralph(workspace, "session", "answer", "a1k", "9090")
    assert r.returncode == 0 and "when the session is resumed" in r.stdout, r.stdout
    r = ralph(workspace, "session", "resume", "a1k", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    runs_of_t1 = prompts(sd, "executor", "t1")
    assert "9090" in pending_events(runs_of_t1[-1])
    assert question_file(sd, qid)["status"] == "answered"


def test_answer_says_what_happens_to_a_waiting_agents_question(workspace):
    demo(workspace, ASKING)
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "a1w",
                 env=base_env())
    sd = session_dir(workspace, "a1w")
    in_run_question(sd)
    r = ralph(workspace, "session", "answer", "a1w", "7070")
    assert r.returncode == 0 and "the waiting executor t1 gets it now" in r.stdout, r.stdout
    assert proc.wait(timeout=60) == 0


# --- 7. the Questioner: off by default; switched on, it asks before the Planner plans ---

def test_the_questioner_asks_before_planning_and_the_planner_gets_the_answer(workspace):
    demo(workspace, [{"role": "questioner", "iteration": 1,
                      "ask": {"question": "Which language?", "options": ["Rust", "Go"],
                              "timeout": 120}},
                     plan("t1"), *DONE], {"roles": {"questioner": {"enabled": True}}})
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "q7",
                 env=base_env(**FAST))
    sd = session_dir(workspace, "q7")
    in_run_question(sd)
    assert not prompts(sd, "planner"), "the planner ran before the questioner's answer"
    assert ralph(workspace, "session", "answer", "q7", "Rust").returncode == 0
    assert proc.wait(timeout=60) == 0
    planner = pending_events(prompts(sd, "planner")[0])
    assert "Which language?" in planner and "Rust" in planner
    assert len(prompts(sd, "questioner")) == 1
    assert len(prompts(sd, "questioner", iteration=2)) == 1   # at every PLANNING


def test_the_questioner_is_off_by_default(workspace):
    demo(workspace, [plan("t1"), *DONE])
    r = ralph(workspace, "session", "start", "operator objective", "--id", "q7o",
              env=base_env(**FAST))
    assert r.returncode == 0, r.stderr
    sd = session_dir(workspace, "q7o")
    assert run_logs(sd, "*-planner.prompt.md") and not run_logs(sd, "*questioner*")


def test_only_the_questioner_can_be_switched_off(workspace):
    write_config(workspace, {"roles": {"planner": {"enabled": False}}})
    r = ralph(workspace, "validate")
    assert r.returncode == 2 and "$.roles.planner.enabled" in r.stderr, r.stderr


# --- 10. the console shows what the operator must act on ---

class Lines:
    """The engine's stdout, read as it comes."""

    def __init__(self, proc):
        import threading
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str) -> str:
        wait_for(lambda: needle in self.text())
        return self.text()


def test_an_in_run_question_is_shown_in_full_while_its_agent_waits(workspace):
    demo(workspace, [plan("t1"),
                     {"role": "executor", "task": "t1", "attempt": 1,
                      "emit": [{"topic": "human.progress", "payload": "halfway through t1"}],
                      "ask": {"question": "Which port?\nThe spec names two.",
                              "options": ["8080", "9090"], "default": "8080",
                              "timeout": 120}},
                     {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
                     *DONE])
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "c10",
                 env=base_env(**FAST))
    out = Lines(proc)
    sd = session_dir(workspace, "c10")
    qid = in_run_question(sd)
    shown = out.wait_for(f"--question {qid}")
    assert "Which port?" in shown and "The spec names two." in shown
    assert "1. 8080" in shown and "2. 9090" in shown and "deadline" in shown
    assert f'ralph session answer c10 "..." --question {qid}' in shown
    assert ralph(workspace, "session", "answer", "c10", "9090").returncode == 0
    # the demo agent emits after its ask: the note is shown once it lands
    assert "[executor t1] progress: halfway through t1" in out.wait_for("halfway")
    assert proc.wait(timeout=60) == 0


def test_a_fallback_question_is_shown_whole(workspace):
    demo(workspace, [plan("t1", "t2"), {"role": "executor", "task": "t1", "emit": [
        {"topic": "build.done", "payload": "trust me"}]}, *DONE],
         {"RObot": {"timeout_seconds": 120}})
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "c10f",
                 env=base_env(**FAST))
    out = Lines(proc)
    shown = out.wait_for("--question")
    for part in ("Issue: Error Recovery", "What I need:", "3. Pause the session"):
        assert part in shown, shown
    assert ralph(workspace, "session", "answer", "c10f", "1").returncode == 0 or \
        ralph(workspace, "session", "answer", "c10f", "Continue autonomously").returncode == 0
    assert proc.wait(timeout=60) == 0


def test_resuming_into_a_pending_question_says_what_it_waits_for(workspace):
    demo(workspace, [plan("t1"), {"role": "executor", "task": "t1", "attempt": 1, "emit": [
        {"topic": "human.interact", "payload": "May I delete the old tables?"}]},
        {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]}, *DONE],
         {"RObot": {"timeout_seconds": 120}})
    proc = spawn(workspace, "session", "start", "operator objective", "--id", "c10r",
                 env=base_env(**FAST))
    sd = session_dir(workspace, "c10r")
    wait_for(lambda: metadata(sd)["pending_question"] if sd.exists() else None)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    proc = spawn(workspace, "session", "resume", "c10r", env=base_env(**FAST))
    out = Lines(proc)
    shown = out.wait_for("--question")
    assert "May I delete the old tables?" in shown and "ralph session answer c10r" in shown
    assert ralph(workspace, "session", "answer", "c10r", "yes").returncode == 0
    assert proc.wait(timeout=60) == 0
