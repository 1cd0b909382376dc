"""Lifecycle hooks and diagnostics, black-box: real `ralph` processes on the demo agent."""
from __future__ import annotations

import json
import os
import time

from support import DONE, base_env, events, plan, ralph, session_dir, start, wait_for

HOOK = """#!/bin/sh
cat > "$RALPH_WORKSPACE/stdin-$RALPH_HOOK.json"
env > "$RALPH_WORKSPACE/env-$RALPH_HOOK.txt"
echo "output of $RALPH_HOOK"
exit "${1:-0}"
"""
STEPS = [plan("t1"), *DONE]


def _env():
    return base_env(RALPH_DEMO_SLEEP_SCALE=0, RALPH_TELEGRAM_BOT_TOKEN="tg-secret-1234")


def _hook(ws, exit_code=0, on_error="warn", **extra):
    (ws / "hook.sh").write_text(HOOK)
    (ws / "hook.sh").chmod(0o755)
    return {"command": ["./hook.sh", str(exit_code)], "on_error": on_error, **extra}


def _ran(sd):
    return [e["payload"] for e in events(sd) if e["topic"] == "hook.ran"]


def test_hooks_get_the_event_on_stdin_and_the_session_in_env_without_secrets(tmp_path):
    hook = _hook(tmp_path)
    r = start(tmp_path, STEPS, wait=True, env=_env(), config={"hooks": {
        "pre.session.start": [hook], "pre.iteration.start": [hook],
        "pre.plan.ready": [hook], "post.plan.ready": [hook],
        "post.session.complete": [hook]}})
    assert r.returncode == 0, r.stderr
    stdin = json.loads((tmp_path / "stdin-pre.plan.ready[0].json").read_text())
    assert stdin["event"] == "plan.ready" and stdin["session_id"] == "s"
    assert stdin["payload"]["tasks"][0]["id"] == "t1"
    env = (tmp_path / "env-pre.session.start[0].txt").read_text()
    assert "RALPH_SESSION_ID=s\n" in env and "RALPH_STATE=PLANNING\n" in env
    assert "RALPH_ITERATION=1\n" in env and f"RALPH_WORKSPACE={tmp_path}\n" in env
    assert "tg-secret-1234" not in env and "RALPH_TELEGRAM_BOT_TOKEN" not in env
    ran = _ran(session_dir(tmp_path, "s"))
    assert [h["hook"] for h in ran] == ["pre.session.start[0]", "pre.iteration.start[0]",
                                        "pre.plan.ready[0]", "post.plan.ready[0]",
                                        "pre.iteration.start[0]", "post.session.complete[0]"]
    assert all(h["exit_code"] == 0 and h["failure"] is None for h in ran)
    log = ran[0]["log"]
    assert open(log).read() == "output of pre.session.start[0]\n"


def test_warn_goes_on(tmp_path):
    r = start(tmp_path, STEPS, wait=True, env=_env(), config={"hooks": {
        "pre.iteration.start": [_hook(tmp_path, 5, "warn")]}})
    assert r.returncode == 0
    assert "hook pre.iteration.start[0] (./hook.sh) failed: exit 5" in r.stdout
    assert _ran(session_dir(tmp_path, "s"))[0]["failure"].endswith("exit 5: output of "
                                                                     "pre.iteration.start[0]")


