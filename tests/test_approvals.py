"""Approvals (`agent.approve`) from the outside: the real `ralph tools approve`, run as a
CLI runs its pre-tool hook (the tool call as JSON on stdin, inside an agent run a real
engine holds open), a human answering with `ralph session answer`, the engine killed with
SIGKILL while a hook waits. The real CLIs' hooks: tests/test_real_approvals.py."""
from __future__ import annotations

import json
import os
import signal

import pytest
import yaml

from ralph.engine.tools.approve import Rule, decision_of, tool_call
from support import (events, finish, question_files, ralph, session_dir, spawn, wait_for,
                     write_config)
from support.scripted import HOOK, recorded, said, script_agent

RULES = {"agent": {"approve": ["Bash(git push*)",
                               {"rule": "WebFetch", "timeout_seconds": 1, "default": "allow"},
                               {"rule": "mcp__*", "timeout_seconds": 1}]}}


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
    assert answered.returncode == 0 and "it allows the call; the tool call waiting for it " \
        "is decided now" in answered.stdout, answered
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
    assert answered.returncode == 0 and "it allows the call when the same unit of work " \
        "makes it again when the session is resumed" in answered.stdout, answered
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
    bad = write_config(workspace, {"RObot": {"timeout_seconds": 3e6}, "agent": {
        "backend": "claude", "command": ["--bare"],
        "approve": ["Bash(", {"rule": "x", "timeout_seconds": -1}, "WebFetch"]}})
    checked = ralph(workspace, "validate", "-c", bad)
    assert checked.returncode == 2
    for line in (
            "$.agent.approve[0].rule: expected a tool name with an optional pattern of its "
            "call in parentheses, e.g. Bash(git push*), WebFetch, mcp__*, got 'Bash('",
            "$.agent.approve[1].timeout_seconds: expected more than 0 and at most 2000000 "
            "seconds, got -1",
            # past ~24 days a CLI's hook (Node) would time out at once: the call run unasked
            "$.agent.approve[2].timeout_seconds: the RObot.timeout_seconds it takes "
            "(3000000.0) is past the 2000000 seconds a tool call can wait: give one",
            "$.agent.command: '--bare' would switch off the hook agent.approve asks through"):
        assert f"{bad}: {line}" in checked.stderr, checked.stderr
    config = script_agent(workspace, "", RULES)
    first = spawn(workspace, "session", "start", "one", "--id", "s1")
    code, _, err = finish(first)
    assert code == 0 and "agent.approve: the planner, executor, reviewer, librarian run an " \
        "agent with no pre-tool hook (command)" in err, err
    # an agent's rewrites of the workspace's ralph.yml that loosen the rules are refused
    doc = yaml.safe_load(config.read_text())
    for rules, why in ((["WebFetch", "mcp__*"], "drops the rule 'Bash(git push*)'"),
                       ([{"rule": "Bash", "default": "allow"}, *RULES["agent"]["approve"]],
                        "lets the rule 'Bash' allow by default")):
        write_config(workspace, {**doc, "agent": {**doc["agent"], "approve": rules}})
        refused = ralph(workspace, "session", "start", "two", "--id", "s2")
        assert refused.returncode == 2, refused
        assert f"$.agent.approve: {why}, unlike session s1, and agents can rewrite this " \
            f"file" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
        checked = ralph(workspace, "validate")   # says what `session start` refuses
        assert checked.returncode == 2 and checked.stderr == refused.stderr, checked


def test_the_strictest_rule_decides_and_an_open_approval_ends_with_its_session(workspace):
    """A rule that allows by default, put above one that denies, does not loosen it; a
    call whose hook died leaves its question open until the session ends, which denies it
    (it takes no answer then)."""
    script_agent(workspace, (HOOK + '''
record("push", approve("claude", "Bash", {"command": "git push"}))
record("ls", approve("claude", "Bash", {"command": "ls"}))
try:
    approve("claude", "Bash", {"command": "sudo rm -rf build"})
except subprocess.TimeoutExpired:   # its CLI gave up on the hook (and killed it)
    record("gave-up", True)
''').replace("timeout=120", "timeout=3"), {"agent": {"approve": [
        {"rule": "Bash", "default": "allow", "timeout_seconds": 1},
        {"rule": "Bash(git push*)", "timeout_seconds": 1},
        {"rule": "Bash(rm -rf*)", "timeout_seconds": 600}]}})
    engine = spawn(workspace, "session", "start", "strict", "--id", "s")
    assert said(recorded(workspace, "push", "s"))["permissionDecision"] == "deny"
    assert said(recorded(workspace, "ls", "s"))["permissionDecision"] == "allow"
    assert recorded(workspace, "gave-up", "s") is True
    code, out, err = finish(engine)
    assert code == 0, out + err
    sd = session_dir(workspace, "s")
    last = approvals(sd)
    assert sorted(q["status"] for q in last) == ["cancelled", "timed_out", "timed_out"]
    decided = [e["payload"] for e in events(sd) if e["topic"] == "approval.decided"]
    assert [(d["decision"], d["by"]) for d in decided] == [
        ("deny", "timeout"), ("allow", "timeout"), ("deny", "session_end")], decided
    late = ralph(workspace, "session", "answer", "s", "allow",
                 "--question", next(q["id"] for q in last if q["status"] == "cancelled"))
    assert late.returncode == 2 and "cancelled" in late.stderr, late


