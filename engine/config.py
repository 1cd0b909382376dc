"""ralph.yml: attrs classes loaded strictly through cattrs; every error carries its path."""
from __future__ import annotations

import enum
import math
import os

import attrs

from session_store import BadInput, parse_yaml, structure, unstructure
from session_store._schema import shown

ROLES = ("planner", "executor", "reviewer", "librarian", "questioner")
MAX_SECONDS = 1e9   # ~31 years: a deadline further off overflows datetime and thread waits


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


class Approval(enum.Enum):
    AUTO = "auto"
    REQUIRED = "required"
    SKIP = "skip"


@attrs.define
class AgentConfig:
    backend: Backend = Backend.DEMO
    command: list[str] = attrs.Factory(list)
    prompt_mode: PromptMode = PromptMode.STDIN
    timeout_seconds: float = 1800.0
    script: str | None = None


@attrs.define
class AgentOverride:
    """A role's changes to the top-level agent: only the keys it sets."""
    backend: Backend | None = None
    command: list[str] | None = None
    prompt_mode: PromptMode | None = None
    timeout_seconds: float | None = None
    script: str | None = None


@attrs.define
class RoleConfig:
    instructions: str | None = None
    agent: AgentOverride | None = None
    enabled: bool = True   # the questioner's switch (off by default); the others always run


@attrs.define
class Roles:
    planner: RoleConfig = attrs.Factory(RoleConfig)
    executor: RoleConfig = attrs.Factory(RoleConfig)
    reviewer: RoleConfig = attrs.Factory(RoleConfig)
    librarian: RoleConfig = attrs.Factory(RoleConfig)
    questioner: RoleConfig = attrs.Factory(lambda: RoleConfig(enabled=False))


@attrs.define
class EventLoop:
    max_iterations: int = 50
    max_runtime_seconds: float = 14400.0
    max_cost_usd: float | None = None
    cooldown_delay_seconds: float = 0.0


@attrs.define
class Telegram:
    bot_token: str | None = None
    api_url: str | None = None
    allowed_chat_ids: list[int] = attrs.Factory(list)


@attrs.define
class RObot:
    enabled: bool = False
    timeout_seconds: float = 600.0
    on_timeout: OnTimeout = OnTimeout.CONTINUE
    telegram: Telegram = attrs.Factory(Telegram)


@attrs.define
class Knowledge:
    approval: Approval = Approval.AUTO
    timeout_seconds: float = 3600.0
    docs_dir: str = ".docs"


@attrs.define
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


@attrs.define
class Blockers:
    trace_path: str | None = None   # a context-graph JSONL file every blocker is appended to
    repeat_limit: int = 3           # the same cause this often pauses the session


@attrs.define
class Config:
    agent: AgentConfig = attrs.Factory(AgentConfig)
    roles: Roles = attrs.Factory(Roles)
    event_loop: EventLoop = attrs.Factory(EventLoop)
    RObot: RObot = attrs.Factory(RObot)
    knowledge: Knowledge = attrs.Factory(Knowledge)
    fallback: Fallback = attrs.Factory(Fallback)
    blockers: Blockers = attrs.Factory(Blockers)

    def role_enabled(self, role: str) -> bool:
        return getattr(self.roles, role).enabled

    def agent_for(self, role: str) -> AgentConfig:
        override = getattr(self.roles, role).agent
        if override is None:
            return self.agent
        changes = {k: v for k, v in attrs.asdict(override, recurse=False).items() if v is not None}
        return attrs.evolve(self.agent, **changes)


