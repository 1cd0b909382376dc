"""Presets: one small object per agent CLI, owning what it takes to run that CLI unattended.

Each knows its program and how to install it, its argv for the current CLI version, how
the prompt reaches it, the environment it needs, and how to read its output: the final
words (where a planner's LOOP_COMPLETE stands), the tokens, and the cost where the CLI
reports one. A price table turns tokens into USD where it does not, so `max_cost_usd`
holds for every preset. `preflight` says in one line what stops the CLI from running
here, before a session is created.
"""
from __future__ import annotations

import glob
import json
import os
import re
from datetime import timedelta

from ..config import Backend, PromptMode
from .preset import (ARG_LIMIT, ApprovalHook, McpServer, Preset, QuotaSeen, RunEnd, RunReport,
                     RunSetup, UsageLimit,
                     as_dict, claude_words, conversation_id, count, input_tokens, json_document,
                     json_lines, limit_words, reported_usd, resume_args, write_private)
from .approval_hooks import GEMINI_HOME, claude_settings, codex_hook, gemini_home
from .quota_readers import claude_quota, codex_quota
from .resets import MAX_AHEAD, aware, clock, epoch

__all__ = ["ARG_LIMIT", "ApprovalHook", "McpServer", "Preset", "RunEnd", "RunReport", "RunSetup", "UsageLimit",
           "reported_usd", "write_private", "PRESETS", "Command", "Demo", "Claude", "Codex",
           "Gemini"]


class Command(Preset):
    """Any program, as `agent.command` gives it."""
    name = "command"
    install = "check agent.command in ralph.yml"

    def __init__(self, argv: list[str], prompt_mode: PromptMode):
        self.program, self.args = argv[0], tuple(argv[1:])
        self.prompt_mode = prompt_mode


class Demo(Command):
    """The bundled demo agent. It says a usage limit and its conversation's id as a real
    CLI does (a JSON line each, see engine/demo_agent.py), so every path of the engine's
    handling is rehearsed with no network and no model."""
    name = "demo"
    resumes = True

    def __init__(self, argv: list[str]):
        super().__init__(argv, PromptMode.STDIN)

    def argv(self, extra: list[str], setup: RunSetup) -> list[str]:
        argv = super().argv(extra, setup)
        return argv + ["--resume", setup.conversation] if setup.conversation else argv

    def limit(self, end: RunEnd) -> UsageLimit | None:
        said = next((e for e in json_lines(end.stdout) if e.get("type") == "usage_limit"),
                    None)
        if said is None:
            return None
        return UsageLimit(epoch(said.get("resets_at"), end.now),
                          str(said.get("message") or "usage limit reached"))

    def conversation(self, end: RunEnd) -> str | None:
        said = next((e for e in json_lines(end.stdout) if e.get("type") == "conversation"),
                    None)
        return str(said["id"])[:200] if said and said.get("id") else None

    def quota(self, end: RunEnd) -> tuple[QuotaSeen, ...]:
        """Said as Claude Code says it (a script prints its `rate_limit_event` lines)."""
        return claude_quota(end)