@pytest.mark.parametrize("rule,tool,call,hit", [
    ("Bash(git push*)", "Bash", "git push --force", True),
    ("Bash(git push*)", "Bash", "cd x && GIT_DIR=y  git  push", True),
    ("Bash(git push*)", "Bash", "echo $(sudo git push)", True),
    ("Bash(git push*)", "Bash", "git status", False),
    ("Bash(git push*)", "Bash", "if true; then sudo -u ci /usr/bin/git push; fi", True),
    ("Bash(git push*)", "Bash", "bash -lc 'cd x && git push'", True),
    ("Bash(git push*)", "Bash", 'FOO="a b" timeout -s KILL 5 git push', True),
    ("Bash(git push *)", "Bash", "git push", True),
    ("Bash(git push *)", "Bash", "git pushy", False),
    ("Bash(*git*push*)", "Bash", "git " * 100_000, False),   # linear: no backtracking
    ("Bash(npm run test:*)", "Bash", "npm run test", True),
    ("Bash(npm run test:*)", "Bash", "npm run test -- -k x", True),
    ("Bash(npm run test:*)", "Bash", "npm run testing", False),
    ("mcp__*", "mcp__github__create_issue", "{}", True),
    ("WebFetch(https://*.example.com/*)", "WebFetch", "https://api.example.com/x", True),
    ("WebFetch(https://*.example.com/*)", "WebFetch", "https://evil.test/", False),
])
def test_rule_syntax(rule, tool, call, hit):
    assert Rule(rule).matches(tool, call) is hit


def test_a_call_cut_short_matches_any_pattern_of_its_tool():
    """The hook sends at most 64 KiB of a call: what was cut could be what a rule names."""
    assert Rule("Bash(git push*)").matches("Bash", "echo x", cut=True)
    assert not Rule("Bash(git push*)").matches("WebFetch", "x", cut=True)


def test_each_clis_tools_in_the_rules_words():
    assert tool_call("gemini", "run_shell_command", {"command": "ls"}) == ("Bash", "ls")
    # codex says `Bash` for its shell; its file edits are patches: the files they touch
    assert tool_call("codex", "apply_patch", {"command": "*** Begin Patch\n*** Update File: "
                     "/etc/hosts\n@@\n*** Add File: a.txt\n*** End Patch"}) == \
        ("Edit", "/etc/hosts\na.txt")
    assert Rule("Edit(/etc/*)").matches("Edit", "/etc/hosts\na.txt")
    # gemini's web_fetch has a prompt with its URLs in it
    assert tool_call("gemini", "web_fetch", {"prompt": "sum up https://evil.test/x"}) == \
        ("WebFetch", "https://evil.test/x")
    assert tool_call("claude", "Write", {"file_path": "/etc/x", "content": "y"}) == \
        ("Write", "/etc/x")


@pytest.mark.parametrize("text,decision", [
    ("allow", (True, None)), (" Yes ", (True, None)), ("deny", (False, None)),
    ("deny: not on main", (False, "not on main")), ("deny - too risky", (False, "too risky")),
    ("nothing like that", (False, "nothing like that")), ("alow", (False, "alow")),
    ("OK.", (True, None)), ("no problem", (False, "no problem"))])
def test_an_answer_as_a_decision(text, decision):
    assert decision_of(text) == decision


def test_a_large_call_no_rule_names_passes_and_one_a_rule_may_name_is_asked(workspace):
    """The hook sends the engine at most 64 KiB of a call: a 2 MB file written passes
    when no rule names its tool; a 100 KB command is asked about whatever it says past
    the cut (there the rule's pattern could match)."""
    script_agent(workspace, HOOK + '''
record("big-write", approve("gemini", "write_file", {"file_path": "/tmp/x",
                                                     "content": "x" * 2_000_000}))
record("long", approve("claude", "Bash", {"command": "echo " + "y" * 100_000}))
''', {"agent": {"approve": [{"rule": "Bash(git push*)", "timeout_seconds": 1}]}})
    engine = spawn(workspace, "session", "start", "large", "--id", "s")
    big = recorded(workspace, "big-write", "s")
    assert big["code"] == 0 and big["out"] == "", big   # gemini's "no decision"
    long = said(recorded(workspace, "long", "s"))
    assert long["permissionDecision"] == "deny" and "nobody answered" in \
        long["permissionDecisionReason"], long
    code, out, err = finish(engine)
    assert code == 0, out + err
    [asked] = [e["payload"] for e in events(session_dir(workspace, "s"))
               if e["topic"] == "approval.asked"]
    assert asked["rule"] == "Bash(git push*)" and len(asked["call"]) == 2000
