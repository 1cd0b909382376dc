"""The operator's view: status, list and tail on real sessions in every status, in text
and JSON, and the live line of a running engine on a terminal."""
from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time

from support import (DONE, EVIDENCE, FAST, RALPH, base_env, plan, ralph, session_dir, spawn,
                     wait_for, write_config, write_scenario)

SLOW = [plan("t1", "t2"),
        {"role": "executor", "task": "t1", "sleep": 30, "emit": [{"topic": "build.done",
                                                                "payload": EVIDENCE}]},
        {"role": "executor", "task": "t2", "attempt": 1, "emit": [
            {"topic": "human.interact", "payload": "Ship it?"}]},
        *DONE]


def status_json(workspace, sid):
    r = ralph(workspace, "session", "status", sid, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def once_there(workspace, sid, check):
    """For wait_for: the session's status view once it exists and `check` holds."""
    r = ralph(workspace, "session", "status", sid, "--json")
    return r.returncode == 0 and check(json.loads(r.stdout))


def test_every_status_in_text_and_json(workspace):
    scenario = write_scenario(workspace, SLOW)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)},
                             "RObot": {"timeout_seconds": 600}})
    # running
    running = spawn(workspace, "session", "start", "obj running", "--id", "run")
    wait_for(lambda: once_there(workspace, "run", lambda v: v["running"]
                                and v["state"] == "EXECUTING_BATCH"))
    view = status_json(workspace, "run")
    assert view["status"] == "active" and view["engine_pid"] == running.pid
    assert [(t["id"], t["marker"]) for t in view["current_tasks"]] == [("t1", "/"), ("t2", " ")]
    assert "engine running" in ralph(workspace, "session", "status", "run").stdout
    # aborted (from running)
    assert ralph(workspace, "signal", "abort", "enough", "--session", "run").returncode == 0
    assert running.wait(30) == 4
    view = status_json(workspace, "run")
    assert view["status"] == "aborted" and view["state"] == "COMPLETE" and not view["running"]
    assert [(t["id"], t["marker"]) for t in view["current_tasks"]][0] == ("t1", "F")
    # waiting on a question
    env = base_env(**FAST)
    waiting = spawn(workspace, "session", "start", "obj waiting", "--id", "ask", env=env)
    wait_for(lambda: once_there(workspace, "ask", lambda v: v["pending_questions"]))
    view = status_json(workspace, "ask")
    q = view["pending_questions"][0]
    assert q["text"] == "Ship it?" and q["on_timeout"] == "continue" and q["role"] == "executor"
    assert q["answer_command"] == f"ralph session answer ask \"...\" --question {q['id']}"
    text = ralph(workspace, "session", "status", "ask").stdout
    assert f"question {q['id']}" in text and "Ship it?" in text
    # paused with a reason (from the question wait)
    assert ralph(workspace, "signal", "pause", "coffee", "--session", "ask").returncode == 0
    assert waiting.wait(30) == 3
    view = status_json(workspace, "ask")
    assert view["pause_reason"] == "coffee" and view["resume_command"] == "ralph session resume ask"
    assert view["pending_questions"]  # still answerable
    # completed
    assert ralph(workspace, "session", "answer", "ask", "yes").returncode == 0
    assert ralph(workspace, "session", "resume", "ask", env=env).returncode == 0
    view = status_json(workspace, "ask")
    assert view["status"] == "completed" and view["completed_at"]
    # list: paused first, and every session with its status
    write_config(workspace, {}, name="plain.yml")  # the built-in demo scenario
    r = ralph(workspace, "session", "start", "obj limit", "--id", "lim", "--max-iterations", "1",
              "-c", "plain.yml", "--accept-config", env=env)   # another demo script
    assert r.returncode == 5, r.stdout + r.stderr
    listed = json.loads(ralph(workspace, "session", "list", "--json").stdout)
    assert listed[0]["session_id"] == "lim" and listed[0]["status"] == "paused"
    assert {v["session_id"]: v["status"] for v in listed} == {
        "lim": "paused", "run": "aborted", "ask": "completed"}
    text = ralph(workspace, "session", "list").stdout.splitlines()
    assert text[0].split() == ["SESSION", "STATUS", "STATE", "ITER", "AGE", "NOTES"]
    assert text[1].startswith("lim") and "max_iterations" in text[1]


