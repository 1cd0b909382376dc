"""Whole sessions through the real CLI: the demo end to end, agents, limits, status."""
from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import yaml

from support import (EVIDENCE, FAST, base_env, events, finish, held, metadata, only_session,
                     progress_markers, ralph, recorded, run_logs, script_agent, session_dir,
                     session_dirs, spawn, wait_for, work_dir, write_config, write_scenario)
from ralph.engine.machine import allowed
from ralph.states import State

EMIT = f"{sys.executable} -m ralph.engine emit"


def transitions_of(session_dir: Path) -> list[dict]:
    return [e["payload"] for e in events(session_dir) if e["topic"] == "session.transition"]


def assert_transition_log_is_valid(session_dir: Path) -> list[dict]:
    log = transitions_of(session_dir)
    assert [t["n"] for t in log] == list(range(1, len(log) + 1))
    state = "PLANNING"
    for t in log:
        assert t["from"] == state, log
        assert allowed(State(t["from"]), t["trigger"]), t
        state = t["to"]
    assert state == metadata(session_dir)["orchestrator"]["state"]
    return log


def test_demo_session_end_to_end(workspace):
    r = ralph(workspace, "session", "start", "Build a greeting CLI", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    sd = only_session(workspace)
    # the control plane, out of the workspace (the state directory)
    assert not sd.is_relative_to(workspace)
    for name in ("metadata.yaml", "events.jsonl", "session.lock", "config.yaml",
                 "signals/inputs", "signals/processed", "signals/rejected", "questions",
                 "answers", "iterations/1/metadata.yaml", "iterations/1/plan.md",
                 "iterations/1/progress.md", "iterations/1/tasks/greet.md",
                 "iterations/1/reports/greet-report.md", "iterations/1/reviews/greet.md",
                 "iterations/1/knowledge/promoted.yaml"):
        assert (sd / name).exists(), name
    # the work area, in the workspace: the agents' side
    work = workspace / ".ralph-sessions" / sd.name
    assert work_dir(sd) == work
    for name in ("scratchpad.md", "runs", "iterations/1/logs", "iterations/1/knowledge"):
        assert (work / name).exists(), name
    assert not (work / "metadata.yaml").exists() and not (work / "events.jsonl").exists()
    assert progress_markers(sd) == {"1": {"greet": "x", "farewell": "x", "cli": "x"}}
    assert (workspace / ".ralph-demo/docs/demo-project.md").exists()
    meta = metadata(sd)
    assert meta["status"] == "completed" and meta["orchestrator"]["state"] == "COMPLETE"
    assert meta["tasks"] == {"total": 3, "completed": 3, "failed": 0, "pending": 0}
    assert meta["completed_at"] and meta["usage"]["agent_invocations"] == 9
    log = assert_transition_log_is_valid(sd)
    assert [t["trigger"] for t in log] == [
        "plan_ready", "batch_done", "next_batch", "batch_done", "iteration_reviewed",
        "next_iteration", "objective_met"]
    iteration = yaml.safe_load((sd / "iterations/1/metadata.yaml").read_text())
    assert {"iteration", "started_at", "planning_completed_at", "completed_at",
            "tasks_defined"} <= set(iteration)
    assert (sd / "summary.md").exists()
    # every event line is one JSON record with the bus's fields, seq without gaps
    evs = events(sd)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    assert {e["source"] for e in evs} >= {"engine", "planner", "executor", "reviewer", "librarian"}
    r = ralph(workspace, "session", "resume", sd.name)
    assert r.returncode == 2 and "completed" in r.stderr


def test_command_agent_gets_env_and_emits_with_the_cli(workspace):
    """A real agent program: reads the prompt on stdin, calls `ralph emit`, sees RALPH_*."""
    agent = workspace / "agent.sh"
    agent.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        cat > "$RALPH_ITERATION_DIR/logs/prompt-$RALPH_ROLE-${{RALPH_TASK_ID:-none}}.md"
        env | grep '^RALPH_' | sort > "$RALPH_ITERATION_DIR/logs/env-$RALPH_ROLE-${{RALPH_TASK_ID:-none}}"
        case "$RALPH_ROLE" in
          planner)
            if [ "$RALPH_ITERATION" = 1 ]; then
              {EMIT} plan.ready --json '{{"tasks": [{{"id": "only", "title": "The task"}}]}}'
            else
              echo LOOP_COMPLETE
            fi ;;
          executor) {EMIT} build.done "tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 90, complexity: 2, duplication: pass" ;;
          reviewer) {EMIT} review.done "tests: pass, build: pass" ;;
        esac
        """))
    agent.chmod(0o755)
    write_config(workspace, {"agent": {"backend": "command", "command": [str(agent)]}})
    r = ralph(workspace, "session", "start", "Objective for a shell agent", "--id", "sh1")
    assert r.returncode == 0, r.stdout + r.stderr
    sd = only_session(workspace)
    logs = work_dir(sd) / "iterations/1/logs"
    prompt = (logs / "prompt-executor-only.md").read_text()
    order = [prompt.index(h) for h in ("## OBJECTIVE", "## PENDING EVENTS", "## ROLE: EXECUTOR",
                                       "## SKILLS")]
    assert order == sorted(order) and "Objective for a shell agent" in prompt
    env = dict(line.split("=", 1) for line in (logs / "env-executor-only").read_text().splitlines())
    assert env["RALPH_SESSION_ID"] == "sh1" and env["RALPH_ROLE"] == "executor"
    assert env["RALPH_TASK_ID"] == "only" and env["RALPH_ITERATION"] == "1"
    assert env["RALPH_STATE"] == "EXECUTING_BATCH" and env["RALPH_WORKSPACE"] == str(workspace)
    # the agent writes its work area; it may read the control plane, never write it
    assert env["RALPH_SESSION_DIR"] == str(work_dir(sd))
    assert env["RALPH_ITERATION_DIR"] == str(work_dir(sd) / "iterations/1")
    assert env["RALPH_CONTROL_DIR"] == str(sd)
    assert "RALPH_TASK_ID" not in (logs / "env-planner-none").read_text()
    built = [e for e in events(sd) if e["topic"] == "build.done"]
    assert built[0]["source"] == "executor" and built[0]["iteration"] == 1
    assert built[0]["state"] == "EXECUTING_BATCH"
    assert built[0]["run"] == env["RALPH_RUN_ID"]
    assert progress_markers(sd) == {"1": {"only": "x"}}


def test_prompt_as_argument_and_as_file(workspace):
    for mode in ("arg", "file"):
        agent = workspace / f"agent-{mode}.py"
        agent.write_text(textwrap.dedent(f"""\
            import os, subprocess, sys
            text = sys.argv[1] if "{mode}" == "arg" else open(sys.argv[1]).read()
            assert text.startswith("## OBJECTIVE"), text[:80]
            role = os.environ["RALPH_ROLE"]
            def emit(*a):
                subprocess.run([sys.executable, "-m", "ralph.engine", "emit", *a], check=True)
            if role == "planner":
                if os.environ["RALPH_ITERATION"] == "1":
                    emit("plan.ready", "--json", '{{"tasks": [{{"id": "t", "title": "T"}}]}}')
                else:
                    emit("LOOP_COMPLETE")
            elif role == "executor":
                emit("build.done", "tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 99, complexity: 1, duplication: pass")
            elif role == "reviewer":
                emit("review.done", "tests: pass, build: pass")
            """))
        write_config(workspace, {"agent": {"backend": "command", "prompt_mode": mode,
                                           "command": [sys.executable, str(agent)]}})
        r = ralph(workspace, "session", "start", "obj", "--id", f"mode-{mode}",
                  "--accept-config")   # the second: another agent than the first's
        assert r.returncode == 0, r.stdout + r.stderr


def test_failures_end_tasks_failed_and_the_timeout_kills_the_group(workspace):
    scenario = write_scenario(workspace, [
        {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {"tasks": [
            {"id": "blocked", "title": "B"}, {"id": "crashes", "title": "C"},
            {"id": "hangs", "title": "H"}]}}]},
        {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor", "task": "blocked", "emit": [{"topic": "build.blocked",
                                                         "payload": "no compiler"}]},
        {"role": "executor", "task": "crashes", "exit": 7},
        {"role": "executor", "task": "hangs", "sleep": 60},
    ])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario),
                                       "timeout_seconds": 2},
                             "fallback": {"enabled": False}})  # no human to ask here
    started = time.monotonic()
    r = ralph(workspace, "session", "start", "obj", "--id", "f1")
    assert time.monotonic() - started < 30
    # every task of the batch failed: the session pauses with the reasons
    assert r.returncode == 3, r.stdout + r.stderr
    sd = only_session(workspace)
    assert "every task of batch 1 failed" in metadata(sd)["orchestrator"]["pause_reason"]
    r = ralph(workspace, "session", "resume", "f1")
    assert r.returncode == 0, r.stdout + r.stderr  # completed, with [F] tasks
    assert progress_markers(sd) == {"1": {"blocked": "F", "crashes": "F", "hangs": "F"}}
    text = (sd / "iterations/1/progress.md").read_text()
    assert "abandoned after 3 consecutive build.blocked: no compiler" in text
    assert "no outcome after 3 task.resume retries (last exit code 7)" in text
    assert "the executor timed out" in text
    assert metadata(sd)["tasks"]["failed"] == 3
    for task in ("blocked", "crashes", "hangs"):
        assert "not reviewed" in (sd / f"iterations/1/reviews/{task}.md").read_text()
    assert run_logs(sd, "*-executor-hangs.stdout", iteration=1)


def test_max_iterations_pauses_with_exit_5_and_resume_raises_it(workspace):
    r = ralph(workspace, "session", "start", "obj", "--id", "lim", "--max-iterations", "1",
              env=base_env(**FAST))
    assert r.returncode == 5, r.stdout + r.stderr
    sd = only_session(workspace)
    meta = metadata(sd)
    assert meta["status"] == "paused" and meta["orchestrator"]["state"] == "PAUSED"
    assert "max_iterations" in meta["orchestrator"]["pause_reason"]
    assert meta["orchestrator"]["previous_state"] == "PLANNING" and meta["iteration"] == 2
    assert "--max-iterations" in r.stdout
    r = ralph(workspace, "session", "resume", "lim", env=base_env(**FAST))
    assert r.returncode == 2 and "--max-iterations N (N at least 2)" in r.stderr  # it holds
    r = ralph(workspace, "session", "resume", "lim", "--max-iterations", "2", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert metadata(sd)["limits"]["max_iterations"] == 2
    log = assert_transition_log_is_valid(sd)
    assert [t["trigger"] for t in log][-3:] == ["pause", "resume", "objective_met"]


def test_max_runtime_pauses_with_exit_5(workspace):
    write_config(workspace, {"event_loop": {"max_runtime_seconds": 0.5}})
    r = ralph(workspace, "session", "start", "obj", "--id", "rt")  # demo sleeps: > 0.5 s
    assert r.returncode == 5, r.stdout + r.stderr
    assert "max_runtime_seconds" in metadata(only_session(workspace))["orchestrator"]["pause_reason"]
    r = ralph(workspace, "session", "resume", "rt", "--max-runtime", "600", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr


BAD_EMITS = (["emit"], ["emit", "bad topic!"], ["emit", "x", "--json", "{nope"],
             ["emit", "x", "p", "--json", "1"], ["emit", "..", "p"],
             ["emit", "session.pause", "me"], ["emit", "human.response", "yes"])


def test_emit_validates_topic_and_json(workspace):
    """`ralph emit` inside a run: the event is the run's (its role, whatever the
    environment claims); a bad one is refused in one line and recorded. From a terminal,
    the one open session is found and the event is the CLI's; with no engine, nobody takes
    it."""
    script_agent(workspace, f"""
        record("good", [ralph("emit", "cost", "--json", '{{"usd": 0.5}}'),
                        ralph("emit", "note", "a forged role", RALPH_ROLE="reviewer")])
        record("bad", [ralph(*args) for args in {BAD_EMITS!r}])
        hold("terminal")
    """)
    proc = spawn(workspace, "session", "start", "obj", "--id", "e1")
    with held(workspace, "terminal", "e1"):
        r = ralph(workspace, "emit", "note", "from a terminal")
        assert r.returncode == 0 and r.stdout == "emitted note\n", r.stderr
    code, out, err = finish(proc)
    assert code == 0, out + err
    good, bad = recorded(workspace, "good", "e1"), recorded(workspace, "bad", "e1")
    assert [(g["code"], g["out"]) for g in good] == [(0, "emitted cost\n"), (0, "emitted note\n")]
    for r in bad:
        assert r["code"] == 2, r
        assert len(r["err"].strip().splitlines()) == 1 and "Traceback" not in r["err"], r
    assert "reserved" in bad[-2]["err"] and "reserved" in bad[-1]["err"]
    sd = only_session(workspace)
    evs = events(sd)
    run = next(e["run"] for e in evs if e["topic"] == "cost")
    assert [(e["topic"], e["payload"], e["source"], e.get("run")) for e in evs
            if e["topic"] in ("cost", "note")] == [
        ("cost", {"usd": 0.5}, "executor", run), ("note", "a forged role", "executor", run),
        ("note", "from a terminal", "cli", None)]
    refused = [e for e in evs if e["topic"] == "cli.refused"]
    assert len(refused) == len(BAD_EMITS) and {e["source"] for e in refused} == {"executor"}
    assert not any(e["topic"] in ("session.pause", "human.response") for e in evs)
    # no engine runs the session now: nobody would take it
    r = ralph(workspace, "emit", "note", "too late", "--session", "e1")
    assert r.returncode == 2 and "no engine runs this session" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not [e for e in events(sd) if e["payload"] == "too late"]


def test_status_and_list_in_text_and_json(workspace):
    ralph(workspace, "session", "start", "obj one", "--id", "done1", env=base_env(**FAST))
    ralph(workspace, "session", "start", "obj two", "--id", "lim1", "--max-iterations", "1",
          env=base_env(**FAST))
    view = json.loads(ralph(workspace, "session", "status", "lim1", "--json").stdout)
    assert view["state"] == "PAUSED" and view["status"] == "paused" and not view["running"]
    assert view["resume_command"].startswith("ralph session resume lim1")
    assert view["tasks"]["completed"] == 3 and view["last_events"]
    text = ralph(workspace, "session", "status", "lim1").stdout
    assert "paused: max_iterations" in text and "resume: ralph session resume lim1" in text
    listed = json.loads(ralph(workspace, "session", "list", "--json").stdout)
    assert [v["session_id"] for v in listed] == ["lim1", "done1"]  # paused first
    assert listed[0]["pause_reason"].startswith("max_iterations")
    assert listed[1]["status"] == "completed" and listed[1]["running"] is False
    assert "lim1" in ralph(workspace, "session", "list").stdout
    r = ralph(workspace, "session", "status", "nope")
    assert r.returncode == 2 and "unknown session" in r.stderr


def test_objective_from_file_and_missing_objective(workspace):
    (workspace / "goal.md").write_text("Objective from a file\n")
    r = ralph(workspace, "session", "start", "-p", "goal.md", "--id", "pf", env=base_env(**FAST))
    assert r.returncode == 0
    assert metadata(only_session(workspace))["objective"] == "Objective from a file"
    r = ralph(workspace, "session", "start")
    assert r.returncode == 2 and "objective" in r.stderr
    r = ralph(workspace, "session", "start", "x", "--agent", "nonsense")
    assert r.returncode == 2 and "--agent" in r.stderr


def test_sigint_and_sigterm_leave_the_session_resumable(workspace):
    import signal as sig

    scenario = write_scenario(workspace, [
        {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
            "tasks": [{"id": "slow", "title": "S"}]}}]},
        {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor", "sleep": 30, "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "reviewer", "emit": [{"topic": "review.done", "payload": "tests: pass, build: pass"}]},
    ])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    for signum, code, sid in ((sig.SIGINT, 130, "int"), (sig.SIGTERM, 143, "term")):
        proc = spawn(workspace, "session", "start", "obj", "--id", sid)
        sd = session_dir(workspace, sid)
        # underway: the demo agent's first line (its conversation) is in its log
        wait_for(lambda: [p for p in run_logs(sd, "*-executor-slow.stdout") if p.stat().st_size])
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == code, err
        assert "resumable" in err
        assert metadata(sd)["status"] == "active"
        assert progress_markers(sd)["1"]["slow"] == "/"
        r = ralph(workspace, "session", "resume", sid, env=base_env(**FAST))
        assert r.returncode == 0, r.stdout + r.stderr
        assert progress_markers(sd)["1"]["slow"] == "x"


def test_the_workspace_holds_the_config(tmp_path):
    """Issue 13, item 5: with --workspace W (or $RALPH_WORKSPACE), init writes W/ralph.yml,
    validate and start read it; `-c PATH` stays relative to the current directory."""
    from support import DONE, plan
    ws, here = tmp_path / "W", tmp_path / "here"
    ws.mkdir()
    here.mkdir()
    r = ralph(here, "--workspace", ws, "init")
    assert r.returncode == 0, r.stderr
    assert (ws / "ralph.yml").exists() and not (here / "ralph.yml").exists()
    (ws / "ralph.yml").write_text("event_loop: {max_iterations: 0}\n")
    r = ralph(here, "--workspace", ws, "validate")
    assert r.returncode == 2 and "ralph.yml: $.event_loop.max_iterations" in r.stderr, r.stderr
    r = ralph(here, "validate", env=base_env(RALPH_WORKSPACE=ws))
    assert r.returncode == 2 and "$.event_loop.max_iterations" in r.stderr, r.stderr
    scenario = write_scenario(ws, [plan("only_in_w"), *DONE])
    write_config(ws, {"agent": {"backend": "demo", "script": str(scenario)}})
    r = ralph(here, "--workspace", ws, "session", "start", "obj", "--id", "w1",
              env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert progress_markers(session_dir(ws, "w1")) == {"1": {"only_in_w": "x"}}
    assert not (here / ".ralph-sessions").exists() and not session_dirs(here)
    write_config(here, {"event_loop": {"max_iterations": "x"}}, name="mine.yml")
    r = ralph(here, "--workspace", ws, "validate", "-c", "mine.yml")
    assert r.returncode == 2 and "mine.yml: $.event_loop.max_iterations" in r.stderr, r.stderr


def test_the_demo_says_so_and_keeps_its_files_apart(workspace):
    """Issue 13, item 9: with no ralph.yml the demo plays, says so first, and writes
    nothing among the project's files: its work and its promoted knowledge go to
    .ralph-demo/."""
    (workspace / "README.md").write_text("the user's project\n")
    r = ralph(workspace, "session", "start", "obj", "--id", "d", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    # first, but for the sandbox's line (every start says how its runs are confined)
    said = [line for line in r.stderr.splitlines() if not line.startswith("ralph: sandbox:")]
    assert said[0].startswith("demo agent: no model is called; `ralph init` to choose yours"), \
        r.stderr
    assert sorted(p.name for p in workspace.iterdir()) == [".ralph-demo", ".ralph-sessions",
                                                           "README.md"]
    assert (workspace / ".ralph-demo/demo-project/greet.py").exists()
    assert (workspace / ".ralph-demo/docs/demo-project.md").exists()
    # a configured agent is not the demo: not a word about it
    write_config(workspace, {"agent": {"backend": "command",
                                       "command": ["sh", "-c", "echo LOOP_COMPLETE"]}})
    r = ralph(workspace, "session", "start", "obj", "--id", "c", "--accept-config")
    assert r.returncode == 0 and "demo agent" not in r.stdout + r.stderr, r.stderr


def test_bare_ralph_prints_help_and_version_comes_from_the_package(workspace):
    """Issue 13, item 12."""
    from importlib.metadata import version
    r = ralph(workspace)
    assert r.returncode == 0 and r.stdout.startswith("usage: ralph"), r.stdout + r.stderr
    assert "session" in r.stdout and "exit codes:" in r.stdout
    r = ralph(workspace, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"ralph {version('ralph')}"


def test_every_argument_has_help_and_help_lists_the_exit_codes(workspace):
    """Issue 13, item 12: no flag or argument without a word of help; `ralph --help` ends
    with the exit codes, every command's --help with an example and a pointer to them
    (issue 33: the table once, not in every command's help)."""
    import argparse

    from ralph.engine.cli.parser import build_parser

    def walk(parser, name):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    yield from walk(child, f"{name} {sub}")
    missing = []
    for name, parser in walk(build_parser(), "ralph"):
        missing += [f"{name}: {a.option_strings or a.dest}" for a in parser._actions
                    if not a.help or a.help == argparse.SUPPRESS]
        text = parser.format_help()
        assert ("exit codes:\n" in text) == (name == "ralph"), name
        assert "exit codes" in text or parser._subparsers, name
    assert missing == []
    text = ralph(workspace, "--help").stdout
    for code in ("0 ", "1 ", "2 ", "3 ", "4 ", "5 ", "130 "):
        assert f"\n  {code}" in text, code


def test_resume_and_answer_default_to_the_only_open_session(workspace):
    """Issue 13, item 12: like status, resume and answer need no ID when one session is open."""
    scenario = write_scenario(workspace, [
        {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
            "tasks": [{"id": "t", "title": "T"}]}}]},
        {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor", "attempt": 1, "emit": [{"topic": "human.interact", "json": {
            "text": "Which?", "options": ["left", "right"]}}]},
        {"role": "executor", "emit": [{"topic": "build.done", "payload":
            "tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 90, "
            "complexity: 1, duplication: pass"}]},
        {"role": "reviewer", "emit": [{"topic": "review.done",
                                       "payload": "tests: pass, build: pass"}]},
    ])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)},
                             "RObot": {"timeout_seconds": 600}})
    proc = spawn(workspace, "session", "start", "obj", "--id", "only")
    sd = session_dir(workspace, "only")
    wait_for(lambda: list(sd.glob("questions/*.yaml")))
    assert ralph(workspace, "signal", "pause", "later").returncode == 0
    assert proc.wait(30) == 3
    r = ralph(workspace, "session", "answer", "2")
    assert r.returncode == 0, r.stderr
    r = ralph(workspace, "session", "resume", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    answer = next(e for e in events(sd) if e["topic"] == "human.response")
    assert "right" in json.dumps(answer["payload"])


def test_emit_takes_the_session_flag_its_error_names(workspace):
    """Issue 13, item 12: with two open sessions emit asks for --session; given, it works."""
    script_agent(workspace, 'hold("terminal")')
    procs = [spawn(workspace, "session", "start", "obj", "--id", sid) for sid in ("e1", "e2")]
    with held(workspace, "terminal", "e1"), held(workspace, "terminal", "e2"):
        r = ralph(workspace, "emit", "note", "hello")
        assert r.returncode == 2 and "--session" in r.stderr
        for args in (["emit", "note", "hello", "--session", "e2"],
                     ["emit", "--session=e2", "note2", "--json", '{"a": 1}'],
                     ["--workspace", workspace, "emit", "note3", "--session", "e2"]):
            r = ralph(workspace, *args)
            assert r.returncode == 0, (args, r.stderr)
        r = ralph(workspace, "emit", "note", "--session", "nope")
        assert r.returncode == 2 and "unknown session" in r.stderr
    for proc in procs:
        code, out, err = finish(proc)
        assert code == 0, out + err
    notes = {sid: [(e["topic"], e["payload"], e["source"]) for e in events(session_dir(
        workspace, sid)) if e["topic"].startswith("note")] for sid in ("e1", "e2")}
    assert notes == {"e1": [], "e2": [("note", "hello", "cli"), ("note2", {"a": 1}, "cli"),
                                      ("note3", None, "cli")]}


def test_a_closed_pipe_ends_the_output_quietly(workspace):
    """Issue 13, item 12: `ralph session status | head -1` and friends: no "internal error"."""
    import subprocess

    from support import RALPH
    assert ralph(workspace, "session", "start", "obj", "--id", "p", env=base_env(**FAST)
                 ).returncode == 0
    for args in (["session", "status"], ["session", "list"], ["session", "tail", "p"]):
        read, write = os.pipe()
        os.close(read)   # the reader is gone before the first line
        proc = subprocess.run(RALPH + args, cwd=workspace, env=base_env(), stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)
        os.close(write)
        assert proc.stderr == "", (args, proc.stderr)
        assert proc.returncode == 141, args
