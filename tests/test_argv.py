"""Issue 31: no session id in any agent's command line, nor in the command line of what
ralph starts for it (its run's supervisor, ralph's MCP server, the approval hook).

The attack: any local user reads every process's command line (`ps`, /proc/PID/cmdline).
The session id sat there: in the path of a `prompt_mode: file` prompt, of Claude Code's
`--mcp-config`, in Codex's `-c mcp_servers.ralph.env=...` and `--add-dir`, and in the
supervisor's (the agent's parent's) argument naming a lane's worktree. Each now comes
through the run's environment (which only the user reads) or a file open at a number.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ralph.engine.agents import PRESETS, ApprovalHook, McpServer, RunSetup
from ralph.engine.agents.presets import Command, Demo
from ralph.engine.config import PromptMode
from support import EVIDENCE, REVIEW_OK, base_env, metadata, ralph, session_dir

SID = "argvsid0417"   # distinctive: found only where the session's id was put


def lane_setup(tmp_path: Path) -> RunSetup:
    """A run as the engine prepares it, the session's id everywhere it could leak from:
    the work area, the logs, a lane's worktree, the MCP server's and the hook's env."""
    work = tmp_path / "ws" / ".ralph-sessions" / SID
    (work / "iterations" / "1" / "logs").mkdir(parents=True)
    env = {"RALPH_SESSION_ID": SID, "RALPH_SESSION_DIR": str(work),
           "RALPH_WORKSPACE": str(tmp_path / "state" / "worktrees" / SID / "t1")}
    return RunSetup(log_base=str(work / "iterations/1/logs/0002-executor-t1"),
                    work_dir=str(work), ask_timeout_seconds=60,
                    mcp=McpServer("/usr/bin/ralph", ["mcp"], env), conversation="c-1",
                    tree=env["RALPH_WORKSPACE"],
                    approve=ApprovalHook(["/usr/bin/ralph"], ("Bash", "mcp__*"), 660, env))


@pytest.mark.parametrize("preset", [*PRESETS.values(), Demo(["demo-agent"]),
                                    *(Command(["my-agent"], m) for m in PromptMode)],
                         ids=lambda p: f"{p.name}-{p.prompt_mode.value}")
def test_no_presets_argv_holds_the_session_id(tmp_path, monkeypatch, preset):
    monkeypatch.setenv("GEMINI_CLI_HOME", str(tmp_path / "home"))
    setup = lane_setup(tmp_path)
    argv = preset.argv(["--model", "m"], setup)
    assert not [a for a in argv if SID in a], argv
    # what it is handed comes from its environment instead
    if preset.name == "codex":
        assert any(a.startswith("mcp_servers.ralph.env_vars=") and "RALPH_SESSION_ID" in a
                   for a in argv)
    if preset.name == "claude":
        config = json.loads(argv[argv.index("--mcp-config") + 1])
        assert config["mcpServers"]["ralph"]["env"]["RALPH_SESSION_ID"] == \
            "${RALPH_SESSION_ID}"


AGENT = r'''
import json, os, subprocess, sys

# what it saw goes to its work area (the one place outside its tree a lane's run writes)
role, out = os.environ["RALPH_ROLE"], os.path.join(os.environ["RALPH_SESSION_DIR"], "seen")
os.makedirs(out, exist_ok=True)
mode = os.environ["ARGV_MODE"]
prompt = sys.stdin.read() if mode == "stdin" else sys.argv[1] if mode == "arg" \
    else open(sys.argv[1]).read()
if mode == "arg" and "RALPH_PROMPT_FILE" in prompt:   # one that names the session
    prompt = open(os.environ["RALPH_PROMPT_FILE"]).read()
assert prompt.startswith("## OBJECTIVE"), prompt[:80]


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode(errors="replace").split("\0")


with open(os.path.join(out, os.environ["RALPH_RUN_ID"] + ".json"), "w") as f:
    json.dump({"self": cmdline("self"), "parent": cmdline(os.getppid()),
               "cwd": os.getcwd()}, f)


def ralph(*args):
    subprocess.run([sys.executable, "-m", "ralph.engine", *args], check=True, timeout=60)


if role == "planner":
    if os.environ["RALPH_ITERATION"] == "1":
        ralph("emit", "plan.ready", "--json", json.dumps({"tasks": [
            {"id": "t1", "title": "T1"}, {"id": "t2", "title": "T2"}]}))
    else:
        ralph("emit", "LOOP_COMPLETE")
elif role == "executor":
    task = os.environ["RALPH_TASK_ID"]
    with open(f"{task}.txt", "w") as f:
        f.write(task + "\n")
    ralph("emit", "build.done", os.environ["ARGV_EVIDENCE"])
elif role == "reviewer":
    ralph("emit", "review.done", os.environ["ARGV_REVIEW"])
'''


