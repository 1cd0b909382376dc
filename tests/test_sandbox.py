"""Issue 31: ralph confines every run itself (engine/running/sandbox.py), whatever the
agent's CLI does. Each test is a real `ralph` with a real bubblewrap around a hostile
`command` agent (or hook) that tries, from inside its run, what an agent running with the
user's rights could do on main: write a human's signal into the control plane it is
handed, write outside the workspace, read ~/.pgpass and ~/.ssh, see and signal the engine,
rewrite the workspace's ralph.yml and .git/config. Each attack fails, and the session
completes as if it had not been tried.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

from support import (FAST, base_env, finish, metadata, only_session, ralph, spawn, wait_for,
                     work_dir, write_config)
from support.disk import signal_files

SECRET = "pgpass-secret-not-for-agents"

PROBE = '''
    import json, os, socket, sys
    ws = os.environ["RALPH_WORKSPACE"]
    found = {}

    def attempt(name, act):
        try:
            found[name] = ["ok", act()]
        except OSError as e:
            found[name] = ["refused", e.strerror]

    def write(path, text):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def read(path):
        with open(path) as f:
            return f.read()

    control = os.environ.get("RALPH_CONTROL_DIR", os.environ["PROBE_STATE"])
    attempt("control-signal", lambda: write(
        os.path.join(control, "signals", "inputs", "signal.999999-999999-999-x.yaml"),
        "type: ABORT\\nmessage: the agent says stop\\n"))
    attempt("state-files", lambda: [f for _, _, files in os.walk(os.environ["PROBE_STATE"])
                                    for f in files])
    attempt("control-metadata", lambda: read(os.path.join(control, "metadata.yaml")))
    attempt("outside-write", lambda: write(os.environ["PROBE_OUTSIDE"] + "/owned", "owned"))
    attempt("pgpass", lambda: read(os.path.expanduser("~/.pgpass")))
    attempt("ssh-key", lambda: read(os.path.expanduser("~/.ssh/id_ed25519")))
    attempt("ralph-yml", lambda: write(os.path.join(ws, "ralph.yml"), "hooks: {}\\n"))
    attempt("git-config", lambda: write(os.path.join(ws, ".git", "config"), "[core]\\n"))
    attempt("workspace-write", lambda: write(os.path.join(ws, "made-by-agent"), "fine"))
    runs = os.path.join(os.environ["RALPH_SESSION_DIR"], "runs")
    own = os.path.join(runs, os.environ["RALPH_RUN_ID"])
    attempt("other-run-channel", lambda: write(os.path.join(runs, "9999-executor-x",
                                                            "outbox.jsonl"), "{}"))
    attempt("own-inbox-reply", lambda: write(os.path.join(own, "inbox", "r1.json"), "{}"))
    attempt("own-outbox", lambda: open(os.path.join(own, "outbox.jsonl"), "a").close())
    attempt("tmp-write", lambda: write(os.environ["PROBE_TMP"], "mine"))
    attempt("processes", lambda: sorted(
        open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode()[:200]
        for p in os.listdir("/proc") if p.isdigit()))
    attempt("engine-signal", lambda: os.kill(int(os.environ["PROBE_ENGINE"]), 0)
            if os.environ.get("PROBE_ENGINE") else None)
    if os.environ.get("PROBE_PORT"):
        attempt("network", lambda: socket.create_connection(
            ("127.0.0.1", int(os.environ["PROBE_PORT"])), timeout=5).close())
    with open(os.path.join(ws, "probe.json"), "w") as f:
        json.dump(found, f)
    print("LOOP_COMPLETE")
'''


@pytest.fixture
def home():
    """A home of the user's with the secrets docs/fleets.md and ssh keep, out of /tmp
    (which every run has a private one of): the sandbox must hide them, not the tmpfs."""
    path = Path(tempfile.mkdtemp(prefix="ralph-sandbox-home-", dir=Path.home()))
    (path / ".pgpass").write_text(f"db.example:5432:fleet:ralph:{SECRET}\n")
    (path / ".ssh").mkdir()
    (path / ".ssh" / "id_ed25519").write_text(SECRET)
    (path / "outside").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def probing(ws: Path, home: Path, **env) -> dict:
    (ws / "probe.py").write_text(textwrap.dedent(PROBE))
    os.makedirs(ws / ".git", exist_ok=True)
    (ws / ".git" / "config").write_text("[core]\n\tbare = false\n")
    write_config(ws, {"agent": {"backend": "command",
                                "command": [sys.executable, str(ws / "probe.py")]},
                      "git": {"commits": False}})
    return base_env(**FAST, HOME=str(home), PROBE_OUTSIDE=str(home / "outside"),
                    PROBE_STATE=os.environ["RALPH_STATE_DIR"],
                    PROBE_TMP=f"/tmp/ralph-scratch-{ws.parent.name}", **env)


def probes(ws: Path) -> dict:
    return json.loads((ws / "probe.json").read_text())


def test_a_hostile_agent_takes_nothing_and_the_session_completes(workspace, home):
    env = probing(workspace, home)
    code, out, err = finish(spawn(workspace, "session", "start", "probe the sandbox", "--id",
                                  "sb", env=env))
    assert code == 0, out + err
    assert "sandbox: agents and hooks write only the workspace" in err
    got = probes(workspace)
    sd = only_session(workspace)
    # the control plane: not there to write, nor to list
    assert got["control-signal"][0] == "refused", got
    # (of it, only its own session's is shown, read-only: a poll's quick look, `ralph mcp`'s
    # status; no other session's, nothing else of the state directory)
    assert got["control-metadata"][0] == "ok", got
    files = got["state-files"][1]
    assert "metadata.yaml" in files and "config.yaml" in files, got
    assert not signal_files(sd, "processed") and not signal_files(sd, "inputs")
    assert metadata(sd)["status"] == "completed"
    # nothing outside the workspace written; the user's secrets not read
    assert got["outside-write"][0] == "refused" and not (home / "outside" / "owned").exists()
    assert SECRET not in json.dumps(got)
    # what steers the engine later (its config, git's config): read-only
    assert got["ralph-yml"][0] == "refused" and got["git-config"][0] == "refused", got
    assert "hooks" not in (workspace / "ralph.yml").read_text()
    # the runs' channels: only its own outbox is the run's to write (no lane speaks for
    # another, no reply is forged in its own inbox)
    assert got["other-run-channel"][0] == "refused" and got["own-inbox-reply"][0] == \
        "refused" and got["own-outbox"][0] == "ok", got
    # the workspace and a private /tmp are the run's
    assert got["workspace-write"][0] == "ok" and (workspace / "made-by-agent").exists()
    assert got["tmp-write"][0] == "ok"
    assert not Path(f"/tmp/ralph-scratch-{workspace.parent.name}").exists()
    # its own processes only: not the engine's, not its command line
    seen = got["processes"][1]
    assert not any("session start" in cmd for cmd in seen), seen
    assert len(seen) < 10, seen


def test_an_agent_cannot_signal_a_process_outside_its_run(workspace, home):
    """A pid outside the run (this test's own), handed to the agent: in the run's PID
    namespace there is no such process to signal (on main, the same user's agent could
    SIGSTOP or SIGKILL its engine)."""
    env = probing(workspace, home, PROBE_ENGINE=os.getpid())
    r = ralph(workspace, "session", "start", "probe the sandbox", "--id", "sg", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert probes(workspace)["engine-signal"] == ["refused", "No such process"]


def test_network_none_leaves_a_run_only_its_own_loopback(workspace, home):
    """agent.network: none (from the human's config outside the workspace): a server on the
    engine's loopback is out of reach; with the default (open) it is reached."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        env = probing(workspace, home, PROBE_PORT=port)
        outside = home / "ralph.yml"
        config = yaml.safe_load((workspace / "ralph.yml").read_text())
        config["agent"]["network"] = "none"
        outside.write_text(yaml.safe_dump(config))
        r = ralph(workspace, "session", "start", "probe", "--id", "n1", "-c", outside, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "no network" in r.stderr
        assert probes(workspace)["network"][0] == "refused"
        r = ralph(workspace, "session", "start", "probe", "--id", "n2", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert probes(workspace)["network"] == ["ok", None]
    finally:
        server.close()


def test_a_hook_the_agent_rewrote_runs_confined(workspace, home):
    """The `./check-plan.sh` hook of docs/approvals-and-hooks.md, rewritten by an agent: it
    runs, as the agent does, unable to write outside the workspace or read the user's
    secrets."""
    script = workspace / "check.sh"
    script.write_text(f'#!/bin/sh\necho owned > "{home}/outside/by-hook" || true\n'
                      f'cat "$HOME/.pgpass" > hook-read.txt 2>&1 || true\n'
                      f'touch hook-ran\n')
    script.chmod(0o755)
    write_config(workspace, {"hooks": {"pre.session.start": [{"command": ["./check.sh"]}]}})
    r = ralph(workspace, "session", "start", "hooked", "--id", "hk",
              env=base_env(**FAST, HOME=str(home)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (workspace / "hook-ran").exists()
    assert not (home / "outside" / "by-hook").exists()
    assert SECRET not in (workspace / "hook-read.txt").read_text()


def test_without_bubblewrap_a_session_is_refused_in_one_line(workspace):
    """Fails closed: no sandbox to be had, no run (exit 2, nothing made), and the line says
    what is missing and how to get it."""
    bare = workspace.parent / "bin"
    bare.mkdir()
    r = ralph(workspace, "session", "start", "x", "--id", "nb",
              env=base_env(**FAST, PATH=str(bare)))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "bubblewrap" in lines[0] and "apt-get install bubblewrap" \
        in lines[0] and "--sandbox none" in lines[0], lines
    assert not (workspace / ".ralph-sessions").exists()


def test_only_the_human_runs_agents_unconfined(workspace, home):
    """`agent.sandbox: none` in the workspace's ralph.yml (an agent can write it) is
    refused; from a config outside the workspace, or `--sandbox none`, it runs
    unconfined and says so."""
    write_config(workspace, {"agent": {"sandbox": "none"}})
    r = ralph(workspace, "session", "start", "x", "--id", "u1", env=base_env(**FAST))
    assert r.returncode == 2 and "$.agent.sandbox: none is taken only from a config " \
        "outside the workspace" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    outside = home / "mine.yml"
    outside.write_text("agent: {sandbox: none}\n")
    (workspace / "ralph.yml").unlink()
    r = ralph(workspace, "session", "start", "x", "--id", "u2", "-c", outside,
              env=base_env(**FAST))
    assert r.returncode == 0 and f"sandbox: none (agent.sandbox: none in {outside})" \
        in r.stderr, r.stderr
    r = ralph(workspace, "session", "start", "x", "--id", "u3", "--sandbox", "none",
              env=base_env(**FAST))
    assert r.returncode == 0 and "sandbox: none (--sandbox none)" in r.stderr, r.stderr
    write_config(workspace, {"agent": {"writable": [str(home)]}})
    r = ralph(workspace, "session", "start", "x", "--id", "u4", env=base_env(**FAST))
    assert r.returncode == 2 and "$.agent.writable" in r.stderr, r.stderr


GRACEFUL = '''
    import os, signal, subprocess, sys, time
    ws = os.environ["RALPH_WORKSPACE"]
    if sys.argv[1:] == ["child"]:
        def saved(signum, frame):
            time.sleep(0.5)   # the wait is what is proven: the SIGTERM grace outlasts saving work
            open(os.path.join(ws, "term.txt"), "w").write(f"saved after {signum}")
            sys.exit(0)
        signal.signal(signal.SIGTERM, saved)
        open(os.path.join(ws, "ready"), "w").close()
        time.sleep(60)   # the wait is what is proven: it runs until stopped
    subprocess.run([sys.executable, __file__, "child"])
'''


def test_pause_gives_a_sandboxed_child_its_grace_and_leaves_nothing(workspace):
    """In a sandbox the run's first process ending ends its PID namespace: the engine asks
    it last, so a child that saves its work on SIGTERM still has its grace."""
    agent = workspace / "graceful.py"
    agent.write_text(textwrap.dedent(GRACEFUL))
    write_config(workspace, {"agent": {"backend": "command",
                                       "command": [sys.executable, str(agent)]},
                             "fallback": {"enabled": False}})
    proc = spawn(workspace, "session", "start", "hold", "--id", "pg", env=base_env(**FAST))
    wait_for(lambda: (workspace / "ready").exists(), timeout=30)
    r = ralph(workspace, "signal", "pause", "hold on")
    assert r.returncode == 0, r.stderr
    code, out, err = finish(proc)
    assert code == 3, out + err
    assert (workspace / "term.txt").read_text() == f"saved after {int(signal.SIGTERM)}"
    from ralph.engine.running.containment import find
    assert not find(str(work_dir(only_session(workspace))))


def test_a_clis_own_folder_is_made_before_its_first_run(tmp_path, home):
    """A CLI keeps its conversations in its folder (Claude Code's ~/.claude/projects): a
    home without one yet gets it before the run, bound writable, so the next run can
    continue the conversation (`--resume` after a usage limit's wait)."""
    from ralph.engine.running.sandbox import Sandbox
    ws = tmp_path / "ws"
    ws.mkdir()
    moved = home / "codex-elsewhere"
    for cli, env, made in (("claude", {}, home / ".claude"),
                           ("codex", {"CODEX_HOME": str(moved)}, moved)):
        assert not made.exists()
        argv = Sandbox("bwrap", home=str(home)).wrap(["true"], dict(env), tree=str(ws),
                                                     work_dir=str(ws / "work"), cli=cli)
        assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700, cli
        i = argv.index(str(made))
        assert argv[i - 1] == "--bind" and argv[i + 1] == str(made), argv
