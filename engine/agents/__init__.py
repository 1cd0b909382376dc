"""Agent backends: presets for the agent CLIs, any command, the demo; each run contained.

    make_agent(config)     the backend for a role's agent config
    preflight(config, env) why a configured agent cannot run here (before a session starts)
    ralph_argv()           the absolute `ralph` agents are told to call (and run as MCP server)
    containment            find and stop every process of a run, or of a dead engine's runs
"""
from __future__ import annotations

import os
import shutil
import sys

from ..config import AgentConfig, Backend
from ..running import containment
from .presets import (PRESETS, ApprovalHook, Command, Demo, McpServer, Preset, RunReport, RunSetup,
                      UsageLimit)
from .process import CommandAgent, Invocation, Outcome

__all__ = ["preset_for", "CommandAgent", "Invocation", "Outcome", "RunReport", "RunSetup",
           "Preset", "McpServer", "UsageLimit", "ApprovalHook",
           "PRESETS", "containment", "make_agent", "preflight", "installed_backend",
           "ralph_argv", "demo_argv"]


def demo_argv(script: str | None) -> list[str]:
    # -P: the workspace (the cwd) is not on sys.path: an engine/ planted there never runs
    argv = [sys.executable, "-P", "-m", "ralph.engine.demo_agent"]
    return argv + ["--script", script] if script else argv


def preset_for(config: AgentConfig) -> Preset:
    if config.backend is Backend.DEMO:
        return Demo(demo_argv(config.script))
    if config.backend is Backend.COMMAND:
        return Command(config.command, config.prompt_mode)
    return PRESETS[config.backend]


def make_agent(config: AgentConfig) -> CommandAgent:
    extra = config.command if config.backend not in (Backend.DEMO, Backend.COMMAND) else []
    return CommandAgent(preset_for(config), extra)


def preflight(config: AgentConfig, path: str | None = None) -> str | None:
    """One line saying why this agent cannot run here (not installed, a flag its CLI
    refuses as root), or None."""
    if config.backend is Backend.DEMO:
        return None
    if config.backend is Backend.COMMAND and not config.command:
        return "agent.command: expected the program to run (an argv list) for backend command"
    extra = config.command if config.backend is not Backend.COMMAND else []
    return preset_for(config).preflight(extra, path)


def installed_backend() -> Backend | None:
    """`--agent auto`: the first preset whose program is on the PATH."""
    for backend, preset in PRESETS.items():
        if shutil.which(preset.program):
            return backend
    return None


def ralph_argv() -> list[str]:
    """The `ralph` that runs this engine, as an absolute command agents can call from any
    shell (a login shell resets PATH, and the venv is seldom activated)."""
    beside = os.path.join(os.path.dirname(sys.executable), "ralph")
    if os.access(beside, os.X_OK):
        return [beside]
    found = shutil.which("ralph")
    if found:
        return [os.path.abspath(found)]
    return [sys.executable, "-P", "-m", "ralph.engine"]   # -P: not an engine/ of the workspace
