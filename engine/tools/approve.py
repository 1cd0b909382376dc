"""Approvals of risky tool calls (`agent.approve`): the rules, and `ralph tools approve`,
the hook each agent CLI runs before a tool call (Claude Code's and Codex's `PreToolUse`,
Gemini CLI's `BeforeTool`).

The hook decides nothing: it hands the CLI's tool call to the engine (a request in the
outbox, like `tools interact ask`) and tells the CLI what the engine replies: `pass` (no
rule matches: the CLI's own permissions decide), `allow` (a human allowed it) or `deny`
with the reason the agent is shown. The rules are the engine's, from the config the
session started with; the agent's claims in the request are only the call it wants to make.
Whatever goes wrong on the hook's side (no engine, a cut-off wait, input it cannot read)
denies: a CLI runs the tool when its hook merely fails. Stdlib and the outbox only: the
hook runs before every matching tool call.
"""
from __future__ import annotations

import json
import re
import signal
import sys

# A rule is a tool name (`*` matches any run of characters: `mcp__*`) with an optional
# pattern of its call in parentheses, as Claude Code writes permission rules:
# `Bash(git push*)`, `Bash(npm run test:*)` (`:*` at the end: the words, then anything),
# `WebFetch(https://*.example.com/*)`, `Write(/etc/*)`.
RULE = re.compile(r"(?P<tool>[A-Za-z0-9_.*-]{1,200})(?:\((?P<pattern>.+)\))?", re.S)
MAX_RULE = 1000
# each CLI's names for the tools a rule names in Claude Code's words
TOOL_NAMES = {
    "codex": {"shell": "Bash", "exec_command": "Bash", "local_shell": "Bash",
              "apply_patch": "Edit"},
    "gemini": {"run_shell_command": "Bash", "web_fetch": "WebFetch",
               "google_web_search": "WebSearch", "write_file": "Write", "replace": "Edit",
               "read_file": "Read"},
}
# which field of a tool's input its pattern is matched against (else the input as JSON)
SUBJECT = {"Bash": "command", "WebFetch": "url", "WebSearch": "query", "Read": "file_path",
           "Edit": "file_path", "Write": "file_path", "NotebookEdit": "notebook_path"}
# a shell command's parts, each matched on its own: `cd x && git push` pushes
_PARTS = re.compile(r"&&|\|\||[;|&\n`]|\$\(|[()]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*\s+")
_WRAPPERS = ("sudo ", "env ", "nohup ", "time ", "command ", "exec ", "nice ", "builtin ")
MAX_INPUT = 1 << 20
CLIS = ("claude", "codex", "gemini")


class Rule:
    """One `agent.approve` rule, parsed: ValueError saying what was expected."""

    def __init__(self, text: str):
        found = RULE.fullmatch(text) if isinstance(text, str) and len(text) <= MAX_RULE \
            else None
        if found is None:
            raise ValueError("expected a tool name with an optional pattern of its call in "
                             "parentheses, e.g. Bash(git push*), WebFetch, mcp__*")
        self.text = text
        self.tool_text = found["tool"]
        self.tool = _glob(self.tool_text)
        pattern = found["pattern"]
        if pattern is None:
            self.call = None
        elif pattern.endswith(":*"):   # Claude Code's prefix rule: these words, then any
            self.call = re.compile(re.escape(pattern[:-2]) + r"(?:\s.*)?", re.S)
        else:
            self.call = _glob(pattern)

    def matches(self, tool: str, call: str) -> bool:
        if not self.tool.fullmatch(tool):
            return False
        if self.call is None:
            return True
        if tool == "Bash":
            return any(self.call.fullmatch(part) for part in shell_parts(call))
        return bool(self.call.fullmatch(call))


def _glob(text: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(p) for p in text.split("*")), re.S)


def shell_parts(command: str) -> list[str]:
    """The whole command and each simple command in it, without the variable assignments
    and wrappers (`sudo`, `env`, ...) before it, spaces collapsed."""
    parts = [command]
    for part in _PARTS.split(command):
        part = " ".join(part.split())
        while True:
            bare = _ASSIGNMENT.sub("", part, count=1) if _ASSIGNMENT.match(part) else part
            for wrapper in _WRAPPERS:
                if bare.startswith(wrapper):
                    bare = bare[len(wrapper):].lstrip()
            if bare == part:
                break
            part = bare
        if part:
            parts.append(part)
    return parts


def tool_call(cli: str, name, tool_input) -> tuple[str, str]:
    """A CLI's tool call in the rules' words: (the tool's name, what its pattern is matched
    against: the command, the URL, the file, else the input as JSON)."""
    name = str(name)
    tool = TOOL_NAMES.get(cli, {}).get(name, name)
    if not isinstance(tool_input, dict):
        return tool, json.dumps(tool_input, ensure_ascii=False, sort_keys=True)
    field = SUBJECT.get(tool)
    value = tool_input.get(field) if field else None
    if field == "file_path" and value is None:
        value = tool_input.get("absolute_path") or tool_input.get("path")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        import shlex   # codex's shell gives argv: bash -lc "..." is matched as its script
        value = value[-1] if len(value) == 3 and value[1] in ("-c", "-lc") else \
            shlex.join(value)
    if isinstance(value, str):
        return tool, value
    return tool, json.dumps(tool_input, ensure_ascii=False, sort_keys=True)


# --- the hook ---

def _said(cli: str, decision: str, reason: str | None) -> tuple[str, int]:
    """What the hook prints and its exit code, for this CLI and decision (allow | deny)."""
    if cli == "gemini":
        said = {"decision": decision}
        if reason:
            said["reason"] = reason
        return json.dumps(said), 0
    said = {"hookEventName": "PreToolUse", "permissionDecision": decision}
    if reason:
        said["permissionDecisionReason"] = reason
    return json.dumps({"hookSpecificOutput": said}), 0


def _deny(cli: str, reason: str) -> int:
    out, code = _said(cli, "deny", reason)
    print(out, flush=True)
    return code


def _stopped(_signum, _frame):
    raise KeyboardInterrupt   # the CLI gave up on its hook: the call is denied


def main(argv: list[str]) -> int:
    """`ralph tools approve --cli NAME`: the CLI's tool call on stdin, its decision out."""
    cli = argv[1] if len(argv) == 2 and argv[0] == "--cli" and argv[1] in CLIS else None
    if cli is None:
        print(f"usage: ralph tools approve --cli {{{','.join(CLIS)}}} (a CLI's hook: its tool "
              f"call as JSON on stdin)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stopped)
    try:
        call = json.loads(sys.stdin.buffer.read(MAX_INPUT + 1) or b"null")
        if not isinstance(call, dict) or not isinstance(call.get("tool_name"), str):
            return _deny(cli, "ralph: the hook was given no tool call to approve")
        from .client import request
        from .emit import session_dir
        reply = request(session_dir(None), "approve", {
            "cli": cli, "tool": call["tool_name"], "input": call.get("tool_input")})
    except KeyboardInterrupt:
        return _deny(cli, "ralph: the wait for approval was cut short: the call is denied")
    except Exception as e:   # a hook that fails lets its CLI run the call: never fail open
        return _deny(cli, f"ralph could not ask for approval, so the call is denied: "
                          f"{type(e).__name__}: {e}")
    decision = reply.get("decision")
    if decision == "pass":
        return 0
    reason = reply.get("reason") if isinstance(reply.get("reason"), str) else None
    out, code = _said(cli, "allow" if decision == "allow" else "deny", reason)
    print(out, flush=True)
    return code
