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
import shutil
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

from session_store import open_beneath

from ..config import Backend, PromptMode

ARG_LIMIT = 100_000   # bytes; Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN)


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a run's output says: its last words, tokens, and the CLI's own cost."""
    text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None      # None: the CLI reports none (priced from tokens)


@dataclass(frozen=True, slots=True)
class UsageLimit:
    """The CLI gave up on a usage or rate limit of its model's API: when the limit resets,
    where it said (an aware datetime), and its own words."""
    until: datetime | None
    text: str


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a run ended, as a preset reads it for a limit or its conversation's id."""
    stdout: str
    stderr: str
    exit_code: int | None
    now: datetime                  # aware: resolves a reset said as a time of day


@dataclass(frozen=True, slots=True)
class McpServer:
    """`ralph mcp` for one run: how its CLI starts it, with the run's environment (CLIs
    pass MCP servers little of their own)."""
    command: str
    args: list[str]
    env: dict[str, str]


@dataclass(frozen=True, slots=True)
class RunSetup:
    """What a preset may need to know of the run it prepares."""
    log_base: str                  # the run's logs: <log_base>.prompt.md, .stdout, .stderr
    work_dir: str                  # the session's work area, where the logs are
    ask_timeout_seconds: float     # how long a human question may block a tool call
    mcp: McpServer | None = None   # wire ralph's MCP server into the CLI (supports_mcp)
    conversation: str | None = None   # continue this conversation of the CLI (resumes)

    @property
    def tool_wait_seconds(self) -> int:
        """How long a tool call may block: a question's timeout and a minute more."""
        return int(self.ask_timeout_seconds + 60)


