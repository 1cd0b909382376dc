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
import os
import re
import signal
import sys

# A rule is a tool name (`*` matches any run of characters: `mcp__*`) with an optional
# pattern of its call in parentheses, as Claude Code writes permission rules:
# `Bash(git push*)`, `Bash(npm run test:*)` and `Bash(git push *)` (these words, then
# anything or nothing), `WebFetch(https://*.example.com/*)`, `Write(/etc/*)`.
RULE = re.compile(r"(?P<tool>[A-Za-z0-9_.*-]{1,200})(?:\((?P<pattern>.+)\))?", re.S)
MAX_RULE = 1000
# each CLI's names for the tools a rule names in Claude Code's words
TOOL_NAMES = {
    "codex": {"apply_patch": "Edit"},   # (its shell is `Bash` already)
    "gemini": {"run_shell_command": "Bash", "web_fetch": "WebFetch",
               "google_web_search": "WebSearch", "write_file": "Write", "replace": "Edit",
               "read_file": "Read"},
}
# which field of a tool's input its pattern is matched against (else the input as JSON)
SUBJECT = {"Bash": "command", "WebFetch": "url", "WebSearch": "query", "Read": "file_path",
           "Edit": "file_path", "Write": "file_path", "NotebookEdit": "notebook_path"}
# a shell command's parts, each matched on its own: `cd x && git push` pushes
_PARTS = re.compile(r"&&|\|\||[;|&\n`]|\$\(|[(){}]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "time", "exec",
             "builtin", "command", "nohup", "eval"}
# wrappers whose options go before the command they run (`sudo -u x git push`)
_WRAPPERS = {"sudo", "env", "nice", "timeout", "xargs", "doas", "stdbuf", "ionice"}
# their options that take the next word as a value (`sudo -u root`, `nice -n 5`)
_VALUED = {"-u", "-g", "-n", "-s", "-k", "-C", "-D", "-p", "-U", "-h", "-r", "-t", "-I",
           "-L", "-P", "-S", "-c", "-E"}
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh"}
_URL = re.compile(r"https?://[^\s\"'<>]+")
_PATCHED = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+)$", re.M)
MAX_TOOL = 200         # characters of a tool's name
MAX_CALL = 64 * 1024   # of a call, what is matched (and sent): past it, "cut"
MAX_INPUT = 64 << 20   # a tool call as its CLI gives it (a Write carries its file)
CLIS = ("claude", "codex", "gemini")
ALLOW_WORDS = {"allow", "allowed", "approve", "approved", "yes", "y", "ok"}


class Glob:
    """A pattern where `*` matches any run of characters, matched in linear time (a
    regular expression of many `*` backtracks for minutes on a long command)."""

    def __init__(self, text: str, prefix: bool = False):
        self.chunks = text.split("*")
        self.prefix = prefix   # these words, then nothing or a space and anything

    def match(self, text: str) -> bool:
        if self.prefix:
            words = self.chunks[0]
            return text == words or text.startswith(words) and text[len(words)].isspace()
        if len(self.chunks) == 1:
            return text == self.chunks[0]
        first, *middle, last = self.chunks
        if len(text) < len(first) + len(last) or not text.startswith(first) \
                or not text.endswith(last):
            return False
        at, end = len(first), len(text) - len(last)
        for chunk in middle:
            found = text.find(chunk, at, end)
            if found == -1:
                return False
            at = found + len(chunk)
        return True


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
        self.tool = Glob(self.tool_text)
        pattern = found["pattern"]
        if pattern is None:
            self.call = None
        elif pattern.endswith((":*", " *")) and "*" not in pattern[:-2]:
            self.call = Glob(pattern[:-2], prefix=True)   # Claude Code's prefix rules
        else:
            self.call = Glob(pattern)

    def matches(self, tool: str, call: str, cut: bool = False) -> bool:
        """Whether the rule names this call. A call cut short (past MAX_CALL) matches any
        pattern of its tool: what was cut could be what the pattern names."""
        if not self.tool.match(tool):
            return False
        if self.call is None or cut:
            return True
        parts = shell_parts(call) if tool == "Bash" else [call, *call.splitlines()]
        return any(self.call.match(part) for part in parts)