def _range_errors(config: Config) -> list[str]:
    """Values of the right type but out of range, with their paths."""
    errors = []

    def finite(path, obj):
        """NaN passes every comparison below, infinity every upper bound: neither is a
        number a session can wait for (timedelta(seconds=nan) raises mid-session)."""
        for f in attrs.fields(type(obj)):
            value = getattr(obj, f.name)
            if attrs.has(type(value)):
                finite(f"{path}{f.name}.", value)
            elif isinstance(value, float) and not math.isfinite(value):
                errors.append(f"$.{path}{f.name}: expected a finite number, got {value}")

    finite("", config)
    if errors:
        return errors

    def positive(path, value, allow_none=False, allow_zero=False):
        if value is None and allow_none:
            return
        if value < 0 or (value == 0 and not allow_zero):
            errors.append(f"$.{path}: expected a {'non-negative' if allow_zero else 'positive'} "
                          f"number, got {shown(value)}")
        elif path.endswith("_seconds") and value > MAX_SECONDS:
            errors.append(f"$.{path}: expected at most {MAX_SECONDS:.0f} seconds, "
                          f"got {shown(value)}")

    positive("event_loop.max_iterations", config.event_loop.max_iterations)
    positive("event_loop.max_runtime_seconds", config.event_loop.max_runtime_seconds)
    positive("event_loop.max_cost_usd", config.event_loop.max_cost_usd, allow_none=True)
    positive("event_loop.cooldown_delay_seconds", config.event_loop.cooldown_delay_seconds,
             allow_zero=True)
    positive("RObot.timeout_seconds", config.RObot.timeout_seconds)
    positive("knowledge.timeout_seconds", config.knowledge.timeout_seconds)
    for role in ("",) + ROLES:
        agent = config.agent_for(role) if role else config.agent
        where = f"roles.{role}.agent" if role else "agent"
        positive(f"{where}.timeout_seconds", agent.timeout_seconds)
        if agent.backend is Backend.COMMAND and not agent.command:
            errors.append(f"$.{where}.command: expected a non-empty argv list for backend: command")
    for role in ROLES:
        if role != "questioner" and not getattr(config.roles, role).enabled:
            errors.append(f"$.roles.{role}.enabled: only the questioner can be switched off")
    positive("blockers.repeat_limit", config.blockers.repeat_limit)
    for name in ("confidence_threshold", "risk_threshold", "ambiguity_threshold",
                 "autonomous_continue", "guided_collaboration", "full_human_control"):
        value = getattr(config.fallback, name)
        if not 0 <= value <= 1:
            errors.append(f"$.fallback.{name}: expected a number in [0, 1], got {value}")
    if config.RObot.enabled and config.RObot.telegram.bot_token and \
            not config.RObot.telegram.allowed_chat_ids:
        errors.append("$.RObot.telegram.allowed_chat_ids: expected at least one chat id "
                      "when Telegram is enabled")
    return errors


def parse(text: str | bytes, source: str, all_errors: bool = False) -> Config:
    data = parse_yaml(text, source)
    config = structure(data, Config, source, all_errors=all_errors)
    errors = [f"{source}: {e}" for e in _range_errors(config)]
    if errors:
        raise BadInput("\n".join(errors if all_errors else errors[:1]))
    return config


def load(path: str | None, all_errors: bool = False) -> Config:
    """The config at `path`; ./ralph.yml when it exists; else every default."""
    if path is None:
        if not os.path.isfile("ralph.yml"):
            return Config()
        path = "ralph.yml"
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise BadInput(f"{path}: cannot read the config ({e.strerror})") from None
    return parse(text, path, all_errors=all_errors)


def to_data(config: Config) -> dict:
    return unstructure(config)


def without_secrets(config: Config) -> Config:
    """The config as a session keeps it: the Telegram token never lands in a session."""
    return attrs.evolve(config, RObot=attrs.evolve(
        config.RObot, telegram=attrs.evolve(config.RObot.telegram, bot_token=None)))


def load_session_config(session) -> Config:
    """The config a session started with (its snapshot), plus secrets from their source."""
    text, path = session.config_snapshot()
    config = parse(text, path)
    if session.metadata.config_path and os.path.isfile(session.metadata.config_path):
        token = load(session.metadata.config_path).RObot.telegram.bot_token
        config.RObot.telegram.bot_token = token
    return config
