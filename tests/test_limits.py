"""Usage limits of the agent's CLI are waited out, never spent (DESIGN §10, round 3).

The demo agent says a limit as a real CLI does (a JSON line with its reset, exit 1) until
the instant its scenario names; the engine reads it through the demo's preset, as it reads
Claude Code's `rate_limit_event` or Codex's usage-limit error (those, with the real CLIs,
are in test_real_limits.py). Every test here runs the real `ralph` in a subprocess.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from support import (DONE, EVIDENCE, RALPH, base_env, demo_config, events, finish, metadata,
                     only_session, plan, session_dir, spawn, start, topics, wait_for,
                     work_dir)


def limited_executor(until: float, **limit) -> dict:
    """The executor's step: at its usage limit until `until` (epoch seconds), then done."""
    return {"role": "executor", "limit": {"until": until, **limit},
            "emit": [{"topic": "build.done", "payload": EVIDENCE}]}


def started(ws):
    """The control plane of session `s`, once its metadata is written."""
    sd = session_dir(ws, "s")
    wait_for(lambda: (sd / "metadata.yaml").exists(), timeout=30)
    return sd


def waiting_session(ws, reset: float):
    """A session whose executor is at its limit until `reset`, started: (its process, its
    control plane, the wait it recorded). The executor's run after the wait (a
    continued conversation) builds t1."""
    proc = start(ws, [plan("t1"),
                      {"role": "executor", "resumed": True,
                       "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
                      {"role": "executor", "limit": {"until": reset}}, *DONE])
    sd = started(ws)
    return proc, sd, wait_for(lambda: metadata(sd).get("limit_wait"), timeout=30)


def recorded_attempts(ws, sid: str, task: str = "t1") -> list[str]:
    """The outcomes the engine recorded for the task's attempts (one per attempt spent)."""
    from ralph.session_store import load
    return load(str(ws), sid).iteration(1).load().task_progress(task).attempts


def test_a_limit_is_waited_out_and_the_same_step_retried_with_nothing_spent(tmp_path):
    """The one real wait of a limit (10 s from the start): its wiring through the real
    `ralph` and its agent (what status and list say meanwhile, the conversation continued
    after it). The wait's logic (kill -9 during it, a pause, resume --now, no reset said,
    the cap, on_limit: pause) is on the frozen clock: test_deadlines.py."""
    ws = tmp_path
    # the start and the planner's run come first: the wait left is what a loaded machine
    # needs to ask the three views below at once
    reset = time.time() + 10
    proc, sd, waiting = waiting_session(ws, reset)
    # status and list say it, with the agent and the time
    views = [spawn(ws, *args) for args in (("session", "status", "s"), ("session", "list"),
                                           ("session", "status", "s", "--json"))]
    status, listed, as_json = (finish(v)[1] for v in views)
    assert "waiting for demo's usage limit until" in status, status
    assert "the executor t1 is retried then" in status
    assert "waiting for demo's usage limit until" in listed, listed
    view = json.loads(as_json)
    assert view["limit_wait"]["agent"] == "demo" and view["limit_wait"]["task"] == "t1"
    assert abs(datetime.fromisoformat(waiting["until"]).timestamp() - reset) < 0.01
    code, out, err = finish(proc, timeout=60)
    assert code == 0, out + err
    assert time.time() >= reset
    # nothing was spent on it: one attempt (done), no retry event, no error, no question
    assert recorded_attempts(ws, "s") == ["done"]
    t = topics(sd)
    assert t.count("limit.reached") == 1 and t.count("limit.over") == 1
    assert "task.resume" not in t and "fallback.triggered" not in t
    m = metadata(sd)
    assert m["fallback"]["errors"] == 0 and m["limit_wait"] is None
    assert m["status"] == "completed"
    # waited (that the wait is no work, the runtime not counting it: test_deadlines.py,
    # where runs take no time and a loaded machine's slow runs cannot outlast the wait)
    waited = next(e for e in events(sd) if e["topic"] == "limit.over")["payload"]
    assert waited["waited_seconds"] >= 1.5
    # the retried run continued the agent's conversation; a new task starts afresh (the
    # reviewer's run is a conversation of its own)
    logs = sorted((work_dir(sd) / "iterations" / "1" / "logs").glob("*-executor-t1.stdout"))
    ids = [json.loads(p.read_text().splitlines()[0])["id"] for p in logs]
    assert len(ids) == 2 and ids[0] == ids[1]
    reviewer = next((work_dir(sd) / "iterations" / "1" / "logs").glob("*-reviewer-t1.stdout"))
    assert json.loads(reviewer.read_text().splitlines()[0])["id"] != ids[0]


def test_on_limit_switch_runs_the_step_on_the_fallback_until_the_reset(tmp_path):
    ws = tmp_path
    fallback_script = ws / "fallback.yaml"
    fallback_script.write_text(json.dumps({"steps": [
        {"role": "executor", "emit": [{"topic": "build.done",
                                        "payload": EVIDENCE + ", by: fallback"}]}, *DONE]}))
    steps = [plan("t1", "t2"), limited_executor(time.time() + 3600), *DONE]
    config = {"agent": {"on_limit": "switch", "limit_fallback": {
        "backend": "command", "command": [sys.executable, "-P", "-m", "ralph.engine.demo_agent",
                                          "--script", str(fallback_script)]}}}
    done = start(ws, steps, config=config, wait=True)
    sd = only_session(ws)
    assert done.returncode == 0, done.stdout + done.stderr
    built = [e["payload"] for e in events(sd) if e["topic"] == "build.done"]
    assert built and all("by: fallback" in b for b in built), built
    reached = [e["payload"] for e in events(sd) if e["topic"] == "limit.reached"]
    assert reached[0]["action"] == "switch" and reached[0]["switched_to"] == "command"
    assert len(reached) == 1   # t2 went straight to the fallback while the limit lasts
    assert recorded_attempts(ws, "s", "t1") == ["done"]
    assert "runs on command until" in done.stdout


@pytest.mark.slow
def test_kill_at_every_write_around_a_limit_then_resume_waits_and_completes(tmp_path):
    """The crash matrix, for a limit: killed after each durable write from the executor's
    limited run to the retried run's outcome (the limit's record, the wait in metadata,
    its end), the session resumes, waits if the limit still holds, and completes with
    the one attempt spent."""
    import _crashkit as kit

    def run(ws: Path, **env) -> subprocess.CompletedProcess:
        # the limit must still hold when the executor runs, after the start and the
        # planner's run (seconds on a loaded machine)
        steps = [plan("t1"), limited_executor(time.time() + 5), *DONE]
        demo_config(ws, steps)
        return subprocess.run(RALPH + ["session", "start", "objective", "--id", "s"], cwd=ws,
                              env=base_env(**env), capture_output=True,
                              text=True, timeout=120)

    base = tmp_path / "base"
    base.mkdir()
    trace = tmp_path / "trace"
    assert run(base, RALPH_TEST_WRITE_TRACE=trace).returncode == 0
    writes = kit.read_trace(trace, base, "s")
    topics_at = [i for i, w in enumerate(writes) if w.kind == "event"]
    reached = next(i for i in topics_at if "limit.reached" in _event_at(base, writes, i))
    after = next(i for i in topics_at if i > reached and "build.done" in
                 _event_at(base, writes, i))
    points = writes[reached - 1:after + 2]
    assert len(points) >= 4, points
    expected = kit.outcome(base, "s")

    def kill_at(w) -> str | None:
        ws = tmp_path / f"w{w.n:03d}"
        ws.mkdir()
        try:
            kit.killed_then_resumed(ws, "s", run, w.n, expected)
            assert recorded_attempts(ws, "s") == ["done"]
            m = metadata(session_dir(ws, "s"))
            assert m["limit_wait"] is None and m["fallback"]["errors"] == 0
        except Exception as e:  # noqa: BLE001 - reported per point below
            return f"killed after write {w.n} ({w.kind} {w.path}): {type(e).__name__}: {e}"
        kit.remove_workspace(ws)
        return None

    failures = kit.run_all(kill_at, points)
    assert not failures, "\n".join(failures)


def _event_at(ws: Path, writes, i: int) -> str:
    """The topic of the bus record the i-th traced write appended (by its order among
    the event writes)."""
    n = sum(1 for w in writes[:i + 1] if w.kind == "event")
    return events(session_dir(ws, "s"))[n - 1]["topic"]