class Claude(Preset):
    """Claude Code. `--dangerously-skip-permissions` is refused as root (containers, CI):
    instead its tools are allowed by name, which works for every user."""
    name = "claude"
    program = "claude"
    install = "npm install -g @anthropic-ai/claude-code"
    args = ("--print", "--output-format", "stream-json", "--verbose",
            "--permission-mode", "acceptEdits", "--allowedTools", "Bash")
    price_per_mtok = (3.0, 15.0)
    refused_as_root = ("--dangerously-skip-permissions",)
    supports_mcp = True
    resumes = True
    BASH_TIMEOUT_MS = (120_000, 600_000)     # its Bash tool's default and maximum
    # "You've hit your 5-hour limit · resets 10:16pm (UTC)", "resets Nov 29, 11:17pm (...)"
    RESETS = re.compile(r"resets (?:(?P<mon>[A-Z][a-z]{2}) (?P<day>\d{1,2}), "
                        r"(?:(?P<year>\d{4}), )?)?(?P<h>\d{1,2})(?::(?P<m>\d{2}))?"
                        r"(?P<ap>am|pm) \((?P<tz>[A-Za-z0-9_+/-]{1,64})\)")

    def argv(self, extra: list[str], setup: RunSetup) -> list[str]:
        argv = [self.program, *self.args, *resume_args("--resume", setup), *extra]
        if setup.mcp is not None:
            # its tools allowed by name, like Bash; the server's environment taken from
            # the CLI's own (`${NAME}`, which it expands): the session's id never in argv
            argv[argv.index("Bash")] = "Bash mcp__ralph"
            argv += ["--mcp-config", json.dumps({"mcpServers": {"ralph": {
                "type": "stdio", "command": setup.mcp.command, "args": setup.mcp.args,
                "env": {name: "${" + name + "}" for name in setup.mcp.env}}}})]
        # a lane's outbox is outside its worktree: the work areas' folder (no session id)
        lane = os.path.dirname(setup.work_dir) if setup.tree else None
        return argv + claude_settings(setup.approve, lane)

    def env(self, setup: RunSetup) -> dict[str, str]:
        # a blocking `ask` (a shell command or an MCP call) must not outlive its tool's
        # timeout
        wait_ms = setup.tool_wait_seconds * 1000
        default, most = self.BASH_TIMEOUT_MS
        env = {"BASH_DEFAULT_TIMEOUT_MS": str(max(default, wait_ms)),
               "BASH_MAX_TIMEOUT_MS": str(max(most, wait_ms)),
               "MCP_TOOL_TIMEOUT": str(wait_ms)}
        if setup.mcp is not None:
            # ralph's tools listed from the first turn, not deferred behind a tool search
            env["ENABLE_TOOL_SEARCH"] = "false"
        return env

    def unset(self, setup: RunSetup) -> tuple[str, ...]:
        # what --bare and --safe-mode set: either switches every hook off, the approvals' too
        return ("CLAUDE_CODE_SIMPLE", "CLAUDE_CODE_SAFE_MODE") if setup.approve else ()

    def report(self, stdout: str) -> RunReport:
        """stream-json: the `result` line has the final text, the usage and the cost; a
        run stopped before it keeps the usage of each assistant message it streamed."""
        text, per_message = "", {}
        for event in json_lines(stdout):
            if event.get("type") == "result":
                usage = event.get("usage") or {}
                return RunReport(text=str(event.get("result") or ""),
                                 input_tokens=input_tokens(usage),
                                 output_tokens=count(usage.get("output_tokens")),
                                 cost_usd=reported_usd(event.get("total_cost_usd")))
            message = event.get("message") if event.get("type") == "assistant" else None
            if isinstance(message, dict):
                usage = message.get("usage") or {}
                per_message[message.get("id")] = (input_tokens(usage),
                                                  count(usage.get("output_tokens")))
                said = [b.get("text", "") for b in message.get("content") or []
                        if isinstance(b, dict) and b.get("type") == "text"]
                text = "".join(said) or text
        return RunReport(text=text, input_tokens=sum(i for i, _ in per_message.values()),
                         output_tokens=sum(o for _, o in per_message.values()))

    def limit(self, end: RunEnd) -> UsageLimit | None:
        """stream-json: a subscriber's limit is a `rate_limit_event` whose status is
        `rejected`, its reset in epoch seconds (`resetsAt`), and an error message "You've
        hit your ... limit · resets <time> (<tz>)"; with an API key, a 429 and no reset.
        An `allowed` event, or a result that is no error, is a run the limit did not stop."""
        now = aware(end.now)
        limited, until, said = False, None, ""
        for event in json_lines(end.stdout):
            kind = event.get("type")
            if kind == "rate_limit_event":
                info = as_dict(event.get("rate_limit_info"))
                if info.get("status") == "rejected":
                    limited = True
                    until = epoch(info.get("resetsAt"), now) or until
            elif kind in ("assistant", "result") and (
                    event.get("api_error") == "usage_limit_reached"
                    or event.get("api_error_status") == 429
                    and (event.get("error") == "rate_limit" or event.get("is_error") is True)):
                limited = True
                info = as_dict(as_dict(event.get("api_error_params")).get("rate_limit_info"))
                until = epoch(info.get("resetsAt"), now) or until
                said = claude_words(event) or said
            if kind == "result" and event.get("is_error") is not True:
                limited, until = False, None
        if not limited:
            return None
        if until is None:
            found = self.RESETS.search(said)
            until = clock(found, found["tz"], now) if found else None
        return UsageLimit(until, limit_words(said or "rate limit rejected"))

    def quota(self, end: RunEnd) -> tuple[QuotaSeen, ...]:
        return claude_quota(end)

    def conversation(self, end: RunEnd) -> str | None:
        """Every stream-json line carries the session's id, the init line first."""
        for event in json_lines(end.stdout):
            found = conversation_id(event.get("session_id"))
            if found:
                return found
        return None


