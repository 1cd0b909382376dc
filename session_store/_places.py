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

Each directory from the state root down to a session's control plane is checked as ssh's
StrictModes checks ~/.ssh (`check_private`): whoever else can write one (a shared
RALPH_STATE_DIR another local user made, or left writable) could plant what the engine
reads, a session's config and its hooks among it.
"""
from __future__ import annotations

import functools
import hashlib
import os
import stat

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


_private: set[str] = set()   # the directories found private, each stat'ed once a process


def check_private(*paths: str) -> None:
    """Refuse (BadInput, one line: the path, what is wrong, how to fix it) a directory of
    ralph's that is not the user's own, as ssh's StrictModes refuses ~/.ssh: owned by
    another user, writable by group or others, or not a directory (a link is followed, as
    ssh does). A path not there yet is let be: make_dirs creates it 0700, and it is
    checked when next asked."""
    for path in paths:
        if path in _private:
            continue
        try:
            found = os.stat(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise BadInput(f"{path}: cannot be checked ({e.strerror})") from None
        problem = _not_private(found, path)
        if problem:
            raise BadInput(f"{path}: {problem}")
        _private.add(path)


def _not_private(found: os.stat_result, path: str) -> str | None:
    if not stat.S_ISDIR(found.st_mode):
        return "not a directory: remove it, or set RALPH_STATE_DIR to a directory of your own"
    why = "another user could plant what ralph reads there"
    if found.st_uid != os.geteuid():
        return (f"owned by uid {found.st_uid}, not by you (uid {os.geteuid()}), and {why}: "
                f"set RALPH_STATE_DIR to a directory of your own, or remove it")
    writers = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
               if found.st_mode & bit]
    if writers:
        import shlex   # only to say the fix
        return (f"writable by {' and '.join(writers)} (mode {stat.S_IMODE(found.st_mode):04o}),"
                f" and {why}: chmod go-w {shlex.quote(path)}")
    return None


def check_places(workspace: str, session_id: str | None = None) -> None:
    """`check_private` on each directory of the workspace's control planes there is: the
    state root, workspaces/, the workspace's own, its sessions/ and, given its id, the
    session's."""
    root = state_root()
    sessions = control_root(workspace)
    check_private(root, os.path.join(root, "workspaces"), os.path.dirname(sessions), sessions,
                  *([os.path.join(sessions, session_id)] if session_id else []))


def make_control_root(workspace: str) -> str:
    """The directory of the workspace's sessions' control planes, made (0700) where
    missing, every directory to it checked before (another user's) and after (one a
    racer made meanwhile: make_dirs takes what is there)."""
    from ._atomic import make_dirs
    check_places(workspace)
    root = control_root(workspace)
    make_dirs(root)
    check_places(workspace)
    return root


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
