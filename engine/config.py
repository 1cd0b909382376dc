"""ralph.yml: read into its attrs classes (engine/config_types.py) strictly
(session_store.structure_each), checked for ranges (engine/config_ranges.py); every error
carries its path."""
from __future__ import annotations

import os
from typing import Callable

import attrs

from ralph.session_store import BadInput, parse_yaml, structure_each, unstructure

from .config_ranges import range_errors
from .config_types import (Backend, PromptMode, OnTimeout, OnLimit, SandboxMode, Network,
                           Approval, HOOKED, ApprovalDefault, ApprovalRule, Prices, AgentConfig,
                           AgentOverride, RoleConfig, Roles, EventLoop, Telegram, RObot,
                           Knowledge, Fallback, Blockers, Git, OnError, HOOK_EVENTS, BLOCKABLE,
                           PAUSABLE, HookSpec, Config)

# ralph.yml's types are handed on: the rest of the engine knows the config by this one name
__all__ = ["Backend", "PromptMode", "OnTimeout", "OnLimit", "SandboxMode", "Network",
           "Approval", "HOOKED", "ApprovalDefault", "ApprovalRule", "Prices", "AgentConfig",
           "AgentOverride", "RoleConfig", "Roles", "EventLoop", "Telegram", "RObot",
           "Knowledge", "Fallback", "Blockers", "Git", "OnError", "HOOK_EVENTS", "BLOCKABLE",
           "PAUSABLE", "HookSpec", "Config", "parse", "load", "to_data", "without_secrets",
           "load_session_config", "outside_allowed", "inside", "check_paths"]


def parse(text: str | bytes, source: str, all_errors: bool = False,
          channels: Callable[[Config], list[str]] | None = None) -> Config:
    """The config in `text` (read from `source`), checked in one pass: types, unknown keys,
    ranges and, with `channels` (the CLI's check: config knows no channel), the human
    channels. BadInput lists every error, one a line naming `source` (only the first
    unless `all_errors`)."""
    data = parse_yaml(text, source)
    if isinstance(data, dict) and "store" in data:
        raise BadInput(f"{source}: $.store: the store's URL is never read from a config "
                       f"file (an agent can rewrite the workspace's ralph.yml, and the store is "
                       f"where the human's control lives): set RALPH_STORE_URL in the "
                       f"environment of ralph's commands")
    config, errors = structure_each(_rules_as_mappings(data), Config)
    errors += range_errors(config)
    if channels is not None and not any(e.startswith("$.RObot") for e in errors):
        errors += channels(config)
    if errors:
        lines = [f"{source}: {e}" for e in errors]
        raise BadInput("\n".join(lines if all_errors else lines[:1]))
    return config


def _rules_as_mappings(data):
    """`agent.approve` takes a rule alone ("Bash(git push*)") for {rule: ...};
    `limits.quota.pause_at_percent` a number for {all: N}."""
    agent = data.get("agent") if isinstance(data, dict) else None
    if isinstance(agent, dict) and isinstance(agent.get("approve"), list):
        agent["approve"] = [{"rule": r} if isinstance(r, str) else r for r in agent["approve"]]
    limits = data.get("limits") if isinstance(data, dict) else None
    quota = limits.get("quota") if isinstance(limits, dict) else None
    if isinstance(quota, dict):
        at = quota.get("pause_at_percent")
        if isinstance(at, (int, float)) and not isinstance(at, bool):
            quota["pause_at_percent"] = {"all": at}
    return data


def load(path: str | None, all_errors: bool = False,
         channels: Callable[[Config], list[str]] | None = None) -> Config:
    """The config at `path`; every default when `path` is None."""
    if path is None:
        return Config()
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise BadInput(f"{path}: cannot read the config ({e.strerror})") from None
    return parse(text, path, all_errors=all_errors, channels=channels)


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


def outside_allowed(workspace: str, config_path: str | None) -> bool:
    """Whether the engine may write outside the workspace where the config says so: only
    when the config is a file outside the workspace (the human's own, out of the agents'
    reach); a workspace's ralph.yml is a file any agent could have rewritten."""
    if not config_path:
        return False
    return not inside(os.path.realpath(config_path), os.path.realpath(workspace))


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(os.path.join(root, ""))


def check_paths(config: Config, workspace: str, source: str | None,
                all_errors: bool = False) -> None:
    """The paths the engine writes (knowledge.docs_dir, blockers.trace_path) stay inside
    the workspace unless `outside_allowed` (BadInput: the first that does not, or every
    one with `all_errors`)."""
    if outside_allowed(workspace, source):
        return
    real = os.path.realpath(workspace)
    found = [f"{source or 'the config'}: $.{where}: {value!r} leads outside the workspace; "
             f"only a config file outside the workspace (-c) may point there"
             for where, value in (("knowledge.docs_dir", config.knowledge.docs_dir),
                                  ("blockers.trace_path", config.blockers.trace_path))
             if value and not inside(os.path.realpath(os.path.join(
                 workspace, os.path.expanduser(value))), real)]
    if found:
        raise BadInput("\n".join(found if all_errors else found[:1]))
