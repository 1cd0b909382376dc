"""How each CLI is given `ralph tools approve` as its pre-tool hook for one run
(agent.approve), never through the user's files or the workspace's: each way was found by
running the pinned CLI (tests/test_real_approvals.py runs them all)."""
from __future__ import annotations

import hashlib
import json
import os
import secrets

from ralph.session_store import WorkArea

from .preset import ApprovalHook, RunSetup, as_dict, write_private

GEMINI_HOME = ".gemini-home"   # after the run's logs' base: its GEMINI_CLI_HOME


# Claude Code's own sandbox around its shell commands, with no way out of it (a command
# it cannot sandbox fails instead of running unsandboxed); ralph's sandbox is around it
# all the same (engine/running/sandbox.py): where Claude Code's cannot start (no socat)
# it says so and runs its commands inside ralph's alone
CLAUDE_SANDBOX = {"enabled": True, "allowUnsandboxedCommands": False,
                  "enableWeakerNestedSandbox": True}


def claude_settings(hook: ApprovalHook | None, work_root: str | None = None) -> list[str]:
    """Claude Code's `--settings` for a run, inline (no file the agent could edit): its
    sandbox (writing `work_root` too, the work areas' folder, for a run whose directory is
    a lane's worktree: its outbox is there), and with `hook` a PreToolUse hook;
    `disableAllHooks: false` there outranks a workspace's or the user's `true`."""
    sandbox = dict(CLAUDE_SANDBOX)
    if work_root is not None:
        sandbox["filesystem"] = {"allowWrite": [work_root]}
    settings: dict = {"sandbox": sandbox}
    if hook is not None:
        settings.update({"disableAllHooks": False, "hooks": {"PreToolUse": [{
            "matcher": hook.matcher(), "hooks": [{
                "type": "command", "command": hook.shell("claude"),
                "timeout": hook.wait_seconds}]}]}})
    return ["--settings", json.dumps(settings)]


def codex_hook(hook: ApprovalHook) -> list[str]:
    """Codex: a PreToolUse hook in `-c` overrides. Codex runs a hook of the command line
    only when trusted by the hash of its definition (sha256 of its canonical JSON) and
    skips it silently otherwise: the hash goes with it. Its hooks feature is forced on (a
    trusted project could turn it off)."""
    command, matcher, timeout = hook.shell("codex"), hook.matcher(), hook.wait_seconds
    handler = {"async": False, "command": command, "timeout": timeout, "type": "command"}
    identity = json.dumps({"event_name": "pre_tool_use", "hooks": [handler], "matcher": matcher},
                          sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    trusted = "sha256:" + hashlib.sha256(identity.encode()).hexdigest()
    key = "/<session-flags>/config.toml:pre_tool_use:0:0"   # its layer, group, handler
    # a JSON string is a TOML basic string
    return ["-c", "features.hooks=true",
            "-c", f"hooks.PreToolUse=[{{matcher={json.dumps(matcher)}, hooks=[{{"
                  f"type=\"command\", command={json.dumps(command)}, timeout={timeout}}}]}}]",
            "-c", f"hooks.state={{{json.dumps(key)}={{enabled=true, "
                  f"trusted_hash={json.dumps(trusted)}}}}}"]


def gemini_home(setup: RunSetup) -> None:
    """Gemini CLI: a `.gemini` of the run's own (its GEMINI_CLI_HOME, in the run's logs):
    the user's settings with a BeforeTool hook added, the user's other files (logins,
    chats) linked, untouched. (Its system settings file is read only when root owns it and
    every directory above; a per-run name keeps the hook out of a `hooksConfig.disabled`
    list written in advance.)"""
    assert setup.approve is not None
    user = os.path.join(os.environ.get("GEMINI_CLI_HOME") or os.path.expanduser("~"), ".gemini")
    os.makedirs(os.path.join(user, "tmp"), 0o700, exist_ok=True)   # its chats: resume
    try:
        with open(os.path.join(user, "settings.json"), encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError):
        settings = {}
    settings = settings if isinstance(settings, dict) else {}
    hooks = settings["hooks"] = as_dict(settings.get("hooks"))
    before = hooks.get("BeforeTool")
    hooks["BeforeTool"] = [*(before if isinstance(before, list) else []), {
        "matcher": "*", "hooks": [{   # every tool: the engine names them in the rules' words
            "type": "command", "name": f"ralph-approve-{secrets.token_hex(8)}",
            "command": setup.approve.shell("gemini"),
            "timeout": setup.approve.wait_seconds * 1000,
            "env": setup.approve.env}]}]   # (its hooks get little of its env on CI runners)
    settings["hooksConfig"] = {**as_dict(settings.get("hooksConfig")), "enabled": True}
    home = setup.log_base + GEMINI_HOME
    write_private(setup.work_dir, home + "/.gemini/settings.json", json.dumps(settings))
    work = WorkArea(setup.work_dir)
    try:
        fd = work.dir_fd(os.path.relpath(home + "/.gemini", setup.work_dir))
    finally:
        work.close()
    try:
        for name in os.listdir(user):
            if name != "settings.json":
                try:
                    os.symlink(os.path.join(user, name), name, dir_fd=fd)
                except FileExistsError:
                    pass
    finally:
        os.close(fd)
