"""Issue 33, items 3 to 5: what a newcomer meets on the command line in the first hour.

A failed agent run says why (its exit code, its last stderr line, its log) on the console,
in `status` and its JSON (the web page's data) and in the fallback question, which is
plain text; a slip (an option number out of range, a workspace that is not there, a
resume whose limit still holds, a mistyped session id) is refused in one line that says
what to type; the output reads as a person expects (a header on `session list`, what a
signal asked, the resume command on ^C, the exit codes once, one error prefix).
Real `ralph` processes throughout (tests/support); sessions a test only looks at are made
through the store."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
from datetime import datetime, timezone
from pathlib import Path

from support import (FAST, base_env, metadata, new_session, ralph, run_logs, session_dir,
                     spawn, wait_for, write_config, write_scenario)

ESC = "\x1b[2J"


def test_a_failed_run_says_its_exit_code_its_last_stderr_line_and_its_log(workspace):
    """The console, `status` (text and JSON: the page's data) and the fallback question
    name the failed run's exit code, its last stderr line (escaped: the agent wrote it)
    and its log; the question is plain text (no markdown), its lines shown as lines."""
    write_config(workspace, {
        "agent": {"backend": "command", "command": [
            "sh", "-c", f"echo working; printf 'fatal: model overloaded{ESC}\\n' >&2; exit 7"]},
        "fallback": {"error_count_threshold": 2},
        "RObot": {"timeout_seconds": 1}})
    r = ralph(workspace, "session", "start", "obj", "--id", "f1", timeout=90)
    assert r.returncode == 3, r.stdout + r.stderr   # paused: no plan after the retries
    said = [line for line in r.stdout.splitlines() if "exited with code 7" in line]
    assert said and "its last stderr line: fatal: model overloaded\\x1b[2J" in said[0], r.stdout
    assert ESC not in r.stdout + r.stderr
    log = re.search(r"its log: (\S+\.stderr)", said[-1]).group(1)
    assert Path(log).read_text().startswith("fatal: model overloaded")

    view = json.loads(ralph(workspace, "session", "status", "f1", "--json").stdout)
    failure = view["last_failure"]
    assert (failure["role"], failure["exit_code"], failure["timed_out"]) == ("planner", 7, False)
    assert failure["stderr_tail"] == f"fatal: model overloaded{ESC}" and failure["log"] == log
    text = ralph(workspace, "session", "status", "f1").stdout
    assert f"last failed run: the planner (iteration 1) exited with code 7; its last stderr " \
           f"line: fatal: model overloaded\\x1b[2J; its log: {log}" in text, text

    asked = [q for q in (session_dir(workspace, "f1") / "questions").glob("*.yaml")]
    import yaml
    question = yaml.safe_load(asked[0].read_text())["text"]
    assert "**" not in question and "\\n" not in question and "\n" in question
    assert "I keep hitting errors" not in question
    assert "last failed run: the planner (iteration 1) exited with code 7" in question
    assert "fatal: model overloaded\\x1b[2J" in question     # escaped in the text itself
    # status shows a pending question's lines as lines, never a literal \n
    pending = view["pending_questions"]
    if pending:
        shown = text.split("question ", 1)[1].split("\n  answer: ")[0]
        assert "\\n" not in shown and "\n    Issue: Error Recovery" in shown, text


def test_a_run_of_the_same_step_that_ends_well_clears_the_failure(workspace):
    """The failure stands until its step runs well: a flaky planner that fails once."""
    flag = workspace / "failed-once"
    agent = workspace / "flaky.py"
    agent.write_text(
        "import os, subprocess, sys\n"
        f"if not os.path.exists({str(flag)!r}):\n"
        f"    open({str(flag)!r}, 'w').close()\n"
        "    print('boom', file=sys.stderr)\n"
        "    sys.exit(3)\n"
        "subprocess.run([sys.executable, '-m', 'ralph.engine', 'emit', 'LOOP_COMPLETE'], check=True)\n")
    write_config(workspace, {"agent": {"backend": "command",
                                       "command": [sys.executable, str(agent)]}})
    r = ralph(workspace, "session", "start", "obj", "--id", "f2", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the planner (iteration 1) exited with code 3; its last stderr line: boom" in r.stdout
    assert metadata(session_dir(workspace, "f2"))["last_failure"] is None


def test_an_option_number_out_of_range_is_refused(workspace):
    from _web import ask
    session = new_session(workspace, sid="q1")
    qid = ask(session, "Which database?", ["sqlite", "postgres"])
    r = ralph(workspace, "session", "answer", "q1", "3")
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("ralph: error: ") and "numbered 1-2" in line, line
    assert session.questions.read_answer(qid) is None
    r = ralph(workspace, "session", "answer", "q1", "3 please")   # a number as free text
    assert r.returncode == 0, r.stderr
    assert session.questions.read_answer(qid).text == "3 please"


def test_a_workspace_that_is_not_there_is_refused(workspace, tmp_path):
    typo = tmp_path / "typo"
    r = ralph(workspace, "--workspace", typo, "session", "list")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"ralph: error: --workspace {typo}: no such directory\n"
    r = ralph(workspace, "session", "list", env=base_env(RALPH_WORKSPACE=typo))
    assert r.returncode == 2 and "$RALPH_WORKSPACE" in r.stderr


def test_hints_carry_the_syntax_each_command_takes(workspace):
    r = ralph(workspace, "session", "resume")
    assert r.returncode == 2 and r.stderr.rstrip().endswith(
        "name one: ralph session resume ID"), r.stderr
    r = ralph(workspace, "signal", "steer", "use sqlite")
    assert r.returncode == 2 and r.stderr.rstrip().endswith(
        "name one: ralph signal steer MESSAGE --session ID"), r.stderr
    r = ralph(workspace, "signal", "pause")   # the message is optional but for steer, info
    assert r.returncode == 2 and r.stderr.rstrip().endswith(
        "name one: ralph signal pause --session ID"), r.stderr


def test_an_unknown_session_names_the_nearest(workspace):
    new_session(workspace, sid="250101-120000-ab12")
    r = ralph(workspace, "session", "status", "250101-120000-ab21")
    assert r.returncode == 2
    assert r.stderr.rstrip().endswith("did you mean 250101-120000-ab12?"), r.stderr
    r = ralph(workspace, "session", "status", "nope")
    assert r.returncode == 2 and "its sessions: 250101-120000-ab12" in r.stderr, r.stderr


def _paused_at_its_limit(workspace, sid: str):
    """A session paused by max_iterations (1) at iteration 2, as the engine leaves it."""
    from ralph.session_store import PauseKind, State, Status
    session = new_session(workspace, sid=sid)
    m = session.metadata
    m.status, m.iteration, m.limits.max_iterations = Status.PAUSED, 2, 1
    o = m.orchestrator
    o.state, o.previous_state, o.pause_kind = State.PAUSED, State.PLANNING, PauseKind.LIMIT
    o.pause_reason = "max_iterations reached (1)"
    session.save(datetime.now(timezone.utc))
    return session


def _control_files(sd: Path) -> dict:
    return {p: p.read_bytes() for p in sd.rglob("*") if p.is_file()}


def test_resume_of_a_session_whose_limit_still_holds_is_refused(workspace):
    """It would pause again at once (exit 5, two more steps on its path): refused with the
    flag to raise, nothing written; with the limit raised it runs."""
    session = _paused_at_its_limit(workspace, "lim")
    sd = Path(session.dir)
    before = _control_files(sd)
    for extra in ((), ("--max-iterations", "1")):
        r = ralph(workspace, "session", "resume", "lim", *extra)
        assert r.returncode == 2, r.stdout + r.stderr
        [line] = r.stderr.splitlines()
        assert "ralph session resume lim --max-iterations N (N at least 2)" in line, line
    assert _control_files(sd) == before
    status = ralph(workspace, "session", "status", "lim").stdout
    assert "resume: ralph session resume lim --max-iterations N (N at least 2)" in status
    assert "1 of 1 iterations run (the limit)" in status and "iteration 2 of 1" not in status
    view = json.loads(ralph(workspace, "session", "status", "lim", "--json").stdout)
    assert view["limit_to_raise"]["limit"] == "max_iterations", view["limit_to_raise"]


def test_the_pages_resume_asks_for_the_new_limit(workspace, web):
    from _web import client
    session = _paused_at_its_limit(workspace, "w1")
    server = web()
    with client(server) as c:
        for body in ({}, {"message": "go on"}, {"max_iterations": 1}):
            r = c.post("/api/sessions/w1/resume", json=body)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error.startswith("$.max_iterations: ") and "at least 2" in error, error
    assert session.running_pid() is None
    assert metadata(Path(session.dir))["status"] == "paused"


def test_no_alarm_for_a_config_outside_the_workspace(workspace, tmp_path):
    """The human's own config (-c, outside the workspace) runs what it says without the
    "agents can rewrite" alarm; a config inside the workspace that changed keeps it."""
    scenario = write_scenario(workspace, [{"role": "planner", "emit": [
        {"topic": "LOOP_COMPLETE"}]}])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    r = ralph(workspace, "session", "start", "obj", "--id", "first", env=base_env(**FAST))
    assert r.returncode == 0, r.stderr
    mine = {"agent": {"backend": "command", "command": ["/bin/false"]}}
    outside = write_config(tmp_path, mine, "my.yml")
    inside = write_config(workspace, mine, "my.yml")
    r = ralph(workspace, "validate", "-c", outside)
    assert r.returncode == 0 and "rewrite" not in r.stderr and "changed" not in r.stderr, \
        r.stderr
    r = ralph(workspace, "validate", "-c", inside.name)
    assert r.returncode == 0 and "what it runs changed" in r.stderr, r.stderr


def test_session_list_has_a_header_and_aligned_columns(workspace):
    new_session(workspace, sid="a")
    new_session(workspace, sid="250101-120000-ab12")
    lines = ralph(workspace, "session", "list").stdout.splitlines()
    assert lines[0].split() == ["SESSION", "STATUS", "STATE", "ITER", "AGE", "NOTES"]
    columns = {line.index("interrupted") for line in lines[1:]}   # no engine holds them
    assert columns == {lines[0].index("STATUS")}, lines


def test_a_signal_says_what_it_asked_of_which_session(workspace):
    new_session(workspace, sid="s1")
    r = ralph(workspace, "signal", "pause", "lunch")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("asked session s1 to pause; no engine runs it: taken when it "
                               "is resumed (ralph session resume s1) (signal file signal."), \
        r.stdout


def test_ctrl_c_prints_the_resume_command(workspace):
    scenario = write_scenario(workspace, [
        {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
            "tasks": [{"id": "slow", "title": "S"}]}}]},
        {"role": "executor", "sleep": 30, "emit": [{"topic": "task.failed", "payload": "x"}]}])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    proc = spawn(workspace, "session", "start", "obj", "--id", "cc")
    sd = session_dir(workspace, "cc")
    wait_for(lambda: [p for p in run_logs(sd, "*-executor-slow.stdout") if p.stat().st_size])
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert "ralph: interrupted; the session is resumable: ralph session resume cc\n" in err, err


def test_exit_codes_once_and_every_command_a_purpose_and_an_example(workspace):
    top = ralph(workspace, "--help").stdout
    assert "exit codes:\n" in top and "\n  130 " in top
    for argv in (["session", "start"], ["session", "answer"], ["signal"], ["validate"],
                 ["tools", "interact", "ask"]):
        text = ralph(workspace, *argv, "--help").stdout
        assert "\n  130 " not in text and "exit codes: see `ralph --help`" in text, argv
        assert "\nexample" in text and f"\n  ralph {' '.join(argv)} " in text, (argv, text)
    emit = ralph(workspace, "emit", "--help")
    assert emit.returncode == 0 and len(emit.stdout.splitlines()) > 5
    assert "--json JSON" in emit.stdout and "\n  ralph emit build.done" in emit.stdout


def test_one_error_prefix(workspace):
    for argv in (["signal", "bogus", "x"], ["session", "start", "--bogus"],
                 ["session", "status", "nope"], ["emit", "Bad Topic!"]):
        r = ralph(workspace, *argv)
        assert r.returncode == 2 and r.stderr.startswith("ralph: error: "), (argv, r.stderr)


def test_plurals_and_a_sane_iteration_count(workspace):
    scenario = write_scenario(workspace, [
        {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
            "tasks": [{"id": "t1", "title": "one"}]}}]},
        {"role": "executor", "emit": [{"topic": "task.failed", "payload": "no"}]}])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(scenario)}})
    r = ralph(workspace, "session", "start", "obj", "--id", "p", env=base_env(**FAST))
    assert "(plan_ready: 1 task in 1 batch)" in r.stdout, r.stdout


def test_validate_warns_of_a_missing_agent_cli(workspace, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    write_config(workspace, {"agent": {"backend": "claude"}})
    env = base_env(PATH=f"{empty}{os.pathsep}{Path(sys.executable).parent}")
    r = ralph(workspace, "validate", env=env)
    assert r.returncode == 0 and r.stdout == "ralph.yml: valid\n", r.stdout
    [warning] = r.stderr.splitlines()
    assert warning.startswith("ralph: warning: ralph.yml: agent claude: `claude` is not "
                              "installed"), warning


def test_init_makes_its_workspace_and_a_missing_folder_for_a_file_is_one_line(workspace):
    """`init` makes the workspace it is pointed at, as `session start` does; a file named
    with -o in a folder that is not there is refused in one line (exit 2), as a slip."""
    r = ralph(workspace, "--workspace", "new/sub", "init")
    assert r.returncode == 0 and (workspace / "new/sub/ralph.yml").exists(), r.stderr
    for args in (("init", "-o", "missing/ralph.yml"),
                 ("diagram", "--format", "svg", "-o", "missing/machine.svg")):
        r = ralph(workspace, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr == "ralph: error: missing/" + args[-1].split("/")[1] + \
            ": cannot write it: No such file or directory\n", r.stderr
    assert not (workspace / "missing").exists()


def test_validate_refuses_all_at_once_what_session_start_takes_only_from_outside(workspace,
                                                                              tmp_path):
    """A workspace's ralph.yml (an agent can rewrite it) may not turn the sandbox off, add
    writable paths or write outside the workspace: `validate` says so as `session start`
    does, every one of them in one pass; the same file outside the workspace (-c) is
    valid."""
    text = "agent:\n  sandbox: none\n  writable: [/tmp/cache]\nknowledge:\n  docs_dir: /tmp/d\n"
    (workspace / "ralph.yml").write_text(text)
    r = ralph(workspace, "validate")
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 3, r.stdout + r.stderr
    assert all(line.startswith("ralph: error: ralph.yml: $.") for line in lines), lines
    assert [line.split(": ")[3] for line in lines] == [
        "$.knowledge.docs_dir", "$.agent.sandbox", "$.agent.writable"], lines
    assert "valid" not in r.stdout
    r = ralph(workspace, "session", "start", "obj")
    assert r.returncode == 2 and r.stderr.splitlines()[0] == lines[0], r.stderr
    outside = tmp_path / "mine.yml"
    outside.write_text(text)
    r = ralph(workspace, "validate", "-c", outside)
    assert r.returncode == 0 and r.stdout == f"{outside}: valid\n", r.stdout + r.stderr


def test_each_resume_command_printed_runs_where_it_is_printed(workspace):
    """Started with --workspace, a session's resume command names the workspace as it was
    given (relative to where the human is), on the console when it pauses, in `status`
    and its JSON; copied and run from there, it resumes the session."""
    env = base_env(**FAST)
    r = ralph(workspace, "--workspace", "demo", "session", "start", "obj", "--id", "p1",
              "--max-iterations", "1", env=env)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "resume with: ralph session resume p1 --workspace demo --max-iterations N" \
        in r.stdout, r.stdout
    status = ralph(workspace, "--workspace", "demo", "session", "status", "p1").stdout
    [said] = [line for line in status.splitlines() if line.startswith("resume: ")]
    command = said.removeprefix("resume: ")
    assert command == "ralph session resume p1 --workspace demo --max-iterations N (N at least 2)"
    view = json.loads(ralph(workspace, "--workspace", "demo", "session", "status", "p1",
                            "--json").stdout)
    assert view["resume_command"] == command
    # inside the workspace, the bare command
    inside = ralph(workspace / "demo", "session", "status", "p1").stdout
    assert "resume: ralph session resume p1 --max-iterations N (N at least 2)" in inside
    argv = command.removesuffix(" (N at least 2)").replace(" N", " 2").split()[1:]
    r = ralph(workspace, *argv, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "session p1 completed" in r.stdout
