"""What every preset is made of: the Preset base, what it is given for a run (RunSetup)
and what it reads back (RunReport, UsageLimit from a RunEnd), and the small readers of a
CLI's output they share. Nothing here trusts the output: an agent prints what it likes.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import datetime

from ralph.session_store import open_beneath

from ..config import PromptMode

ARG_LIMIT = 100_000   # bytes; Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN)
PROMPT_FILE = "RALPH_PROMPT_FILE"   # every run's environment: the file its prompt is in


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
class QuotaSeen:
    """A usage window as the CLI said it stood during the run: `percent` used (clamped to
    0..100), resetting at `resets_at` (None: not said or implausible)."""
    window: str            # the CLI's name of it: five_hour, seven_day, ...
    percent: float
    resets_at: datetime | None


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
class ApprovalHook:
    """`ralph tools approve` as a CLI's pre-tool hook for one run (agent.approve)."""
    command: list[str]        # ralph's argv, without --cli
    tools: tuple[str, ...]    # the tools the rules name, as globs (`mcp__*`)
    wait_seconds: int         # how long a call may wait for its human, and a minute more
    env: dict[str, str]       # the run's RALPH_* (for a CLI that gives its hooks little)

    def shell(self, cli: str) -> str:
        import shlex
        return shlex.join([*self.command, "tools", "approve", "--cli", cli])

    def matcher(self) -> str:
        """The rules' tools as one regular expression (Claude Code's and Codex's
        matchers)."""
        import re
        return "^(" + "|".join(".*".join(re.escape(p) for p in t.split("*"))
                               for t in self.tools) + ")$"


@dataclass(frozen=True, slots=True)
class RunSetup:
    """What a preset may need to know of the run it prepares."""
    log_base: str                  # the run's logs: <log_base>.prompt.md, .stdout, .stderr
    work_dir: str                  # the session's work area, where the logs are
    ask_timeout_seconds: float     # how long a human question may block a tool call
    mcp: McpServer | None = None   # wire ralph's MCP server into the CLI (supports_mcp)
    conversation: str | None = None   # continue this conversation of the CLI (resumes)
    tree: str | None = None        # where the agent works when not the workspace (a lane's
                                   # worktree): the work area is then outside it
    approve: ApprovalHook | None = None   # ask ralph before the tool calls the rules name

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

    def unset(self, setup: RunSetup) -> tuple[str, ...]:
        """Variables of the engine's environment the CLI must not see in this run."""
        return ()

    def report(self, stdout: str) -> RunReport:
        return RunReport(text=stdout)

    def limit(self, end: RunEnd) -> UsageLimit | None:
        """The usage or rate limit this run ended on, if it did (read from its output)."""
        return None

    def conversation(self, end: RunEnd) -> str | None:
        """The CLI's id for this run's conversation, to continue it (resumes)."""
        return None

    def quota(self, end: RunEnd) -> tuple[QuotaSeen, ...]:
        """The usage windows the run's output told of (the latest of each), if any."""
        return ()

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


def write_private(work_dir: str, path: str, text: str) -> None:
    """A file of the run's, in the work area (never through a planted link)."""
    fd = open_beneath(work_dir, path)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def json_lines(text: str):
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                yield value


def json_document(*texts: str) -> dict:
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


def claude_words(event: dict) -> str:
    """What an assistant or result line says (a limit's message is its only text)."""
    if event.get("type") == "result":
        said = event.get("result")
        return said if isinstance(said, str) else ""
    blocks = as_dict(event.get("message")).get("content")
    return "".join(b["text"] for b in blocks if isinstance(b, dict)
                   and isinstance(b.get("text"), str)) if isinstance(blocks, list) else ""


def as_dict(value) -> dict:
    return value if isinstance(value, dict) else {}


CONVERSATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def conversation_id(value) -> str | None:
    """A CLI's conversation id as it may go into argv (never an option: no leading `-`)."""
    return value if isinstance(value, str) and CONVERSATION_ID.fullmatch(value) else None


def resume_args(flag: str, setup: RunSetup) -> list[str]:
    found = conversation_id(setup.conversation)
    return [flag, found] if found else []


def limit_words(text: str) -> str:
    """A CLI's words about its limit, kept short."""
    return text.strip()[:1000]


def count(value) -> int:
    """A token count as reported: a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        0 <= value < 10**15 else 0


def input_tokens(usage: dict) -> int:
    return sum(count(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens",
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
