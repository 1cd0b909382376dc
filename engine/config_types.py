"""ralph.yml's types: its values' enums and the attrs classes it is loaded into
(engine/config.py reads and checks them; engine/config_ranges.py checks their ranges)."""
from __future__ import annotations

import enum
from typing import Any, Callable

import attrs
from attrs import define, field


class Backend(enum.Enum):
    DEMO = "demo"
    COMMAND = "command"
    CLAUDE = "claude"
    CODEX = "codex"
    GEMINI = "gemini"
    KIRO = "kiro"
    AMP = "amp"
    COPILOT = "copilot"
    OPENCODE = "opencode"


class PromptMode(enum.Enum):
    STDIN = "stdin"
    ARG = "arg"
    FILE = "file"


class OnTimeout(enum.Enum):
    CONTINUE = "continue"
    PAUSE = "pause"
    ABORT = "abort"


class OnLimit(enum.Enum):
    WAIT = "wait"        # wait, durably, until the limit resets, then retry the step
    PAUSE = "pause"      # pause the session (exit 3), saying when the limit resets
    SWITCH = "switch"    # run on agent.limit_fallback until the limit resets


class SandboxMode(enum.Enum):   # engine/running/sandbox.py; none: with the user's rights
    ENFORCE, NONE = "enforce", "none"


class Network(enum.Enum):   # none: a network of the run's own, loopback only
    OPEN, NONE = "open", "none"


class Approval(enum.Enum):
    AUTO = "auto"
    REQUIRED = "required"
    SKIP = "skip"


# the agents whose CLI takes a pre-tool hook (agent.approve asks through it)
HOOKED = (Backend.CLAUDE, Backend.CODEX, Backend.GEMINI)


class ApprovalDefault(enum.Enum):
    DENY = "deny"
    ALLOW = "allow"