class Codex(Preset):
    """OpenAI Codex CLI (`codex exec`). Outside a git repository it needs
    --skip-git-repo-check; `--full-auto` is gone (0.169): the workspace-write sandbox lets
    it edit the workspace, where the session's files are. It prints no cost: tokens are
    priced."""
    name = "codex"
    program = "codex"
    install = "npm install -g @openai/codex"
    args = ("exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write",
            "--color", "never")
    price_per_mtok = (1.25, 10.0)
    supports_mcp = True
    resumes = True
    HIT = re.compile(r"You[’']ve hit your usage limit")
    # other 429s (a rate limit with no retry-after): it gives up at once, with no reset
    GAVE_UP = re.compile(r"exceeded retry limit, last status: 429")
    TRY_AGAIN = re.compile(r"[Tt]ry again at (?:(?P<mon>[A-Z][a-z]{2}) (?P<day>\d{1,2})"
                           r"(?:st|nd|rd|th), (?P<year>\d{4}) )?(?P<h>\d{1,2}):(?P<m>\d{2}) "
                           r"(?P<ap>AM|PM)")

    def argv(self, extra: list[str], setup: RunSetup) -> list[str]:
        wiring = []
        if setup.mcp is not None:
            server = "mcp_servers.ralph."
            # the server's environment passed on by name from the CLI's own: the
            # session's id never in argv
            for key, value in (("command", json.dumps(setup.mcp.command)),
                               ("args", json.dumps(setup.mcp.args)),
                               ("env_vars", json.dumps(sorted(setup.mcp.env))),
                               ("tool_timeout_sec", str(setup.tool_wait_seconds)),
                               # the first turn waits for its tools (it starts in ~1 s)
                               ("required", "true"), ("startup_timeout_sec", "60"),
                               # its calls need no approval (exec's policy is `never`)
                               ("default_tools_approval_mode", '"approve"')):
                wiring += ["-c", f"{server}{key}={value}"]
        if setup.tree is not None:   # its sandbox lets the tools write the work area too:
            # the workspace's work root (its name holds no session id), as a run in the
            # workspace may
            wiring += ["--add-dir", os.path.dirname(setup.work_dir)]
        # after the user's flags, whose `-c` would override it
        hook = codex_hook(setup.approve) if setup.approve is not None else []
        # `resume` takes exec's flags before it (it refuses --sandbox and --color after)
        return [self.program, *self.args, *wiring, *extra, *hook,
                *resume_args("resume", setup), "-"]   # "-": the prompt on stdin

    def env(self, setup: RunSetup) -> dict[str, str]:
        # it says when a usage limit resets in its local time, without the zone
        return {"TZ": "UTC"}

    def report(self, stdout: str) -> RunReport:
        text, inp, out = "", 0, 0
        for event in json_lines(stdout):
            item = event.get("item")
            if event.get("type") == "item.completed" and isinstance(item, dict) \
                    and item.get("type") == "agent_message":
                text = str(item.get("text") or "")
            elif event.get("type") == "turn.completed":
                usage = event.get("usage") or {}
                inp += count(usage.get("input_tokens"))
                out += count(usage.get("output_tokens"))
        return RunReport(text=text, input_tokens=inp, output_tokens=out)

    def limit(self, end: RunEnd) -> UsageLimit | None:
        """--json says a usage limit only in words: "You’ve hit your usage limit. ... try
        again at 10:10 PM." (in UTC: env), or "Try again at Nov 27th, 2026 10:10 PM."."""
        said = None
        for event in json_lines(end.stdout):
            kind = event.get("type")
            message = event.get("message") if kind == "error" else \
                as_dict(event.get("error")).get("message") if kind == "turn.failed" else None
            if isinstance(message, str) and (self.HIT.search(message)
                                             or self.GAVE_UP.search(message)):
                said = message
            elif kind == "turn.completed":
                said = None
        if said is None:
            return None
        found = self.TRY_AGAIN.search(said) if self.HIT.search(said) else None
        until = clock(found, "UTC", aware(end.now)) if found else None
        return UsageLimit(until, limit_words(said))

    def conversation(self, end: RunEnd) -> str | None:
        for event in json_lines(end.stdout):
            if event.get("type") == "thread.started":
                return conversation_id(event.get("thread_id"))
        return None

    def quota(self, end: RunEnd) -> tuple[QuotaSeen, ...]:
        return codex_quota(self.conversation(end), end.now)


