"""ralph.yml's values of the right type but out of range, each with its path (the config's
own check after its types; engine/config.py)."""
from __future__ import annotations

import attrs
import math

from ralph.session_store import ACCOUNT_NAME, ROLES, WINDOW_NAME, shown

from .config_types import (BLOCKABLE, HOOK_EVENTS, PAUSABLE, Backend, Config, OnError,
                           OnLimit)

MAX_PARALLEL = 32   # agents of one batch at once
MAX_SECONDS = 1e9   # ~31 years: a deadline further off overflows datetime and thread waits
MAX_APPROVAL_SECONDS = 2_000_000   # ~23 days: a CLI's hook (Node) cannot wait past 2^31 ms
HOOKS_OFF = {Backend.CLAUDE: ("--bare", "--safe-mode")}


def range_errors(config: Config) -> list[str]:
    """Values of the right type but out of range, with their paths: one line for one
    mistake (a role's agent inherits `agent:`, so only what a role sets is its own)."""
    errors, not_finite = [], set()

    def finite(path, obj):
        """NaN passes every comparison below, infinity every upper bound: neither is a
        number a session can wait for (timedelta(seconds=nan) raises mid-session)."""
        for f in attrs.fields(type(obj)):
            value = getattr(obj, f.name)
            if attrs.has(type(value)):
                finite(f"{path}{f.name}.", value)
            elif isinstance(value, float) and not math.isfinite(value):
                errors.append(f"$.{path}{f.name}: expected a finite number, got {value}")
                not_finite.add(f"{path}{f.name}")

    finite("", config)

    def positive(path, value, allow_none=False, allow_zero=False):
        if (value is None and allow_none) or path in not_finite:
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
    if not 1024 <= config.event_loop.max_event_bytes <= 64 << 20:
        errors.append(f"$.event_loop.max_event_bytes: expected 1024 to {64 << 20} bytes, "
                      f"got {shown(config.event_loop.max_event_bytes)}")
    if not 1 <= config.event_loop.parallel <= MAX_PARALLEL:
        errors.append(f"$.event_loop.parallel: expected 1 to {MAX_PARALLEL} tasks at once, "
                      f"got {shown(config.event_loop.parallel)}")
    positive("RObot.timeout_seconds", config.RObot.timeout_seconds)
    positive("knowledge.timeout_seconds", config.knowledge.timeout_seconds)
    positive("agent.timeout_seconds", config.agent.timeout_seconds)
    positive("agent.limit_wait_seconds", config.agent.limit_wait_seconds)
    positive("agent.max_limit_wait_seconds", config.agent.max_limit_wait_seconds)
    if config.agent.on_limit is OnLimit.SWITCH and config.agent.limit_fallback is None:
        errors.append("$.agent.limit_fallback: expected the agent to switch to (say "
                      "{backend: codex}) for on_limit: switch")
    fallback = config.agent.limit_fallback
    if fallback is not None:
        positive("agent.limit_fallback.timeout_seconds", fallback.timeout_seconds,
                 allow_none=True)
        if config.limit_fallback().backend is Backend.COMMAND and \
                not config.limit_fallback().command:
            errors.append("$.agent.limit_fallback.command: expected a non-empty argv list "
                          "for backend: command")
    if config.agent.prices is not None:
        positive("agent.prices.input", config.agent.prices.input, allow_zero=True)
        positive("agent.prices.output", config.agent.prices.output, allow_zero=True)
    if config.agent.backend is Backend.COMMAND and not config.agent.command:
        errors.append("$.agent.command: expected a non-empty argv list for backend: command")
    for role in ROLES:
        override, where = getattr(config.roles, role).agent, f"roles.{role}.agent"
        if override is None:
            continue
        positive(f"{where}.timeout_seconds", override.timeout_seconds, allow_none=True)
        if override.prices is not None:
            positive(f"{where}.prices.input", override.prices.input, allow_zero=True)
            positive(f"{where}.prices.output", override.prices.output, allow_zero=True)
        # a role that makes its agent a command without one (`agent.command` is empty)
        sets_command = override.backend is not None or override.command is not None
        if sets_command and config.agent_for(role).backend is Backend.COMMAND \
                and not config.agent_for(role).command:
            errors.append(f"$.{where}.command: expected a non-empty argv list for backend: "
                          f"command")
    for role in ROLES:
        if role != "questioner" and not getattr(config.roles, role).enabled:
            errors.append(f"$.roles.{role}.enabled: only the questioner can be switched off")
    positive("blockers.repeat_limit", config.blockers.repeat_limit)
    for name in ("confidence_threshold", "risk_threshold", "ambiguity_threshold",
                 "autonomous_continue", "guided_collaboration", "full_human_control"):
        value = getattr(config.fallback, name)
        if f"fallback.{name}" not in not_finite and not 0 <= value <= 1:
            errors.append(f"$.fallback.{name}: expected a number in [0, 1], got {shown(value)}")
    errors += hook_errors(config) + approval_errors(config) + quota_errors(config)
    return errors