def key(default: Any = attrs.NOTHING, *, factory: Callable[[], Any] | None = None,
        doc: str) -> Any:
    """A ralph.yml key: its default and what it means. docs/configuration.md is made from
    `doc` (docs/hooks.py), so the reference cannot drift from the code; tests/test_docs.py
    fails on a key without one."""
    if factory is not None:
        return field(factory=factory, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@define
class ApprovalRule:
    """A tool call a human approves first (engine/tools/approve.py has the syntax)."""
    rule: str = key(doc="the tool, with an optional pattern of its call in parentheses, "
                        "in Claude Code's permission-rule syntax: `Bash(git push*)`, "
                        "`WebFetch`, `mcp__github__*`; a rule alone stands for {rule: ...}")
    timeout_seconds: float | None = key(None, doc="how long the call waits for a human, at "
                                                  "most 2,000,000 s; null: RObot.timeout_seconds")
    default: ApprovalDefault = key(ApprovalDefault.DENY,
                                   doc="what a call nobody answered in time gets")


@define
class Prices:
    """USD per million tokens: what a run costs when its CLI reports tokens, not USD."""
    input: float = key(0.0, doc="USD per million input tokens")
    output: float = key(0.0, doc="USD per million output tokens")


@define
class AgentConfig:
    backend: Backend = key(Backend.DEMO, doc=(
        "the agent: `demo` (the bundled scripted agent, no model), `command` (any program, "
        "`agent.command`), or a preset for an agent CLI: `claude` (Claude Code), `codex`, "
        "`gemini` (Gemini CLI), `copilot`, `opencode`, `amp`, `kiro`; `--agent NAME` on "
        "`session start` overrides it, `--agent auto` picks the first installed CLI"))
    command: list[str] = key(factory=list, doc=(
        "for backend: command, the argv list; for a preset, arguments added to its CLI's"))
    prompt_mode: PromptMode = key(PromptMode.STDIN, doc=(
        "how the prompt reaches a command: on stdin, as its last argument (`arg`), or as a "
        "path to read it from (`file`)"))
    timeout_seconds: float = key(1800.0, doc=(
        "an agent run longer than this is stopped, with every process it started"))
    script: str | None = key(None, doc=(
        "for backend: demo, a scenario file to play; null plays the built-in one"))
    prices: Prices | None = key(None, doc=(
        "USD per million tokens, for CLIs that report tokens but no cost (codex, gemini), "
        "so that max_cost_usd holds: e.g. {input: 1.25, output: 10}; null: the preset's "
        "list prices"))
    mcp: bool = key(True, doc=(
        "claude and codex: ralph's tools (emit, ask, progress, signals_poll, blocker, "
        "status) as an MCP server (`ralph mcp`) in every run, named first in the prompt; "
        "the shell commands stay as the fallback"))
    # the CLI's usage or rate limit (engine/policy/limits.py): never an attempt spent
    on_limit: OnLimit = key(OnLimit.WAIT, doc=(
        "when the CLI says it hit its usage or rate limit: `wait` durably until the reset, "
        "then retry the same step; `pause` the session (exit 3), saying when it resets; "
        "`switch` to agent.limit_fallback until the reset"))
    limit_fallback: AgentOverride | None = key(None, doc=(
        "for on_limit: switch, the changes to the agent (any key of a role's agent), e.g. "
        "{backend: codex}"))
    limit_wait_seconds: float = key(3600.0, doc=(
        "how long to wait when the CLI does not say when its limit resets"))
    max_limit_wait_seconds: float = key(43200.0, doc=(
        "the longest one wait; a later reset is waited out in waits this long"))
    approve: list[ApprovalRule] = key(factory=list, doc=(
        "tool calls a human approves first (claude, codex, gemini: through the CLI's "
        "pre-tool hook); each a rule (`Bash(git push*)`) or a mapping"))
    sandbox: SandboxMode = key(SandboxMode.ENFORCE, doc=(
        "`enforce`: every run and hook confined by bubblewrap (its workspace and work area "
        "writable, the system read-only, ralph's control files and your secrets hidden); "
        "`none`: with your rights, only from a config outside the workspace (-c) or "
        "`session start --sandbox none`"))
    network: Network = key(Network.OPEN, doc=(
        "`open`: the network as ralph's own (agents call their model APIs); `none`: a "
        "network of the run's own, loopback only"))
    writable: list[str] = key(factory=list, doc=(
        "more paths runs may write (a build cache: [\"~/.cache/go-build\"]); only from a "
        "config outside the workspace"))
    account: str | None = key(None, doc=(
        "whose usage windows its runs spend (limits.quota): runs on one account share one "
        "budget, across sessions and, on a PostgreSQL store, machines; null: "
        "`<backend>-<user>`"))


@define
class AgentOverride:
    """A role's changes to the top-level agent: only the keys it sets."""
    backend: Backend | None = key(None, doc="as agent.backend; null: agent's")
    command: list[str] | None = key(None, doc="as agent.command; null: agent's")
    prompt_mode: PromptMode | None = key(None, doc="as agent.prompt_mode; null: agent's")
    timeout_seconds: float | None = key(None, doc="as agent.timeout_seconds; null: agent's")
    script: str | None = key(None, doc="as agent.script; null: agent's")
    prices: Prices | None = key(None, doc="as agent.prices; null: agent's")
    mcp: bool | None = key(None, doc="as agent.mcp; null: agent's")
    account: str | None = key(None, doc="as agent.account; null: agent's")


@define
class RoleConfig:
    instructions: str | None = key(None, doc=(
        "the role's own instructions, in its prompt (the skills, such as the executor's "
        "way with a STEER, stay)"))
    agent: AgentOverride | None = key(None, doc=(
        "the role's changes to `agent:` (only the keys it sets); null: the agent as it is"))
    enabled: bool = key(True, doc=(
        "the questioner's switch (off by default); the other roles always run"))


@define
class Roles:
    planner: RoleConfig = key(factory=RoleConfig, doc=(
        "plans an iteration: its tasks in batches (`plan.ready`), or `LOOP_COMPLETE`"))
    executor: RoleConfig = key(factory=RoleConfig, doc=(
        "does one task: `build.done` with evidence, `build.blocked` or `task.failed`"))
    reviewer: RoleConfig = key(factory=RoleConfig, doc=(
        "reviews one done task: `review.done` or `verify.passed`, else `review.rejected`"))
    librarian: RoleConfig = key(factory=RoleConfig, doc=(
        "stages what the iteration learned under knowledge/ (`knowledge.staged`)"))
    questioner: RoleConfig = key(factory=lambda: RoleConfig(enabled=False), doc=(
        "runs at the start of every PLANNING, before the planner, and turns what is "
        "ambiguous into questions for a human (their answers reach the planner); off by "
        "default"))


@define
class EventLoop:
    max_iterations: int = key(50, doc=(
        "iterations (not agent runs); reaching it pauses the session (exit 5)"))
    max_runtime_seconds: float = key(14400.0, doc=(
        "active engine time across resumes (waits for a usage limit excluded); reaching it "
        "pauses the session (exit 5)"))
    max_cost_usd: float | None = key(None, doc=(
        "the agents' reported cost; reaching it pauses the session (exit 5); null: no limit"))
    cooldown_delay_seconds: float = key(0.0, doc=(
        "a wait between agent runs (skipped after a human's response)"))
    max_event_bytes: int = key(1 << 20, doc=(
        "the largest event an agent may send (1024 B to 64 MiB); a larger one is refused"))
    parallel: int = key(1, doc=(
        "tasks of one batch at once (1 to 32), each in a git worktree of its own, merged "
        "back in plan order; more than 1 needs a git workspace with git.commits on"))


@define
class Telegram:
    bot_token: str | None = key(None, doc=(
        "or $RALPH_TELEGRAM_BOT_TOKEN; never written to a session"))
    api_url: str | None = key(None, doc=(
        "the Bot API root (default https://api.telegram.org), or $RALPH_TELEGRAM_API_URL"))
    allowed_chat_ids: list[int] = key(factory=list, doc=(
        "the only chats heard and told; required when RObot.enabled"))


@define
class RObot:
    enabled: bool = key(False, doc=(
        "the Telegram channel; the CLI's (`ralph session answer`) and the web page's are "
        "always on"))
    timeout_seconds: float = key(600.0, doc="how long a blocking human question waits")
    on_timeout: OnTimeout = key(OnTimeout.CONTINUE, doc=(
        "what an unanswered question does: `continue` (the next prompt is told), `pause` "
        "(exit 3; still answerable) or `abort` (exit 4)"))
    telegram: Telegram = key(factory=Telegram, doc="the Telegram bot")


@define
class Knowledge:
    approval: Approval = key(Approval.AUTO, doc=(
        "what happens to staged knowledge: `auto` promotes it, `required` waits for an "
        "APPROVE or SKIP signal, `skip` keeps it staged"))
    timeout_seconds: float = key(3600.0, doc=(
        "with required: after this, staged knowledge is carried to the next iteration"))
    docs_dir: str = key(".docs", doc=(
        "where promoted knowledge goes, relative to the workspace (outside it only from a "
        "config outside the workspace)"))


@define
class Fallback:
    enabled: bool = key(True, doc="the confidence assessor (seed 004), run on every transition")
    confidence_threshold: float = key(0.7, doc=(
        "ask a human when the assessed confidence falls below this"))
    error_count_threshold: int = key(3, doc="... or after this many errors")
    no_progress_minutes: float = key(30.0, doc="... or when no task completed for this long")
    complexity_threshold: float = key(8.0, doc="... or when a task's complexity is above this")
    risk_threshold: float = key(0.8, doc="... or when a task's risk is above this")
    ambiguity_threshold: float = key(0.7, doc=(
        "... or when the requirements' reported ambiguity is above this"))
    max_approaches: int = key(3, doc="... or when an agent reports more approaches than this")
    autonomous_continue: float = key(0.8, doc=(
        "after an answer: above this confidence, back to autonomous work"))
    guided_collaboration: float = key(0.5, doc=(
        "after an answer, between this and autonomous_continue: collaborative (a check-in "
        "before each task)"))
    full_human_control: float = key(0.3, doc=(
        "after an answer, below this confidence: the session pauses"))


@define
class Blockers:
    trace_path: str | None = key(None, doc=(
        "a context-graph JSONL file every blocker trace is also appended to; null: none"))
    repeat_limit: int = key(3, doc=(
        "the same cause (normalised) this many times in a session pauses it"))


@define
class Git:
    commits: bool = key(True, doc=(
        "in a git workspace: a branch per session (`ralph/<ID>`, from your HEAD; a clean "
        "tree is required) and a commit per task that reaches [x]; false: git is left alone"))


class OnError(enum.Enum):
    WARN = "warn"      # record it, say it, go on
    BLOCK = "block"    # refuse the step (which steps: BLOCKABLE)
    PAUSE = "pause"    # pause the session before the step (exit 3)


# what a lifecycle hook may be attached to, as `pre.EVENT` or `post.EVENT` (engine/policy/hooks.py)
HOOK_EVENTS = ("session.start", "iteration.start", "plan.ready", "human.question",
               "session.complete", "session.error", "session.pause")
# the steps a failing pre hook may refuse (on_error: block), and those it may pause before;
# a post hook, and a pre hook of a question, a pause or an error, can only warn: the step
# happened, or is the human's (a question is asked once its file is written)
BLOCKABLE = ("pre.session.start", "pre.plan.ready", "pre.session.complete")
PAUSABLE = ("pre.session.start", "pre.iteration.start", "pre.plan.ready",
            "pre.session.complete")


@define
class HookSpec:
    command: list[str] = key(factory=list, doc=(
        "the argv, run without a shell in the workspace, inside the agents' sandbox; the "
        "event as JSON on stdin"))
    on_error: OnError = key(OnError.WARN, doc=(
        "a failure: `warn` (say it, go on), `block` (refuse the step), `pause` (pause the "
        "session before the step, exit 3); which hook may block or pause: "
        "[the table](approvals-and-hooks.md#lifecycle-hooks-and-diagnostics)"))
    timeout_seconds: float = key(30.0, doc=(
        "past this the hook's process group is stopped and the hook counts as failed"))


@define
class Quota:
    """Pacing by the agent CLIs' usage windows (engine/policy/quota.py)."""
    pause_at_percent: dict[str, float] = key(factory=lambda: {"all": 90.0}, doc=(
        "no new run past this share of a usage window: one number for every window, or "
        "per window ({five_hour: 80, seven_day: 90, all: 90}); the run in flight finishes, "
        "the session waits for the window's reset as for a usage limit"))
    reserve_percent: float = key(0.0, doc=(
        "kept for your own use of the account: the threshold is at most 100 minus this"))
    spread: bool = key(False, doc=(
        "pace runs so that a window's remainder lasts until its reset, instead of running "
        "to the threshold and waiting"))


@define
class LimitsConfig:
    quota: Quota = key(factory=Quota, doc="pacing by usage windows (percent of a window)")


@define
class Config:
    agent: AgentConfig = key(factory=AgentConfig, doc=(
        "the agent every role runs, unless the role changes it"))
    roles: Roles = key(factory=Roles, doc="per-role instructions and agent overrides")
    event_loop: EventLoop = key(factory=EventLoop, doc="the loop's limits and pace")
    RObot: RObot = key(factory=RObot, doc="humans in the loop: questions and Telegram")
    knowledge: Knowledge = key(factory=Knowledge, doc="what the librarian staged")
    fallback: Fallback = key(factory=Fallback, doc=(
        "when the confidence assessor asks a human how to go on"))
    blockers: Blockers = key(factory=Blockers, doc="blocker traces (seed 003)")
    git: Git = key(factory=Git, doc="git workspaces")
    hooks: dict[str, list[HookSpec]] = key(factory=dict, doc=(
        "lifecycle hooks: your commands at `pre.EVENT` or `post.EVENT`, EVENT one of "
        "session.start, iteration.start, plan.ready, human.question, session.complete, "
        "session.error, session.pause: "
        "`pre.plan.ready: [{command: [./check-plan.sh], on_error: block}]`"))
    diagnostics: bool = key(False, doc=(
        "JSONL records of every transition, gate verdict, assessment, agent run and hook "
        "run, for `ralph session diagnose` (RALPH_DIAGNOSTICS=1 turns them on too)"))
    limits: LimitsConfig = key(factory=LimitsConfig, doc=(
        "pacing by the agent CLIs' usage windows: [Usage limits](usage-limits.md)"))

    def role_enabled(self, role: str) -> bool:
        return getattr(self.roles, role).enabled

    def agent_for(self, role: str) -> AgentConfig:
        return _overridden(self.agent, getattr(self.roles, role).agent)

    def limit_fallback(self, role: str | None = None) -> AgentConfig:
        """The agent a role switches to while its own is at a usage limit (on_limit:
        switch): the role's agent with agent.limit_fallback's changes."""
        agent = self.agent_for(role) if role else self.agent
        return _overridden(agent, self.agent.limit_fallback)


def _overridden(agent: AgentConfig, override: AgentOverride | None) -> AgentConfig:
    if override is None:
        return agent
    changes = {f.name: value for f in attrs.fields(AgentOverride)
               if (value := getattr(override, f.name)) is not None}
    return attrs.evolve(agent, **changes)