def shell_parts(command: str, depth: int = 0) -> list[str]:
    """The whole command and each simple command in it, as its words say it: without the
    keywords, variable assignments and wrappers (`sudo -u x`, `env -i`, `timeout 5`)
    before it, the program by its name (`/usr/bin/git` is `git`), spaces collapsed;
    `bash -c '...'` and `eval '...'` looked into."""
    import shlex
    parts = [command]
    for part in _PARTS.split(command.replace("\\\n", " ")):
        try:
            words = shlex.split(part, comments=False)
        except ValueError:   # an unclosed quote: its words as written
            words = part.split()
        while words and (words[0] in _KEYWORDS or _ASSIGNMENT.match(words[0])):
            words = words[1:]
        while words and os.path.basename(words[0]) in _WRAPPERS:
            words = words[1:]
            while words and (words[0].startswith("-") or _ASSIGNMENT.match(words[0])
                             or words[0].replace(".", "").isdigit()):
                words = words[2:] if words[0] in _VALUED and len(words) > 1 else words[1:]
        if not words:
            continue
        words[0] = os.path.basename(words[0])
        parts.append(" ".join(words))
        script = words[words.index("-c") + 1] if words[0] in _SHELLS and "-c" in words[:-1] \
            else " ".join(words[1:]) if words[0] == "eval" else None
        if script and depth < 3:
            parts += shell_parts(script, depth + 1)
    return parts


def tool_call(cli: str, name, tool_input) -> tuple[str, str]:
    """A CLI's tool call in the rules' words: (the tool's name, what its pattern is matched
    against: the command, the URL(s), the file(s), else the input as JSON)."""
    name = str(name)
    tool = TOOL_NAMES.get(cli, {}).get(name, name)
    if not isinstance(tool_input, dict):
        return tool, json.dumps(tool_input, ensure_ascii=False, sort_keys=True)
    if name == "apply_patch":   # codex: the files its patch touches, a line each
        patch = tool_input.get("command") or tool_input.get("input")
        if isinstance(patch, str):
            return tool, "\n".join(_PATCHED.findall(patch))
    if name == "web_fetch" and isinstance(tool_input.get("prompt"), str):   # gemini
        return tool, "\n".join(_URL.findall(tool_input["prompt"]))
    field = SUBJECT.get(tool)
    value = tool_input.get(field) if field else None
    if field == "file_path" and value is None:
        value = tool_input.get("absolute_path") or tool_input.get("path")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        import shlex   # an argv: matched as the command line it is
        value = shlex.join(value)
    if isinstance(value, str):
        return tool, value
    return tool, json.dumps(tool_input, ensure_ascii=False, sort_keys=True)


def decision_of(text: str) -> tuple[bool, str | None]:
    """An answer as a decision: (allowed, the reason for the agent). `allow` (yes, ok)
    allows; `deny` (no) denies; anything else denies with those words ("deny: not on
    main" keeps "not on main"; "no problem" denies, with those words)."""
    said = " ".join(text.split())
    folded = said.casefold().rstrip(".!")
    if folded in ALLOW_WORDS:
        return True, None
    if folded in ("deny", "denied", "no", "n"):
        return False, None
    if folded.startswith("deny") and not folded[4:5].isalnum():
        said = said[4:].lstrip(" :,;-–—")
    return False, said or None


# --- the hook ---

def _tell(cli: str, decision: str, reason: str | None = None) -> int:
    """Print the decision (allow | deny) as this CLI reads it; exit 0, which every CLI
    needs to read it (an exit 2 blocks only with words on stderr, 1 runs the call)."""
    if cli == "gemini":
        said = {"decision": decision, **({"reason": reason} if reason else {})}
    else:
        said = {"hookSpecificOutput": {
            "hookEventName": "PreToolUse", "permissionDecision": decision,
            **({"permissionDecisionReason": reason} if reason else {})}}
    print(json.dumps(said), flush=True)
    return 0


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
            return _tell(cli, "deny", "ralph: the hook was given no tool call to approve")
        from .client import request
        from .emit import session_dir
        tool, subject = tool_call(cli, call["tool_name"], call.get("tool_input"))
        reply = request(session_dir(None), "approve", {
            "tool": tool[:MAX_TOOL], "call": subject[:MAX_CALL], "cut": len(subject) > MAX_CALL})
    except KeyboardInterrupt:
        return _tell(cli, "deny", "ralph: the wait for approval was cut short: the call is "
                                  "denied")
    except Exception as e:   # a hook that fails lets its CLI run the call: never fail open
        return _tell(cli, "deny", f"ralph could not ask for approval, so the call is denied: "
                                  f"{type(e).__name__}: {e}")
    decision = reply.get("decision")
    if decision == "pass":
        return 0
    reason = reply.get("reason") if isinstance(reply.get("reason"), str) else None
    return _tell(cli, "allow" if decision == "allow" else "deny", reason)