def test_tail_and_follow(workspace):
    r = ralph(workspace, "session", "start", "obj", "--id", "t", env=base_env(**FAST))
    assert r.returncode == 0
    out = ralph(workspace, "session", "tail", "t", "-n", "3").stdout.splitlines()
    assert len(out) == 3 and "PLANNING -> COMPLETE (objective_met" in out[-1]
    records = [json.loads(x) for x in ralph(workspace, "session", "tail", "t", "-n", "100",
                                            "--json").stdout.splitlines()]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    # follow a live session until it completes
    scenario = write_scenario(workspace, [plan("a"), {"role": "executor", "sleep": 1, "emit": [
        {"topic": "build.done", "payload": EVIDENCE}]}, *DONE])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    engine = spawn(workspace, "session", "start", "live", "--id", "live", "--accept-config")
    wait_for(lambda: (session_dir(workspace, "live") / "events.jsonl").exists())
    follower = spawn(workspace, "session", "tail", "live", "-f", "-n", "0")
    out, _ = follower.communicate(timeout=60)
    assert engine.wait(30) == 0 and follower.returncode == 0
    lines = out.splitlines()
    assert any("build.done" in line for line in lines)
    assert "-> COMPLETE" in lines[-1]


def test_live_line_on_a_terminal_plain_lines_elsewhere(workspace):
    scenario = write_scenario(workspace, [plan("a"), {"role": "executor", "sleep": 1.5, "emit": [
        {"topic": "build.done", "payload": EVIDENCE}]}, *DONE])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    master, slave = pty.openpty()
    proc = subprocess.Popen(RALPH + ["session", "start", "obj", "--id", "tty"], cwd=workspace,
                            env=base_env(), stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
        elif proc.poll() is not None:
            break
    proc.wait(10)
    os.close(master)
    text = screen.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "\r\x1b[K" in text                                  # redrawn in place
    assert "EXECUTING_BATCH · iteration 1 · task 0 of 1 done · executor a" in text
    # not a terminal: plain timestamped lines, no control characters
    r = ralph(workspace, "session", "start", "obj", "--id", "plain", env=base_env(**FAST))
    assert r.returncode == 0 and "\x1b" not in r.stdout and "\r" not in r.stdout
    assert all(line.startswith("[") or line.startswith("session ") for line in r.stdout.splitlines())


def test_status_and_list_say_where_a_session_paused_or_was_interrupted(workspace):
    """Issue 13, item 13: a paused session names the state it paused from (never "paused
    in PAUSED"); one whose engine died says "interrupted" and how to resume it."""
    import signal
    scenario = write_scenario(workspace, SLOW)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    engine = spawn(workspace, "session", "start", "obj", "--id", "cut")
    wait_for(lambda: once_there(workspace, "cut", lambda v: v["running"]
                                and v["state"] == "EXECUTING_BATCH"))
    os.kill(engine.pid, signal.SIGKILL)   # the engine dies; its agent is left asleep
    engine.wait(10)
    text = ralph(workspace, "session", "status", "cut").stdout
    assert text.splitlines()[0].startswith("session cut: interrupted in EXECUTING_BATCH"), text
    assert "resume: ralph session resume cut" in text
    assert status_json(workspace, "cut")["resume_command"] == "ralph session resume cut"
    line = ralph(workspace, "session", "list").stdout.splitlines()[1]
    assert "interrupted" in line and "EXECUTING_BATCH" in line
    assert "ralph session resume cut" in line
    # resumed with a PAUSE waiting: it stops the leftover agent and pauses at once
    assert ralph(workspace, "signal", "pause", "lunch", "--session", "cut").returncode == 0
    r = ralph(workspace, "session", "resume", "cut")
    assert r.returncode == 3, r.stdout + r.stderr
    text = ralph(workspace, "session", "status", "cut").stdout
    assert text.splitlines()[0].startswith("session cut: paused in EXECUTING_BATCH"), text
    assert "PAUSED" not in text.splitlines()[0]
    line = ralph(workspace, "session", "list").stdout.splitlines()[1]   # under the header
    assert "paused" in line and "EXECUTING_BATCH" in line and "PAUSED" not in line, line
    listed = json.loads(ralph(workspace, "session", "list", "--json").stdout)[0]
    assert (listed["state"], listed["previous_state"]) == ("PAUSED", "EXECUTING_BATCH")