def git(ws: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@localhost", *args],
                   cwd=ws, check=True, capture_output=True)


@pytest.mark.parametrize("mode", [m.value for m in PromptMode])
def test_a_real_runs_command_line_and_its_parents_hold_no_session_id(tmp_path, mode):
    """A `command` agent, in a parallel batch (its lanes' worktrees are named after the
    session), records its own /proc/self/cmdline and its parent's (the run's
    supervisor): the session's id is in neither, for each way the prompt reaches it."""
    ws = tmp_path / "ws"
    out = ws / ".ralph-sessions" / SID / "seen"
    ws.mkdir()
    git(ws, "init", "--quiet", "--initial-branch=main")
    (ws / "README").write_text("a project\n")
    git(ws, "add", "README")
    git(ws, "commit", "--quiet", "-m", "start")
    agent, config = tmp_path / "agent.py", tmp_path / "ralph.yml"
    agent.write_text(AGENT)
    config.write_text(yaml.safe_dump({
        "agent": {"backend": "command", "command": [sys.executable, str(agent)],
                  "prompt_mode": mode},
        "event_loop": {"parallel": 2}, "RObot": {"timeout_seconds": 5}}))
    done = ralph(ws, "session", "start", "two files", "-c", config, "--id", SID,
                 env=base_env(ARGV_MODE=mode, ARGV_EVIDENCE=EVIDENCE,
                              ARGV_REVIEW=REVIEW_OK), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert metadata(session_dir(ws, SID))["status"] == "completed"
    seen = [json.loads(p.read_text()) for p in out.iterdir()]
    assert any(SID in s["cwd"] for s in seen)   # a lane's worktree was among them
    assert len(seen) >= 6 and all("engine.running.supervisor" in s["parent"] for s in seen)
    leaks = [s for s in seen if any(SID in a for a in s["self"] + s["parent"])]
    assert not leaks, leaks


def test_a_prompt_too_long_for_an_argument_is_named_by_the_environment(tmp_path):
    """`prompt_mode: arg` with a prompt past ARG_LIMIT: the argument points at
    $RALPH_PROMPT_FILE, the file whose path holds the session's id."""
    from ralph.engine.agents import CommandAgent, Invocation
    from ralph.engine.running import containment
    setup = lane_setup(tmp_path)
    out = tmp_path / "seen.json"
    script = ("import json, os, sys; json.dump({'argv': sys.argv, 'file': "
              "open(os.environ['RALPH_PROMPT_FILE']).read()}, open(sys.argv[1], 'w'))")
    agent = CommandAgent(Command([sys.executable, "-c", script, str(out)], PromptMode.ARG))
    prompt = "## OBJECTIVE\n" + "x" * 200_000
    Path(setup.log_base + ".prompt.md").write_text(prompt)
    outcome = agent.run(Invocation(
        role="executor", prompt=prompt, cwd=str(tmp_path), log_base=setup.log_base,
        timeout=60, env={**base_env(), containment.SESSION_MARK: setup.work_dir,
                         containment.RUN_MARK: "0002-executor-t1"}))
    assert outcome.exit_code == 0, outcome.stderr_tail
    seen = json.loads(out.read_text())
    assert seen["file"] == prompt
    assert "$RALPH_PROMPT_FILE" in seen["argv"][-1]
    assert not [a for a in seen["argv"] if SID in a]
    assert os.path.exists(setup.log_base + ".stdout")
