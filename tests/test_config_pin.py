"""Agent-written code never runs as the engine (issue 31, item 3): the programs a
workspace's ralph.yml runs are pinned to what the workspace's last session started with,
and the state directory is checked as ssh's StrictModes checks ~/.ssh. Real `ralph`
processes on the demo agent, a real terminal (a pty), real owners and modes."""
from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ralph.session_store import create, dump_yaml
from support import DONE, FAST, RALPH, base_env, demo_config, plan, ralph, write_config
from support.clock import START

STEPS = [plan("t1"), *DONE]


def touching(marker: Path) -> list[str]:
    """A command that leaves `marker` behind when it runs: what an agent's hook would do."""
    return [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]


def started(ws: Path, config: dict, sid: str = "s1") -> None:
    """A session `sid` of the workspace that started with `config`, made as `session
    start` makes one (the store's create, its config snapshot)."""
    from ralph.engine.config import parse, to_data, without_secrets
    snapshot = dump_yaml(to_data(without_secrets(parse(dump_yaml(config), "ralph.yml"))))
    create(str(ws), "earlier", now=START, session_id=sid,
           config_snapshot=snapshot)


def ids(ws: Path, env: dict) -> list[str]:
    r = ralph(ws, "session", "list", "--json", env=env)
    assert r.returncode == 0, r.stderr
    import json
    return [v["session_id"] for v in json.loads(r.stdout)]


# --- A: the programs a workspace's ralph.yml runs are pinned ---

