"""ralph.yml's types: its values' enums and the attrs classes it is loaded into
(engine/config.py reads and checks them; engine/config_ranges.py checks their ranges)."""
from __future__ import annotations

import enum

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


class SandboxMode(enum.Enum):   # engine/agents/sandbox.py; none: with the user's rights
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


@define
class ApprovalRule:
    """A tool call a human approves first (engine/tools/approve.py has the syntax)."""
    rule: str
    timeout_seconds: float | None = None   # null: RObot.timeout_seconds
    default: ApprovalDefault = ApprovalDefault.DENY   # what an unanswered one gets


@define
class Prices:
    """USD per million tokens: what a run costs when its CLI reports tokens, not USD."""
    input: float = 0.0
    output: float = 0.0


@define
class AgentConfig:
    backend: Backend = Backend.DEMO
    command: list[str] = field(factory=list)
    prompt_mode: PromptMode = PromptMode.STDIN
    timeout_seconds: float = 1800.0
    script: str | None = None
    prices: Prices | None = None    # null: the preset's list prices
    mcp: bool = True                # wire `ralph mcp` into runs of CLIs that take it
    # the CLI's usage or rate limit (engine/limits.py): never an attempt spent
    on_limit: OnLimit = OnLimit.WAIT
    limit_fallback: AgentOverride | None = None   # for on_limit: switch
    limit_wait_seconds: float = 3600.0       # when the CLI does not say when it resets
    max_limit_wait_seconds: float = 43200.0  # the longest one wait; then the step is retried
    approve: list[ApprovalRule] = field(factory=list)   # asked of a human: the CLI's hook
    sandbox: SandboxMode = SandboxMode.ENFORCE   # none, writable: only from a config
    network: Network = Network.OPEN              # outside the workspace (sandbox.py)
    writable: list[str] = field(factory=list)    # more paths runs may write
    # whose usage windows its runs spend (engine/quota.py): null, "<backend>-<user>"
    account: str | None = None


@define
class AgentOverride:
    """A role's changes to the top-level agent: only the keys it sets."""
    backend: Backend | None = None
    command: list[str] | None = None
    prompt_mode: PromptMode | None = None
    timeout_seconds: float | None = None
    script: str | None = None
    prices: Prices | None = None
    mcp: bool | None = None
    account: str | None = None


@define
class RoleConfig:
    instructions: str | None = None
    agent: AgentOverride | None = None
    enabled: bool = True   # the questioner's switch (off by default); the others always run


@define
class Roles:
    planner: RoleConfig = field(factory=RoleConfig)
    executor: RoleConfig = field(factory=RoleConfig)
    reviewer: RoleConfig = field(factory=RoleConfig)
    librarian: RoleConfig = field(factory=RoleConfig)
    questioner: RoleConfig = field(factory=lambda: RoleConfig(enabled=False))


@define
class EventLoop:
    max_iterations: int = 50
    max_runtime_seconds: float = 14400.0
    max_cost_usd: float | None = None
    cooldown_delay_seconds: float = 0.0
    max_event_bytes: int = 1 << 20   # one event an agent sends: larger is refused
    parallel: int = 1   # tasks of one batch at once, each in a git worktree of its own


@define
class Telegram:
    bot_token: str | None = None
    api_url: str | None = None
    allowed_chat_ids: list[int] = field(factory=list)


@define
class RObot:
    enabled: bool = False
    timeout_seconds: float = 600.0
    on_timeout: OnTimeout = OnTimeout.CONTINUE
    telegram: Telegram = field(factory=Telegram)


@define
class Knowledge:
    approval: Approval = Approval.AUTO
    timeout_seconds: float = 3600.0
    docs_dir: str = ".docs"


@define
class Fallback:
    enabled: bool = True
    confidence_threshold: float = 0.7
    error_count_threshold: int = 3
    no_progress_minutes: float = 30.0
    complexity_threshold: float = 8.0
    risk_threshold: float = 0.8
    ambiguity_threshold: float = 0.7
    max_approaches: int = 3
    autonomous_continue: float = 0.8
    guided_collaboration: float = 0.5
    full_human_control: float = 0.3


@define
class Blockers:
    trace_path: str | None = None   # a context-graph JSONL file every blocker is appended to
    repeat_limit: int = 3           # the same cause this often pauses the session


@define
class Git:
    commits: bool = True   # in a git workspace: a branch per session, a commit per [x] task


class OnError(enum.Enum):
    WARN = "warn"      # record it, say it, go on
    BLOCK = "block"    # refuse the step (which steps: BLOCKABLE)
    PAUSE = "pause"    # pause the session before the step (exit 3)


# what a lifecycle hook may be attached to, as `pre.EVENT` or `post.EVENT` (engine/hooks.py)
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
    command: list[str] = field(factory=list)
    on_error: OnError = OnError.WARN
    timeout_seconds: float = 30.0


@define
class Quota:
    """Pacing by the agent CLIs' usage windows (engine/quota.py)."""
    # no new run past this share of a window: one for every window ({all: N}; a number
    # in ralph.yml is that) or per window ({five_hour: 80, seven_day: 90, all: 90})
    pause_at_percent: dict[str, float] = field(factory=lambda: {"all": 90.0})
    reserve_percent: float = 0.0   # kept for the human's own use: at most 100 - this
    spread: bool = False           # spend a window evenly over its length


@define
class LimitsConfig:
    quota: Quota = field(factory=Quota)


@define
class Config:
    agent: AgentConfig = field(factory=AgentConfig)
    roles: Roles = field(factory=Roles)
    event_loop: EventLoop = field(factory=EventLoop)
    RObot: RObot = field(factory=RObot)
    knowledge: Knowledge = field(factory=Knowledge)
    fallback: Fallback = field(factory=Fallback)
    blockers: Blockers = field(factory=Blockers)
    git: Git = field(factory=Git)
    hooks: dict[str, list[HookSpec]] = field(factory=dict)   # "pre.plan.ready": [...]
    diagnostics: bool = False   # or RALPH_DIAGNOSTICS=1: JSONL under diagnostics/
    limits: LimitsConfig = field(factory=LimitsConfig)

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
