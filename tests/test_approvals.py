"""Approvals (`agent.approve`) from the outside: the real `ralph tools approve`, run as a
CLI runs its pre-tool hook (the tool call as JSON on stdin, inside an agent run a real
engine holds open), a human answering with `ralph session answer`, the engine killed with
SIGKILL while a hook waits. The real CLIs' hooks: tests/test_real_approvals.py."""
from __future__ import annotations

import json
import os
import signal

import pytest

from engine.humans.approvals import decision_of
from engine.tools.approve import Rule, tool_call
from support import (events, finish, question_files, ralph, session_dir, spawn, wait_for,
                     write_config)
from support.scripted import recorded, script_agent

HOOK = '''
def approve(cli, tool_name, tool_input):
    """`ralph tools approve` as the CLI runs it: the call on stdin, the decision out."""
    r = subprocess.run([sys.executable, "-m", "engine", "tools", "approve", "--cli", cli],
                       input=json.dumps({"hook_event_name": "PreToolUse", "tool_name": tool_name,
                                         "tool_input": tool_input}),
                       capture_output=True, text=True, timeout=120)
    return {"code": r.returncode, "out": r.stdout, "err": r.stderr}
'''
RULES = {"agent": {"approve": ["Bash(git push*)",
                               {"rule": "WebFetch", "timeout_seconds": 1, "default": "allow"},
                               {"rule": "mcp__*", "timeout_seconds": 1}]}}


def said(result: dict) -> dict:
    """Claude Code's reading of the hook's stdout: its permission decision."""
    assert result["code"] == 0, result
    return json.loads(result["out"])["hookSpecificOutput"] if result["out"].strip() else {}


def approvals(sd) -> list[dict]:
    return [q for q in question_files(sd) if q["kind"] == "approval"]


def pending(sd) -> list[dict]:
    return [q for q in approvals(sd) if q["status"] == "pending"]


def test_a_call_no_rule_names_passes_a_named_one_waits_for_the_human(workspace):
    script_agent(workspace, HOOK + '''
record("ls", approve("claude", "Bash", {"command": "ls -la"}))
record("push", approve("claude", "Bash", {"command": "cd repo && git push --force"}))
record("fetch", approve("claude", "WebFetch", {"url": "https://example.com"}))
record("mcp", approve("claude", "mcp__github__create_issue", {"title": "x"}))
record("codex", approve("codex", "Bash", {"command": "git push origin main"}))
record("gemini", approve("gemini", "run_shell_command", {"command": "git push"}))
''', RULES)
    engine = spawn(workspace, "session", "start", "approvals", "--id", "s")
    sd = session_dir(workspace, "s")
    assert said(recorded(workspace, "ls", "s")) == {}   # no rule: the CLI's own permissions
    wait_for(lambda: approvals(sd), timeout=30)
    question = approvals(sd)[0]
    assert "Bash: cd repo && git push --force" in question["text"], question
    assert question["options"] == ["allow", "deny"] and question["default"] == "deny"
    assert question["context"]["role"] == "executor" and question["context"]["task"] == "t1"
    answered = ralph(workspace, "session", "answer", "s", "allow")
    assert answered.returncode == 0 and "decided now" in answered.stdout, answered
    assert said(recorded(workspace, "push", "s")) == {
        "hookEventName": "PreToolUse", "permissionDecision": "allow"}
    # unanswered: each rule's default at its deadline
    assert said(recorded(workspace, "fetch", "s"))["permissionDecision"] == "allow"
    mcp = said(recorded(workspace, "mcp", "s"))
    assert mcp["permissionDecision"] == "deny" and "nobody answered" in \
        mcp["permissionDecisionReason"]
    wait_for(lambda: len(approvals(sd)) == 4 and pending(sd), timeout=30)
    ralph(workspace, "session", "answer", "s", "deny: use a pull request",
          "--question", pending(sd)[0]["id"])
    codex = said(recorded(workspace, "codex", "s"))
    assert codex == {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                     "permissionDecisionReason": "Denied by a human (cli): use a pull request"}
    wait_for(lambda: len(approvals(sd)) == 5 and pending(sd), timeout=30)
    ralph(workspace, "session", "answer", "s", "no", "--question", pending(sd)[0]["id"])
    gemini = recorded(workspace, "gemini", "s")
    assert json.loads(gemini["out"]) == {"decision": "deny",
                                         "reason": "Denied by a human (cli)"}, gemini
    code, out, err = finish(engine)
    assert code == 0, out + err
    assert "its tool call waits for approval" in out and "then the call is denied" in out
    bus = events(sd)
    decided = [e["payload"] for e in bus if e["topic"] == "approval.decided"]
    assert [(d["decision"], d["by"]) for d in decided] == [
        ("allow", "human"), ("allow", "timeout"), ("deny", "timeout"), ("deny", "human"),
        ("deny", "human")]
    asked = [e for e in bus if e["topic"] == "approval.asked"]
    assert [a["payload"]["rule"] for a in asked] == [
        "Bash(git push*)", "WebFetch", "mcp__*", "Bash(git push*)", "Bash(git push*)"]
    assert {a["source"] for a in asked} == {"executor"}


