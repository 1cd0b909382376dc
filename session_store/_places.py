"""Where a workspace's sessions live: the control plane out of the agents' reach, the
work area in the workspace. Stdlib only: agents' tools import it on their cold path.

The control plane (metadata, the bus, the config snapshot, the mailbox, questions and
answers, the lock, progress and reports) is what steers the engine, so it is kept where
agents do not write: a per-user state directory, as Codex keeps ~/.codex and Claude Code
~/.claude, not the project. Agent CLIs that confine their agent (Codex's workspace-write
sandbox, Claude Code's sandbox) let it write the workspace and the temp directories only.

    $RALPH_STATE_DIR, else $XDG_STATE_HOME/ralph, else ~/.local/state/ralph
      workspaces/<name>-<hash of the workspace's real path>/
        workspace                 the workspace's path (for people and listings)
        sessions/<id>/            one session's control plane (Session.dir)
        worktrees/<id>/<task>/    a parallel batch's git worktrees, one a running task
                                  (where its agent works; out of the workspace, so no
                                  agent plants the path git checks out to)

The work area, `<workspace>/.ralph-sessions/<id>/`, is what agents may write: the
knowledge they stage, the scratchpad, the outbox their tools append to (the engine
ingests it, trusting nothing in it) and the inbox of the engine's replies.
"""
from __future__ import annotations

import functools
import hashlib
import os

from ._errors import BadInput

WORK_DIR = ".ralph-sessions"


class StateDirInWorkspace(ValueError):
    """The state directory lies where agents write: refused (BadInput says so above)."""


def state_root() -> str:
    explicit = os.environ.get("RALPH_STATE_DIR")
    if explicit:
        return os.path.abspath(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".local", "state")
    return os.path.join(os.path.abspath(base), "ralph")


@functools.lru_cache(maxsize=64)
def workspace_key(workspace: str) -> str:
    """A workspace's folder name in the state directory: readable, and unique by its real
    path (two checkouts named alike stay apart). Worked out once a process per path given
    (a realpath and a hash: `session list` asks for each session it loads)."""
    real = os.path.realpath(workspace)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in os.path.basename(real))
    return f"{name[:40] or 'root'}-{digest}"


def workspace_state(workspace: str) -> str:
    return os.path.join(state_root(), "workspaces", workspace_key(workspace))


def control_root(workspace: str) -> str:
    """The directory of the workspace's sessions' control planes."""
    return os.path.join(workspace_state(workspace), "sessions")


def worktree_root(workspace: str, session_id: str) -> str:
    """The directory of a session's git worktrees (a parallel batch's lanes)."""
    return os.path.join(workspace_state(workspace), "worktrees", session_id)


def work_root(workspace: str) -> str:
    """The directory of the workspace's sessions' work areas (in the workspace)."""
    return os.path.join(os.path.abspath(workspace), WORK_DIR)


def check_state_dir(workspace: str) -> None:
    """Refuse a state directory inside the workspace: agents could rewrite it there."""
    state = os.path.realpath(state_root())
    real = os.path.realpath(workspace)
    if state == real or state.startswith(os.path.join(real, "")):
        raise StateDirInWorkspace(
            f"the state directory {state} lies inside the workspace {real}, where agents "
            f"write; set RALPH_STATE_DIR (or XDG_STATE_HOME) to a directory outside it")


def store_url() -> str | None:
    """The fleet's database, when sessions live in one ($RALPH_STORE_URL, a
    `postgresql://` URL; its password in ~/.pgpass or $PGPASSWORD, never in a file of
    ralph's): every verb below goes to it. None: the workspace's files (the default)."""
    url = os.environ.get("RALPH_STORE_URL", "").strip()
    if not url:
        return None
    if not url.startswith(("postgresql://", "postgres://")):
        raise BadInput(f"$RALPH_STORE_URL: expected a postgresql:// URL, got "
                       f"{url.split(':', 1)[0][:20]!r}")
    return url