class Gemini(Preset):
    """Gemini CLI, headless: the prompt on stdin, `-p` adds a line after it."""
    name = "gemini"
    program = "gemini"
    install = "npm install -g @google/gemini-cli"
    args = ("--approval-mode", "yolo", "--skip-trust", "--output-format", "json",
            "-p", "Follow the instructions above.")
    price_per_mtok = (1.25, 10.0)
    resumes = True
    LIMIT_EXIT = 173     # it exits with the HTTP status, 429, which the shell sees mod 256
    # the delay the API asked for, relative; a daily quota says none
    RETRY = re.compile(r"(?:Suggested retry after|Please retry in) ([0-9]{1,12}(?:\.[0-9]{1,9})?)"
                       r"(ms|s)\b")

    def argv(self, extra: list[str], setup: RunSetup) -> list[str]:
        if setup.approve is not None:
            gemini_home(setup)
        return [self.program, *self.args, *resume_args("--resume", setup), *extra]

    def env(self, setup: RunSetup) -> dict[str, str]:
        if setup.approve is None:
            return {}
        # the workspace's .gemini/settings.json is never read (it could switch hooks off)
        return {"GEMINI_CLI_HOME": setup.log_base + GEMINI_HOME,
                "GEMINI_CLI_TRUST_WORKSPACE": "false"}

    def limit(self, end: RunEnd) -> UsageLimit | None:
        """A 429 it gave up on: exit 173 and, on stderr after its stack dumps, {"session_id",
        "error": {"message", "code": 429}}; the message may end "Suggested retry after 400s."."""
        error = as_dict(json_document(end.stdout, end.stderr).get("error"))
        if end.exit_code != self.LIMIT_EXIT and error.get("code") != 429:
            return None
        said = error.get("message")
        said = said if isinstance(said, str) else end.stderr[-2000:].strip()
        delays = self.RETRY.findall(said)
        until = None
        if delays:
            amount, unit = delays[-1]
            seconds = float(amount) / (1000 if unit == "ms" else 1)
            if seconds <= MAX_AHEAD.total_seconds():
                until = aware(end.now) + timedelta(seconds=seconds)
        return UsageLimit(until, limit_words(said or "rate limit (429)"))

    def conversation(self, end: RunEnd) -> str | None:
        """The json output's session_id, if the CLI can resume that session: one the model
        has answered in (after a limit on the first request it keeps only the prompt, and
        `--resume` says "No previous sessions found")."""
        found = conversation_id(json_document(end.stdout, end.stderr).get("session_id"))
        return found if found and self._answered(found) else None

    @staticmethod
    def _answered(session: str) -> bool:
        # ~/.gemini/tmp/<project>/chats/session-<time>-<first 8 of its id>.jsonl, JSON
        # lines without spaces; a model's message is {"type":"gemini",...} (in a string
        # those quotes would be escaped)
        home = os.environ.get("GEMINI_CLI_HOME") or os.path.expanduser("~")
        for path in glob.glob(os.path.join(glob.escape(home), ".gemini", "tmp", "*", "chats",
                                           f"session-*-{session[:8]}.json*")):
            try:
                with open(path, encoding="utf-8", errors="replace") as chat:
                    if any('"type":"gemini"' in line for line in chat):
                        return True
            except OSError:
                continue
        return False

    def report(self, stdout: str) -> RunReport:
        """--output-format json: {"response": ..., "stats": {"models": {m: {"tokens":
        {"prompt", "candidates", ...}}}}}."""
        start = stdout.find("{")
        try:   # one JSON document, printed over several lines
            result = json.loads(stdout[start:]) if start != -1 else {}
        except ValueError:
            result = {}
        result = result if isinstance(result, dict) else {}
        inp = out = 0
        models = (result.get("stats") or {}).get("models") or {}
        for model in models.values() if isinstance(models, dict) else ():
            tokens = model.get("tokens") or {} if isinstance(model, dict) else {}
            inp += count(tokens.get("prompt"))
            out += count(tokens.get("candidates"))
        return RunReport(text=str(result.get("response") or stdout), input_tokens=inp,
                         output_tokens=out)


class Copilot(Preset):
    name = "copilot"
    program = "copilot"
    install = "npm install -g @github/copilot"
    args = ("--allow-all-tools", "--no-color", "-p")
    prompt_mode = PromptMode.ARG


class Opencode(Preset):
    name = "opencode"
    program = "opencode"
    install = "npm install -g opencode-ai"
    args = ("run", "--auto")
    prompt_mode = PromptMode.ARG


class Amp(Preset):
    name = "amp"
    program = "amp"
    install = "npm install -g @sourcegraph/amp"
    args = ("-x",)    # execute mode: the prompt on stdin, the last message printed


class Kiro(Preset):
    name = "kiro"
    program = "kiro-cli"
    install = "see kiro.dev for kiro-cli"
    args = ("chat", "--no-interactive", "--trust-all-tools")
    prompt_mode = PromptMode.ARG


PRESETS: dict[Backend, Preset] = {Backend(p.name): p for p in (
    Claude(), Codex(), Gemini(), Kiro(), Amp(), Copilot(), Opencode())}