def test_an_approval_survives_the_engine_killed_and_decides_the_call_after_resume(workspace):
    """SIGKILL while a hook waits (the run dies with its engine): the question stays
    answerable; answered while no engine runs, it decides the same call of the same task
    once the session is resumed, without asking again."""
    script_agent(workspace, HOOK + '''
attempt = os.environ["RALPH_ATTEMPT"]
record(f"push-{attempt}", approve("claude", "Bash", {"command": "git push"}))
''', RULES)
    engine = spawn(workspace, "session", "start", "approvals", "--id", "s")
    sd = session_dir(workspace, "s")
    wait_for(lambda: approvals(sd), timeout=30)
    os.kill(engine.pid, signal.SIGKILL)
    engine.wait()
    assert approvals(sd)[0]["status"] == "pending"
    answered = ralph(workspace, "session", "answer", "s", "allow")
    assert answered.returncode == 0 and "when the session is resumed" in answered.stdout
    resumed = spawn(workspace, "session", "resume", "s")
    code, out, err = finish(resumed, timeout=90)
    assert code == 0, out + err
    assert said(recorded(workspace, "push-2", "s"))["permissionDecision"] == "allow"
    assert len(approvals(sd)) == 1   # not asked again
    bus = events(sd)
    assert [e["payload"]["decision"] for e in bus if e["topic"] == "approval.reused"] == \
        ["allow"]
    assert [e["payload"].get("asker_gone") for e in bus if e["topic"] == "approval.decided"] \
        == [True]


def test_a_hook_fails_closed(workspace):
    """Outside a run, with no tool call, or cut short, the hook denies: a CLI whose hook
    fails runs the call."""
    bare = ralph(workspace, "tools", "approve", "--cli", "claude", input="not json")
    assert bare.returncode == 0
    assert json.loads(bare.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"
    usage = ralph(workspace, "tools", "approve", input="{}")
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1, usage


def test_rules_are_checked_and_a_workspace_config_cannot_loosen_them(workspace):
    bad = write_config(workspace, {"agent": {"approve": ["Bash(", {"rule": "x",
                                                                   "timeout_seconds": -1}]}})
    checked = ralph(workspace, "validate", "-c", bad)
    assert checked.returncode == 2
    assert "$.agent.approve[0].rule: expected a tool name" in checked.stderr
    assert "$.agent.approve[1].timeout_seconds: expected more than 0" in checked.stderr
    config = script_agent(workspace, "", RULES)
    first = spawn(workspace, "session", "start", "one", "--id", "s1")
    assert finish(first)[0] == 0
    # an agent's rewrite of the workspace's ralph.yml that drops a rule is refused
    write_config(workspace, {**json.loads(json.dumps(_config(config))),
                             "agent": {**_config(config)["agent"], "approve": ["WebFetch"]}})
    refused = ralph(workspace, "session", "start", "two", "--id", "s2")
    assert refused.returncode == 2, refused
    assert "$.agent.approve: drops the rule 'Bash(git push*)' that session s1 started with" \
        in refused.stderr and refused.stderr.count("\n") == 1


def _config(path) -> dict:
    import yaml
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("rule,tool,call,hit", [
    ("Bash(git push*)", "Bash", "git push --force", True),
    ("Bash(git push*)", "Bash", "cd x && GIT_DIR=y  git  push", True),
    ("Bash(git push*)", "Bash", "echo $(sudo git push)", True),
    ("Bash(git push*)", "Bash", "git status", False),
    ("Bash(npm run test:*)", "Bash", "npm run test", True),
    ("Bash(npm run test:*)", "Bash", "npm run test -- -k x", True),
    ("Bash(npm run test:*)", "Bash", "npm run testing", False),
    ("mcp__*", "mcp__github__create_issue", "{}", True),
    ("WebFetch(https://*.example.com/*)", "WebFetch", "https://api.example.com/x", True),
    ("WebFetch(https://*.example.com/*)", "WebFetch", "https://evil.test/", False),
])
def test_rule_syntax(rule, tool, call, hit):
    assert Rule(rule).matches(tool, call) is hit


def test_each_clis_tools_in_the_rules_words():
    assert tool_call("gemini", "run_shell_command", {"command": "ls"}) == ("Bash", "ls")
    assert tool_call("codex", "shell", {"command": ["bash", "-lc", "git push"]}) == \
        ("Bash", "git push")
    assert tool_call("claude", "Write", {"file_path": "/etc/x", "content": "y"}) == \
        ("Write", "/etc/x")


@pytest.mark.parametrize("text,decision", [
    ("allow", (True, None)), (" Yes ", (True, None)), ("deny", (False, None)),
    ("deny: not on main", (False, "not on main")), ("no - too risky", (False, "too risky")),
    ("nothing like that", (False, "nothing like that")), ("alow", (False, "alow"))])
def test_an_answer_as_a_decision(text, decision):
    assert decision_of(text) == decision
