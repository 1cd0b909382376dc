"""What a config inside the workspace (a file agents can rewrite) may not change since
the workspace's newest session started, unless the human says so: the programs it runs
(`unpinned`: `session start` refuses them until adopted), the Telegram bot's API and
chats, the approvals' rules. A config outside the workspace (-c) is the human's own."""
from __future__ import annotations

import os

from attrs import define

from ralph.session_store import ROLES, BadInput

from .config import HOOKED, ApprovalDefault, Config, outside_allowed, parse, to_data


def _last_started(workspace: str) -> tuple[str, Config] | None:
    """The newest session of the workspace (on this machine: a fleet's store lists every
    machine's) and the config it started with (its snapshot, in the control plane), or
    None."""
    from ralph.session_store import list_ids, load
    here = os.path.abspath(workspace)
    newest = None
    for sid in list_ids(workspace):
        try:
            session = load(workspace, sid)
        except BadInput:
            continue
        if session.workspace != here or not session.runs_here():
            continue
        if newest is None or session.metadata.created_at > newest.metadata.created_at:
            newest = session
    if newest is None:
        return None
    try:
        text, path = newest.config_snapshot()
        return newest.id, parse(text, path)
    except BadInput:
        return None


def _started_if_rewritable(workspace: str, source: str | None) -> tuple[str, Config] | None:
    """The newest session and its config, when `source` is a config inside the workspace
    (which agents can rewrite) and a session started before; else None."""
    if source is None or outside_allowed(workspace, source):
        return None
    return _last_started(workspace)


def check_telegram_as_started(config: Config, workspace: str, source: str | None) -> None:
    """A config inside the workspace (which agents can rewrite) may not move the bot to
    another API root or admit other chats than the newest session started with: a
    rewritten `api_url` would hand that host the token, a chat the agent's own the
    session. A config outside the workspace is the human's own."""
    started = _started_if_rewritable(workspace, source)
    if started is None:
        return
    sid, then = started
    now_t, then_t = config.RObot.telegram, then.RObot.telegram
    for name in ("api_url", "allowed_chat_ids"):
        if getattr(now_t, name) != getattr(then_t, name):
            raise BadInput(f"{source}: $.RObot.telegram.{name} differs from what session "
                           f"{sid} started with, and agents can rewrite this file: check it, "
                           f"or give a config outside the workspace with -c")


def check_approvals_as_started(config: Config, workspace: str, source: str | None) -> None:
    """A config inside the workspace (which agents can rewrite) may not loosen the
    approvals the newest session started with: drop a rule, add or make one whose default
    allows, or move a role to an agent with no hook to ask through."""
    started = _started_if_rewritable(workspace, source)
    if started is None or not started[1].agent.approve:
        return
    sid, then = started
    was = {r.rule: r.default for r in then.agent.approve}
    now = {r.rule: r.default for r in config.agent.approve}
    looser = [f"drops the rule {r!r}" for r in was if r not in now] + [
        f"lets the rule {r!r} allow by default" for r, d in now.items()
        if d is ApprovalDefault.ALLOW and was.get(r) is not ApprovalDefault.ALLOW] + [
        f"gives the {role} an agent with no hook to ask through" for role in ROLES
        if config.agent_for(role).backend not in HOOKED
        and then.agent_for(role).backend in HOOKED]
    if looser:
        raise BadInput(f"{source}: $.agent.approve: {looser[0]}, unlike session {sid}, and "
                       f"agents can rewrite this file: check it, or give a config outside "
                       f"the workspace with -c")


# what of an agent's settings makes the engine run a program: which CLI (backend) or
# command, the prompt handed as its argument or on stdin, the demo agent's script
PROGRAM_KEYS = ("backend", "command", "prompt_mode", "script")


def programs(config: Config) -> dict[str, object]:
    """What in `config` makes the engine run a program, by its path: PROGRAM_KEYS of
    `agent`, of `agent.limit_fallback` and of each role's `roles.ROLE.agent` (the
    override as written), and each of the lifecycle `hooks` whole (its command,
    on_error and timeout). Not in it: what only bounds or prices a run (timeouts, limits,
    prices), `mcp` (the engine's own `ralph mcp`), and what other checks hold already
    (`agent.approve`, the Telegram API and chats, the paths outside the workspace)."""
    data = to_data(config)
    agents = [("$.agent", data["agent"]), ("$.agent.limit_fallback",
                                           data["agent"]["limit_fallback"])]
    agents += [(f"$.roles.{role}.agent", data["roles"][role]["agent"]) for role in ROLES]
    found: dict[str, object] = {f"{where}.{key}": (agent or {}).get(key)
                                for where, agent in agents for key in PROGRAM_KEYS}
    found.update({f"$.hooks[{event!r}]": specs for event, specs in data["hooks"].items()})
    return found


@define
class Unpinned:
    """What a workspace's config runs that the newest session did not: (path, now, was)
    each, the values said in one bounded, escaped line."""
    session_id: str
    changes: list[tuple[str, str, str]]

    def paths(self) -> str:
        return ", ".join(path for path, _, _ in self.changes)

    def lines(self) -> list[str]:
        return [f"{path} is now {now} (was {was})" for path, now, was in self.changes]


def unpinned(config: Config, workspace: str, source: str | None,
             human_backend: bool = False) -> Unpinned | None:
    """The programs (see `programs`) a config inside the workspace, which agents can
    rewrite, would run that differ from what the workspace's newest session started
    with; None when they are the same, the config is outside the workspace (the human's
    own, -c) or no session started before (the first one adopts it). `human_backend`:
    agent.backend is the human's, from the command line (--agent), not the file's."""
    started = _started_if_rewritable(workspace, source)
    if started is None:
        return None
    sid, then = started
    now_runs, then_runs = programs(config), programs(then)
    changes = [(path, _said(now_runs.get(path)), _said(then_runs.get(path)))
               for path in sorted(now_runs.keys() | then_runs.keys())
               if now_runs.get(path) != then_runs.get(path)
               and not (human_backend and path == "$.agent.backend")]
    return Unpinned(sid, changes) if changes else None


def _said(value) -> str:
    """A config value in one bounded line, escaped (an agent may have written it)."""
    import json

    from .safe_text import printable
    if value is None:
        return "none"
    text = json.dumps(value, ensure_ascii=False)
    return printable(text if len(text) <= 100 else text[:99] + "…")