def quota_errors(config: Config) -> list[str]:
    """`limits.quota`: percents of a window, per window name (or `all`), and the agents'
    account labels (a file's name in the state directory)."""
    errors = []
    q = config.limits.quota
    for window, percent in q.pause_at_percent.items():
        where = "$.limits.quota.pause_at_percent" + \
            ("" if list(q.pause_at_percent) == ["all"] else f".{window}")
        if window != "all" and not WINDOW_NAME.fullmatch(window):
            errors.append(f"{where}: expected `all` or a window's name (five_hour, seven_day, "
                          f"...), got {shown(window)}")
        elif not 0 < percent <= 100:   # NaN too
            errors.append(f"{where}: expected a percent in (0, 100], got {shown(percent)}")
    if not 0 <= q.reserve_percent < 100:
        errors.append(f"$.limits.quota.reserve_percent: expected a percent in [0, 100), got "
                      f"{shown(q.reserve_percent)}")
    accounts = [("agent", config.agent.account)] + [
        (f"roles.{r}.agent", o.account) for r in ROLES
        if (o := getattr(config.roles, r).agent) is not None] + (
        [("agent.limit_fallback", config.agent.limit_fallback.account)]
        if config.agent.limit_fallback is not None else [])
    for where, account in accounts:
        if account is not None and not ACCOUNT_NAME.fullmatch(account):
            errors.append(f"$.{where}.account: expected letters, digits and . _ @ + - (at "
                          f"most 64, starting with a letter or digit), got {shown(account)}")
    return errors


def approval_errors(config: Config) -> list[str]:
    """`agent.approve`: each rule in the CLIs' syntax, each wait one a CLI's hook can last
    (Node's timers overflow past 2^31 ms and fire at once: the call would run unasked),
    and no agent flag that switches the hooks off."""
    from .tools.approve import Rule
    errors = []
    for i, rule in enumerate(config.agent.approve):
        where = f"$.agent.approve[{i}]"
        try:
            Rule(rule.rule)
        except ValueError as e:
            errors.append(f"{where}.rule: {e}, got {shown(rule.rule)}")
        seconds = rule.timeout_seconds
        if seconds is None and not config.RObot.timeout_seconds <= MAX_APPROVAL_SECONDS:
            errors.append(f"{where}.timeout_seconds: the RObot.timeout_seconds it takes "
                          f"({shown(config.RObot.timeout_seconds)}) is past the "
                          f"{MAX_APPROVAL_SECONDS} seconds a tool call can wait: give one")
        elif seconds is not None and not (0 < seconds <= MAX_APPROVAL_SECONDS):  # NaN too
            errors.append(f"{where}.timeout_seconds: expected more than 0 and at most "
                          f"{MAX_APPROVAL_SECONDS} seconds, got {shown(seconds)}")
    for role in ROLES if config.agent.approve else ():
        agent = config.agent_for(role)
        off = [a for a in agent.command if a in HOOKS_OFF.get(agent.backend, ())
               or agent.backend is Backend.CODEX and "hooks" in a]
        if off:
            where = "agent" if agent.command == config.agent.command else \
                f"roles.{role}.agent"
            errors.append(f"$.{where}.command: {shown(off[0])} would switch off the hook "
                          f"agent.approve asks through")
            break
    return errors


def hook_errors(config: Config) -> list[str]:
    """`hooks:`: each key `pre.EVENT` or `post.EVENT`, each hook a command with a timeout,
    and an on_error its step allows (a post hook, or a pre hook of a pause or an error, can
    only warn: its step has happened, or cannot be refused)."""
    errors = []
    names = [f"{phase}.{event}" for event in HOOK_EVENTS for phase in ("pre", "post")]
    for key, hooks in config.hooks.items():
        where = f"$.hooks[{key!r}]"
        if key not in names:
            errors.append(f"{where}: expected pre. or post. and one of {', '.join(HOOK_EVENTS)}")
            continue
        for i, hook in enumerate(hooks):
            if not hook.command:
                errors.append(f"{where}[{i}].command: expected a non-empty argv list")
            if not (0 < hook.timeout_seconds <= 86400):
                errors.append(f"{where}[{i}].timeout_seconds: expected more than 0 and at "
                              f"most 86400 seconds, got {shown(hook.timeout_seconds)}")
            allowed = {OnError.WARN} | ({OnError.BLOCK} if key in BLOCKABLE else set()) \
                | ({OnError.PAUSE} if key in PAUSABLE else set())
            if hook.on_error not in allowed:
                errors.append(f"{where}[{i}].on_error: {hook.on_error.value} is not possible "
                              f"on {key}; expected {' or '.join(sorted(o.value for o in allowed))}")
    return errors