class Preset:
    name: str
    program: str
    install: str                      # how a user gets the program
    args: tuple[str, ...] = ()
    prompt_mode = PromptMode.STDIN
    price_per_mtok = (0.0, 0.0)       # USD per million (input, output) tokens
    refused_as_root: tuple[str, ...] = ()   # flags the CLI refuses when run as root
    supports_mcp = False              # ralph's MCP server can be wired into a run
    resumes = False                   # argv continues setup.conversation when given

    def argv(self, extra: list[str], setup: RunSetup) -> list[str]:
        return [self.program, *self.args, *extra]

    def env(self, setup: RunSetup) -> dict[str, str]:
        return {}

    def report(self, stdout: str) -> RunReport:
        return RunReport(text=stdout)

    def limit(self, end: RunEnd) -> UsageLimit | None:
        """The usage or rate limit this run ended on, if it did (read from its output)."""
        return None

    def conversation(self, end: RunEnd) -> str | None:
        """The CLI's id for this run's conversation, to continue it (resumes)."""
        return None

    def preflight(self, extra: list[str], path: str | None) -> str | None:
        """Why this CLI cannot run here (one line), or None."""
        if shutil.which(self.program, path=path) is None:
            return f"agent {self.name}: `{self.program}` is not installed (not on the PATH); " \
                   f"{self.install}"
        refused = [a for a in extra if a in self.refused_as_root]
        if refused and os.geteuid() == 0:
            return f"agent {self.name}: {self.program} refuses {refused[0]} when run as root; " \
                   f"drop it from agent.command (the preset runs unattended without it)"
        return None


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
        said = next((e for e in _json_lines(end.stdout) if e.get("type") == "usage_limit"),
                    None)
        if said is None:
            return None
        return UsageLimit(_epoch(said.get("resets_at"), end.now),
                          str(said.get("message") or "usage limit reached"))

    def conversation(self, end: RunEnd) -> str | None:
        said = next((e for e in _json_lines(end.stdout) if e.get("type") == "conversation"),
                    None)
        return str(said["id"])[:200] if said and said.get("id") else None


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
        argv = [self.program, *self.args, *_resume("--resume", setup), *extra]
        if setup.mcp is not None:
            # its tools allowed by name, like Bash; the config in a file of the run's logs
            config = setup.log_base + ".mcp.json"
            write_private(setup.work_dir, config, json.dumps({"mcpServers": {"ralph": {
                "type": "stdio", "command": setup.mcp.command, "args": setup.mcp.args,
                "env": setup.mcp.env}}}))
            argv[argv.index("Bash")] = "Bash mcp__ralph"
            argv += ["--mcp-config", config]
        return argv

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

    def report(self, stdout: str) -> RunReport:
        """stream-json: the `result` line has the final text, the usage and the cost; a
        run stopped before it keeps the usage of each assistant message it streamed."""
        text, per_message = "", {}
        for event in _json_lines(stdout):
            if event.get("type") == "result":
                usage = event.get("usage") or {}
                return RunReport(text=str(event.get("result") or ""),
                                 input_tokens=_input_tokens(usage),
                                 output_tokens=_count(usage.get("output_tokens")),
                                 cost_usd=reported_usd(event.get("total_cost_usd")))
            message = event.get("message") if event.get("type") == "assistant" else None
            if isinstance(message, dict):
                usage = message.get("usage") or {}
                per_message[message.get("id")] = (_input_tokens(usage),
                                                  _count(usage.get("output_tokens")))
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
        now = _aware(end.now)
        limited, until, said = False, None, ""
        for event in _json_lines(end.stdout):
            kind = event.get("type")
            if kind == "rate_limit_event":
                info = _dict(event.get("rate_limit_info"))
                if info.get("status") == "rejected":
                    limited = True
                    until = _epoch(info.get("resetsAt"), now) or until
            elif kind in ("assistant", "result") and (
                    event.get("api_error") == "usage_limit_reached"
                    or event.get("api_error_status") == 429
                    and (event.get("error") == "rate_limit" or event.get("is_error") is True)):
                limited = True
                info = _dict(_dict(event.get("api_error_params")).get("rate_limit_info"))
                until = _epoch(info.get("resetsAt"), now) or until
                said = _claude_words(event) or said
            if kind == "result" and event.get("is_error") is not True:
                limited, until = False, None
        if not limited:
            return None
        if until is None:
            found = self.RESETS.search(said)
            until = _clock(found, found["tz"], now) if found else None
        return UsageLimit(until, _words(said or "rate limit rejected"))

    def conversation(self, end: RunEnd) -> str | None:
        """Every stream-json line carries the session's id, the init line first."""
        for event in _json_lines(end.stdout):
            found = _conversation_id(event.get("session_id"))
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
            env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in setup.mcp.env.items())
            for key, value in (("command", json.dumps(setup.mcp.command)),
                               ("args", json.dumps(setup.mcp.args)),
                               ("env", "{" + env + "}"),
                               ("tool_timeout_sec", str(setup.tool_wait_seconds)),
                               # the first turn waits for its tools (it starts in ~1 s)
                               ("required", "true"), ("startup_timeout_sec", "60"),
                               # its calls need no approval (exec's policy is `never`)
                               ("default_tools_approval_mode", '"approve"')):
                wiring += ["-c", f"{server}{key}={value}"]
        # `resume` takes exec's flags before it (it refuses --sandbox and --color after)
        return [self.program, *self.args, *wiring, *extra,
                *_resume("resume", setup), "-"]   # "-": the prompt on stdin

    def env(self, setup: RunSetup) -> dict[str, str]:
        # it says when a usage limit resets in its local time, without the zone
        return {"TZ": "UTC"}

    def report(self, stdout: str) -> RunReport:
        text, inp, out = "", 0, 0
        for event in _json_lines(stdout):
            item = event.get("item")
            if event.get("type") == "item.completed" and isinstance(item, dict) \
                    and item.get("type") == "agent_message":
                text = str(item.get("text") or "")
            elif event.get("type") == "turn.completed":
                usage = event.get("usage") or {}
                inp += _count(usage.get("input_tokens"))
                out += _count(usage.get("output_tokens"))
        return RunReport(text=text, input_tokens=inp, output_tokens=out)

    def limit(self, end: RunEnd) -> UsageLimit | None:
        """--json says a usage limit only in words: "You’ve hit your usage limit. ... try
        again at 10:10 PM." (in UTC: env), or "Try again at Nov 27th, 2026 10:10 PM."."""
        said = None
        for event in _json_lines(end.stdout):
            kind = event.get("type")
            message = event.get("message") if kind == "error" else \
                _dict(event.get("error")).get("message") if kind == "turn.failed" else None
            if isinstance(message, str) and (self.HIT.search(message)
                                             or self.GAVE_UP.search(message)):
                said = message
            elif kind == "turn.completed":
                said = None
        if said is None:
            return None
        found = self.TRY_AGAIN.search(said) if self.HIT.search(said) else None
        until = _clock(found, "UTC", _aware(end.now)) if found else None
        return UsageLimit(until, _words(said))

    def conversation(self, end: RunEnd) -> str | None:
        for event in _json_lines(end.stdout):
            if event.get("type") == "thread.started":
                return _conversation_id(event.get("thread_id"))
        return None


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
        return [self.program, *self.args, *_resume("--resume", setup), *extra]

    def limit(self, end: RunEnd) -> UsageLimit | None:
        """A 429 it gave up on: exit 173 and, on stderr after its stack dumps, {"session_id",
        "error": {"message", "code": 429}}; the message may end "Suggested retry after 400s."."""
        error = _dict(_json_document(end.stdout, end.stderr).get("error"))
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
                until = _aware(end.now) + timedelta(seconds=seconds)
        return UsageLimit(until, _words(said or "rate limit (429)"))

    def conversation(self, end: RunEnd) -> str | None:
        """The json output's session_id, if the CLI can resume that session: one the model
        has answered in (after a limit on the first request it keeps only the prompt, and
        `--resume` says "No previous sessions found")."""
        found = _conversation_id(_json_document(end.stdout, end.stderr).get("session_id"))
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
            inp += _count(tokens.get("prompt"))
            out += _count(tokens.get("candidates"))
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