def test_pause_names_the_hook_and_resume_runs_it_again(tmp_path):
    config = {"hooks": {"pre.iteration.start": [_hook(tmp_path, 3, "pause")]}}
    r = start(tmp_path, STEPS, wait=True, env=_env(), config=config)
    assert r.returncode == 3
    status = json.loads(ralph(tmp_path, "session", "status", "s", "--json", env=_env()).stdout)
    assert status["pause_kind"] == "hook"
    assert "hook pre.iteration.start[0] (./hook.sh) failed: exit 3" in status["pause_reason"]
    assert status["iteration"] == 1 and status["tasks"]["total"] == 0   # nothing planned
    (tmp_path / "hook.sh").write_text("#!/bin/sh\nexit 0\n")
    r = ralph(tmp_path, "session", "resume", "s", env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert [h["exit_code"] for h in _ran(session_dir(tmp_path, "s"))][:2] == [3, 0]


def test_block_refuses_the_plan_and_the_planner_plans_again(tmp_path):
    marker = tmp_path / "blocked-once"
    (tmp_path / "check.sh").write_text(
        f"#!/bin/sh\n[ -e {marker} ] && exit 0\ntouch {marker}\necho plan too big\nexit 1\n")
    (tmp_path / "check.sh").chmod(0o755)
    steps = [plan("t1"), *DONE]
    r = start(tmp_path, steps, wait=True, env=_env(), config={"hooks": {
        "pre.plan.ready": [{"command": ["./check.sh"], "on_error": "block"}]}})
    assert r.returncode == 0, r.stdout
    sd = session_dir(tmp_path, "s")
    blocked = [e for e in events(sd) if e["topic"] == "plan.blocked"]
    assert len(blocked) == 1 and "plan too big" in blocked[0]["payload"]["reason"]
    planner_prompts = sorted((tmp_path / ".ralph-sessions/s/iterations/1/logs").glob(
        "*planner*.prompt*"))
    assert len(planner_prompts) == 2 and "plan too big" in planner_prompts[1].read_text()


def test_block_on_session_start_refuses_to_run(tmp_path):
    r = start(tmp_path, STEPS, wait=True, env=_env(), config={"hooks": {
        "pre.session.start": [_hook(tmp_path, 1, "block")]}})
    assert r.returncode == 2
    assert "refused by hook pre.session.start[0]" in r.stderr
    assert not any(e["topic"] == "session.transition" for e in events(session_dir(tmp_path, "s")))


def test_a_hook_past_its_timeout_is_killed_with_its_group(tmp_path):
    """The hook's child is found by its command line, not by a pid it records: the hook
    runs in a sandbox whose PID namespace numbers its processes apart."""
    child = f"60.{time.time_ns()}"   # `sleep 60.<unique>`: this test's, no other's
    started = tmp_path / "child.started"
    hook = {"command": ["sh", "-c", f"sleep {child} & touch {started}; wait"],
            "on_error": "pause", "timeout_seconds": 0.5}
    began = time.monotonic()
    r = start(tmp_path, STEPS, wait=True, env=_env(),
              config={"hooks": {"pre.session.start": [hook]}})
    assert r.returncode == 3 and time.monotonic() - began < 20
    ran = _ran(session_dir(tmp_path, "s"))[0]
    assert ran["timed_out"] and ran["exit_code"] is None
    assert "timed out after 0.5s" in ran["failure"]
    assert started.exists()
    wait_for(lambda: not _running(["sleep", child]), timeout=5)


def _running(argv: list[str]) -> bool:
    """A process running `argv` is alive and no zombie (a killed child may wait a moment
    to be reaped)."""
    wanted = "\0".join(argv).encode() + b"\0"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() != wanted:
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except OSError:
            continue
    return False


def test_validate_names_bad_hooks(tmp_path):
    (tmp_path / "ralph.yml").write_text(
        "hooks:\n  pre.nothing: [{command: [x]}]\n"
        "  post.plan.ready: [{command: [], on_error: block, timeout_seconds: 0}]\n")
    r = ralph(tmp_path, "validate", env=_env())
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert any("$.hooks['pre.nothing']: expected pre. or post." in line for line in lines)
    assert any("$.hooks['post.plan.ready'][0].command: expected a non-empty argv" in line
               for line in lines)
    assert any("$.hooks['post.plan.ready'][0].on_error: block is not possible" in line
               for line in lines)
    assert any("timeout_seconds: expected more than 0" in line for line in lines)
    (tmp_path / "ralph.yml").write_text("hooks: {pre.plan.ready: [{command: [x], "
                                        "on_error: maybe}]}\n")
    r = ralph(tmp_path, "validate", env=_env())
    assert r.returncode == 2 and "ralph.yml: $.hooks['pre.plan.ready'][0].on_error" in r.stderr


def test_diagnostics_records_and_diagnose(tmp_path):
    env = _env()
    env["RALPH_DIAGNOSTICS"] = "1"
    steps = [plan("t1"),
             {"role": "executor", "attempt": 1, "emit": [{"topic": "build.done",
                                                           "payload": "tests: fail"}]},
             *DONE]
    r = start(tmp_path, steps, wait=True, env=env, config={"hooks": {
        "post.iteration.start": [_hook(tmp_path, 7)]}})
    assert r.returncode == 0, r.stdout
    diag = session_dir(tmp_path, "s") / "diagnostics" / "diagnostics.jsonl"
    records = [json.loads(line) for line in diag.read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"transition", "gate", "assessment", "run", "hook"} <= kinds
    first = next(r for r in records if r["kind"] == "transition")
    assert first["from"] == "PLANNING" and first["trigger"] == "plan_ready"
    assert first["hooks"][0]["hook"] == "post.iteration.start[0]"
    gate = next(r for r in records if r["kind"] == "gate" and r["decided"] == "rewritten")
    assert gate["topic"] == "build.done" and gate["to"] == "build.blocked"
    assert "tests: fail" in gate["read"]
    run = next(r for r in records if r["kind"] == "run")
    assert {"duration", "exit_code", "input_tokens", "cost_usd", "argv"} <= set(run)
    out = ralph(tmp_path, "session", "diagnose", "s", env=env).stdout
    assert "path (" in out and "PLANNING -> EXECUTING_BATCH (plan_ready" in out
    assert "1 failing" in out and "build.done -> build.blocked" in out
    assert "hook post.iteration.start[0] (./hook.sh) failed: exit 7" in out


def test_diagnostics_off_by_default(tmp_path):
    r = start(tmp_path, STEPS, wait=True, env=_env())
    assert r.returncode == 0
    assert not (session_dir(tmp_path, "s") / "diagnostics").exists()
    assert "no diagnostics" in ralph(tmp_path, "session", "diagnose", "s", env=_env()).stdout