def test_a_hook_appended_between_sessions_runs_only_once_the_human_adopts_it(workspace):
    """The attack: an agent of the first session appends a hook to the workspace's
    ralph.yml; the human's next `session start` ran it, as the engine, with a note about
    agents at most. Now it is refused (exit 2, one line naming the hook and the way to
    adopt it) and the hook never runs, until `--accept-config`."""
    env = base_env(**FAST)
    demo_config(workspace, STEPS)
    assert ralph(workspace, "session", "start", "first", "--id", "s1", env=env).returncode == 0
    marker = workspace / "hook-ran"
    demo_config(workspace, STEPS, {"hooks": {
        "post.session.start": [{"command": touching(marker)}]}})
    r = ralph(workspace, "session", "start", "second", "--id", "s2", env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "ralph.yml: what it runs changed since session s1 started: " \
           "$.hooks['post.session.start'] is now [{\"command\": [" in r.stderr, r.stderr
    assert "(was none)" in r.stderr and "--accept-config" in r.stderr
    assert not marker.exists() and ids(workspace, env) == ["s1"]
    # `ralph validate` says so, and the file stays valid
    r = ralph(workspace, "validate", env=env)
    assert r.returncode == 0 and "ralph.yml: valid" in r.stdout
    assert "warning: ralph.yml: what it runs changed since session s1 started " \
           "($.hooks['post.session.start'])" in r.stderr, r.stderr
    # the human adopts it: it runs, and the console says it was adopted
    r = ralph(workspace, "session", "start", "second", "--id", "s2", "--accept-config",
              env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ralph: adopted ralph.yml as it is now, unlike session s1: " \
           "$.hooks['post.session.start']" in r.stderr, r.stderr
    assert marker.exists()
    # pinned now to s2's: a change that runs nothing new is no reason to ask
    demo_config(workspace, STEPS, {"hooks": {
        "post.session.start": [{"command": touching(marker)}]},
        "event_loop": {"max_iterations": 7}, "agent": {"timeout_seconds": 99}})
    r = ralph(workspace, "session", "start", "third", "--id", "s3", env=env)
    assert r.returncode == 0 and "adopted" not in r.stderr, r.stderr


@pytest.mark.parametrize("before, after, path", [
    ({"agent": {"backend": "command", "command": ["agent-v1"]}},
     {"agent": {"backend": "command", "command": ["agent-v1", "--evil"]}}, "$.agent.command"),
    ({"agent": {"backend": "command", "command": ["agent-v1"]}},
     {"agent": {"backend": "command", "command": ["agent-v1"], "prompt_mode": "arg"}},
     "$.agent.prompt_mode"),
    ({"agent": {"backend": "demo"}},
     {"agent": {"backend": "demo", "script": "planted.yaml"}}, "$.agent.script"),
    ({"agent": {"backend": "demo"}},
     {"agent": {"backend": "demo"},
      "roles": {"reviewer": {"agent": {"backend": "command", "command": ["sh"]}}}},
     "$.roles.reviewer.agent.backend"),
    ({"agent": {"backend": "claude", "on_limit": "switch",
                "limit_fallback": {"backend": "codex"}}},
     {"agent": {"backend": "claude", "on_limit": "switch",
                "limit_fallback": {"backend": "command", "command": ["sh"]}}},
     "$.agent.limit_fallback.backend"),
    ({"hooks": {"pre.plan.ready": [{"command": ["./check-plan.sh"], "on_error": "block"}]}},
     {"hooks": {"pre.plan.ready": [{"command": ["./check-plan.sh"], "on_error": "warn"}]}},
     "$.hooks['pre.plan.ready']"),
    ({"hooks": {"pre.plan.ready": [{"command": ["./check-plan.sh"], "on_error": "block"}]}},
     {}, "$.hooks['pre.plan.ready']"),
])
def test_a_rewritten_agent_or_hook_is_refused_before_anything_runs(workspace, before, after,
                                                                   path):
    """The attack: an agent rewrites the workspace's agent settings (its command and
    arguments, the demo script, a role's or the limit fallback's agent) or a hook (made
    to warn, or dropped); main started on it with a note, or without a word. Refused in
    one line naming the key, nothing made; --accept-config adopts it."""
    env = base_env(**FAST)
    started(workspace, before)
    write_config(workspace, after)
    r = ralph(workspace, "session", "start", "next", "--id", "s2", env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"what it runs changed since session s1 started: {path} is now " in r.stderr, \
        r.stderr
    assert ids(workspace, env) == ["s1"]
    assert not (workspace / ".ralph-sessions" / "s2").exists()


def test_a_config_outside_the_workspace_is_the_humans_and_never_refused(workspace, tmp_path):
    """-c FILE outside the workspace: out of the agents' reach, the human's own; so is
    the first session of a workspace, which adopts its ralph.yml."""
    env = base_env(**FAST)
    marker = workspace / "first-hook-ran"
    demo_config(workspace, STEPS, {"hooks": {"post.session.start": [
        {"command": touching(marker)}]}})
    r = ralph(workspace, "session", "start", "first", "--id", "s1", env=env)
    assert r.returncode == 0 and "adopted" not in r.stderr, r.stderr
    assert marker.exists()
    outside = tmp_path / "mine.yml"
    mine = workspace / "my-hook-ran"
    outside.write_text((workspace / "ralph.yml").read_text().replace(
        str(marker), str(mine)).replace("post.session.start", "pre.session.start"))
    r = ralph(workspace, "session", "start", "mine", "--id", "s2", "-c", outside, env=env)
    assert r.returncode == 0 and "adopted" not in r.stderr, r.stdout + r.stderr
    assert mine.exists()


def test_the_agent_flag_is_the_humans_not_the_files(workspace):
    """--agent names the backend on the command line: a backend other than the last
    session's is the human's choice, not a rewritten file's."""
    started(workspace, {"agent": {"backend": "command", "command": ["agent-v1"]}})
    write_config(workspace, {"agent": {"backend": "command", "command": ["agent-v1"]}})
    r = ralph(workspace, "session", "start", "next", "--id", "s2", "--agent", "demo",
              "--max-iterations", "1", env=base_env(**FAST))
    assert r.returncode in (0, 5), r.stdout + r.stderr
    assert "changed since" not in r.stderr and "adopted" not in r.stderr, r.stderr


SELF_ADOPTING = """\
import json, os, subprocess, sys
ws = os.environ["RALPH_WORKSPACE"]
def ralph(*args):
    return subprocess.run([sys.executable, "-m", "ralph.engine", *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
if os.environ["RALPH_ROLE"] == "planner":
    try:   # (its sandbox shows it ralph.yml read-only: the attack stops here already)
        with open(os.path.join(ws, "ralph.yml"), "a") as f:
            f.write(%r)
        rewrote = None
    except OSError as e:
        rewrote = e.strerror
    r = ralph("session", "start", "mine", "--id", "evil", "--accept-config")
    with open(os.path.join(ws, "nested.json"), "w") as f:
        json.dump({"code": r.returncode, "stderr": r.stderr, "rewrite": rewrote}, f)
    ralph("emit", "LOOP_COMPLETE")
"""


@pytest.mark.parametrize("confined", [True, False])
def test_an_agent_cannot_adopt_its_own_rewrite(workspace, confined):
    """The attack: the agent appends a hook to ralph.yml and starts a session of its own
    with --accept-config, so that the newest session (what the human's next start is
    compared with) has its hook. Confined, its rewrite fails (ralph.yml is read-only to
    it) and its nested start has no sandbox to be had; unconfined (`--sandbox none`), the
    nested start is refused inside a run as the humans' verbs are. Either way the human's
    next start still refuses the hook."""
    import json
    marker = workspace / "hook-ran"
    agent = workspace / "agent.py"
    hook = f"hooks:\n  post.session.start:\n  - command: {json.dumps(touching(marker))}\n"
    agent.write_text(SELF_ADOPTING % hook)
    write_config(workspace, {"agent": {"backend": "command",
                                       "command": [sys.executable, str(agent)]}})
    env = base_env(**FAST)
    r = ralph(workspace, "session", "start", "obj", "--id", "s1",
              *(() if confined else ("--sandbox", "none")), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    nested = json.loads((workspace / "nested.json").read_text())
    assert nested["code"] == 2, nested
    if confined:
        assert nested["rewrite"] == "Read-only file system", nested
        (workspace / "ralph.yml").write_text((workspace / "ralph.yml").read_text() + hook)
    else:
        assert "session start --accept-config: refused inside " in nested["stderr"], nested
    assert ids(workspace, env) == ["s1"] and not marker.exists()
    r = ralph(workspace, "session", "start", "next", "--id", "s2", env=env)
    assert r.returncode == 2 and "$.hooks['post.session.start'] is now" in r.stderr, r.stderr
    assert not marker.exists()


def at_a_terminal(ws: Path, answer: str, *args) -> tuple[int, str]:
    """`ralph session start ARGS` with stdin and stderr on a terminal (a pty) where
    `answer` is typed once it asks: (exit code, what the terminal showed)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(RALPH + ["session", "start", *args], cwd=ws, env=base_env(**FAST),
                            stdin=terminal, stdout=subprocess.PIPE, stderr=terminal)
    os.close(terminal)
    shown, asked = b"", False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:   # the process closed the terminal: it ended
                    break
                if not chunk:
                    break
                shown += chunk
            if not asked and b"[y/N] " in shown:
                os.write(controller, answer.encode() + b"\n")
                asked = True
            if proc.poll() is not None and not ready:
                break
        proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(controller)
    return proc.returncode, shown.decode(errors="replace")


def test_at_a_terminal_the_human_is_asked(workspace):
    """stdin and stderr a terminal: the changes are shown, one a line, and a yes adopts
    the config; a no (or anything else) refuses it as without a terminal."""
    started(workspace, {"agent": {"backend": "demo"}})
    marker = workspace / "hook-ran"
    demo_config(workspace, STEPS, {"hooks": {
        "post.session.start": [{"command": touching(marker)}]}})
    code, shown = at_a_terminal(workspace, "n", "next", "--id", "s2")
    assert code == 2, shown
    assert "runs other programs than session s1 started with" in shown
    assert "  $.agent.script is now " in shown and "(was none)" in shown
    assert "  $.hooks['post.session.start'] is now " in shown
    assert "what it runs changed since session s1 started" in shown   # the refusal
    assert not marker.exists()
    code, shown = at_a_terminal(workspace, "y", "next", "--id", "s2")
    assert code == 0, shown
    assert "ralph: adopted ralph.yml as it is now, unlike session s1" in shown
    assert marker.exists()


# --- B: the state directory is the user's own, as ssh's StrictModes wants ~/.ssh ---

def state_env(state: Path, **extra) -> dict:
    return base_env(**FAST, RALPH_STATE_DIR=state, **extra)


def test_a_state_root_others_can_write_is_refused(workspace, tmp_path):
    """The attack: another local user pre-creates a shared RALPH_STATE_DIR, writable by
    all, and plants there what the victim's engine reads. main used it; now one line,
    exit 2, naming the path and the fix, and nothing is made in it."""
    state = tmp_path / "shared-state"
    state.mkdir()
    state.chmod(0o777)
    demo_config(workspace, STEPS)
    r = ralph(workspace, "session", "start", "x", "--id", "s1", env=state_env(state))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (
        f"ralph: error: {state}: writable by group and others (mode 0777), and another "
        f"user could plant what ralph reads there: chmod go-w {state}")
    assert list(state.iterdir()) == []
    state.chmod(0o775)
    r = ralph(workspace, "session", "list", env=state_env(state))
    assert r.returncode == 2 and "writable by group (mode 0775)" in r.stderr, r.stderr


def foreign_uid() -> int:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user takes root")
    return 1000


def test_a_state_root_another_user_owns_is_refused(workspace, tmp_path):
    """The same attack with the directory the other user's own, even not writable by
    the victim's group or others: refused, naming its owner."""
    uid = foreign_uid()
    state = tmp_path / "their-state"
    state.mkdir(mode=0o755)
    os.chown(state, uid, uid)
    demo_config(workspace, STEPS)
    r = ralph(workspace, "session", "start", "x", "--id", "s1", env=state_env(state))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (
        f"ralph: error: {state}: owned by uid {uid}, not by you (uid {os.geteuid()}), and "
        f"another user could plant what ralph reads there: set RALPH_STATE_DIR to a "
        f"directory of your own, or remove it")
    assert list(state.iterdir()) == []


def test_a_session_planted_in_a_shared_state_directory_runs_nothing(workspace, tmp_path):
    """The attack, whole: the other user's state directory holds a paused session of the
    victim's workspace whose config has a hook of his; the victim resumes it. main ran
    the hook as the victim; now every level is checked (the state root, the workspace's
    folder, the session's control plane) and the resume is refused."""
    uid = foreign_uid()
    state = tmp_path / "state"
    marker = workspace / "planted-hook-ran"
    demo_config(workspace, STEPS, {"hooks": {"pre.iteration.start": [
        {"command": touching(marker)}]}})
    r = ralph(workspace, "session", "start", "x", "--id", "p", "--max-iterations", "1",
              env=state_env(state))
    assert r.returncode == 5, r.stdout + r.stderr
    marker.unlink()
    session = next(state.glob("workspaces/*/sessions/p"))
    for level in (session, session.parent.parent, state):   # deepest first: each refused
        for path in (level, *level.rglob("*")):
            os.chown(path, uid, uid, follow_symlinks=False)
        r = ralph(workspace, "session", "resume", "p", "--max-iterations", "3",
                  env=state_env(state))
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.startswith(f"ralph: error: {level}: owned by uid {uid}"), r.stderr
        assert not marker.exists()
    # given back to the victim but left writable by all: still refused
    for path in (state, *state.rglob("*")):
        os.chown(path, os.geteuid(), os.getegid(), follow_symlinks=False)
    session.chmod(0o777)
    r = ralph(workspace, "session", "status", "p", env=state_env(state))
    assert r.returncode == 2 and f"{session}: writable by group and others" in r.stderr
    session.chmod(0o700)
    r = ralph(workspace, "session", "resume", "p", "--max-iterations", "3",
              env=state_env(state))
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker.exists()


def test_a_fresh_state_directory_is_made_private_and_a_plain_one_is_taken(workspace,
                                                                         tmp_path):
    """Made by ralph: 0700 at every level, whatever the umask. Made by the user with a
    usual mode (0755: others read, none writes): taken."""
    state = tmp_path / "fresh" / "state"
    demo_config(workspace, STEPS)
    old = os.umask(0)
    try:
        r = ralph(workspace, "session", "start", "x", "--id", "s1", env=state_env(state))
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stdout + r.stderr
    session = next(state.glob("workspaces/*/sessions/s1"))
    for path in (state, state / "workspaces", session.parent.parent, session.parent,
                 session):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    plain = tmp_path / "plain"
    plain.mkdir(mode=0o755)
    plain.chmod(0o755)
    r = ralph(workspace, "session", "start", "x", "--id", "s2", env=state_env(plain))
    assert r.returncode == 0, r.stdout + r.stderr


def test_on_a_fleets_store_too(tmp_path, postgres_url):
    """On a PostgreSQL store: what a workspace's ralph.yml runs is compared with the
    newest session of that workspace on this machine (the store lists the fleet's), and
    the local state directory is checked as with files."""
    def machine(name: str) -> tuple[Path, dict]:
        ws = tmp_path / name / "ws"
        ws.mkdir(parents=True)
        return ws, base_env(**FAST, RALPH_STORE_URL=postgres_url,
                            RALPH_STATE_DIR=tmp_path / name / "state", RALPH_MACHINE=name)
    (ws_a, env_a), (ws_b, env_b) = machine("a"), machine("b")
    demo_config(ws_a, STEPS)
    assert ralph(ws_a, "session", "start", "x", "--id", "s1", env=env_a).returncode == 0
    marker = ws_b / "hook-ran"
    hooks = {"hooks": {"post.session.start": [{"command": touching(marker)}]}}
    demo_config(ws_b, STEPS, hooks)   # another workspace's first session: its own
    r = ralph(ws_b, "session", "start", "x", "--id", "s2", env=env_b)
    assert r.returncode == 0 and "adopted" not in r.stderr, r.stdout + r.stderr
    marker.unlink()
    demo_config(ws_a, STEPS, hooks)
    r = ralph(ws_a, "session", "start", "x", "--id", "s3", env=env_a)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "changed since session s1 started: $.hooks['post.session.start']" in r.stderr
    assert not marker.exists()
    state = tmp_path / "a" / "state"
    state.chmod(0o777)
    r = ralph(ws_a, "session", "start", "x", "--id", "s3", "--accept-config", env=env_a)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{state}: writable by group and others (mode 0777)" in r.stderr, r.stderr
    assert not marker.exists()