def write_private(work_dir: str, path: str, text: str) -> None:
    """A file of the run's, in the work area (never through a planted link)."""
    fd = open_beneath(work_dir, path)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _json_lines(text: str):
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                yield value


def _json_document(*texts: str) -> dict:
    """The last JSON object printed over several lines that starts a line (Gemini's, after
    its banners and stack dumps), from the first text that has one; else {}."""
    decoder = json.JSONDecoder()
    for text in texts:
        end = len(text)
        for _ in range(20):   # a bounded search back through the text's `{` lines
            start = text.rfind("\n{", 0, end)
            at = start + 1 if start != -1 else (0 if text.startswith("{") else -1)
            if at == -1:
                break
            try:
                value, _ = decoder.raw_decode(text, at)
            except ValueError:
                value = None
            if isinstance(value, dict):
                return value
            if at == 0:
                break
            end = start
    return {}


def _claude_words(event: dict) -> str:
    """What an assistant or result line says (a limit's message is its only text)."""
    if event.get("type") == "result":
        said = event.get("result")
        return said if isinstance(said, str) else ""
    blocks = _dict(event.get("message")).get("content")
    return "".join(b["text"] for b in blocks if isinstance(b, dict)
                   and isinstance(b.get("text"), str)) if isinstance(blocks, list) else ""


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


CONVERSATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def _conversation_id(value) -> str | None:
    """A CLI's conversation id as it may go into argv (never an option: no leading `-`)."""
    return value if isinstance(value, str) and CONVERSATION_ID.fullmatch(value) else None


def _resume(flag: str, setup: RunSetup) -> list[str]:
    found = _conversation_id(setup.conversation)
    return [flag, found] if found else []


def _words(text: str) -> str:
    """A CLI's words about its limit, kept short."""
    return text.strip()[:1000]


MAX_AHEAD = timedelta(days=400)   # a reset further than this is garbage: say none
MINUTE = timedelta(minutes=1)
MONTHS = {m: n for n, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug",
                                      "Sep", "Oct", "Nov", "Dec"), 1)}


def _aware(now: datetime) -> datetime:
    return now if now.tzinfo is not None else now.astimezone()


def _sane(at: datetime, now: datetime) -> datetime | None:
    return at if now - timedelta(days=1) <= at <= now + MAX_AHEAD else None


def _epoch(value, now: datetime) -> datetime | None:
    """A reset in epoch seconds, if it is a number near enough to now."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return _sane(datetime.fromtimestamp(value, timezone.utc), now)
    except (OverflowError, ValueError, OSError):
        return None


def _clock(found: re.Match, zone: str, now: datetime) -> datetime | None:
    """A reset said as a time of day (`h`, `m`, `ap`), with or without a date (`mon`, `day`,
    `year`), in `zone`. Without a date it is the next such time; a minute said is one that
    has begun is its end (the CLIs print no seconds)."""
    try:
        tz = ZoneInfo(zone)
        hour, minute = int(found["h"]), int(found["m"] or 0)
        if not 1 <= hour <= 12:
            return None
        clock = time(hour % 12 + (12 if found["ap"].lower() == "pm" else 0), minute)
        local = now.astimezone(tz)
        if found["mon"]:
            day = date(int(found["year"] or local.year), MONTHS[found["mon"]], int(found["day"]))
        else:
            day = local.date()
        at = datetime.combine(day, clock, tz)
        if not found["mon"] and at + MINUTE <= now:
            at = datetime.combine(day + timedelta(days=1), clock, tz)
    except (KeyError, ValueError, OSError, OverflowError):
        return None
    if at <= now < at + MINUTE:
        at += MINUTE
    return _sane(at, now)


def _count(value) -> int:
    """A token count as reported: a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        0 <= value < 10**15 else 0


def _input_tokens(usage: dict) -> int:
    return sum(_count(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens",
                                              "cache_read_input_tokens"))


def reported_usd(value) -> float | None:
    """A reported cost: a finite non-negative number (an agent may report 10**400, "12",
    -1 or NaN), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        usd = float(value)
    except OverflowError:
        return None
    return usd if 0 <= usd < 1e12 else None
