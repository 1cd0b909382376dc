"""Issue 21: a hostile agent tries, from inside its own run, every way to take the human's
control; each attack is refused or ignored, the human's view is unchanged, and nothing
is written outside the workspace. The agent is tests/_hostile_agent.py on the `command`
backend, in ralph's sandbox as every run is (engine/running/sandbox.py): what the sandbox
refuses is recorded, and the engine's own defences behind it are still proven; what a
CLI's own sandbox adds is proven with the real CLIs in tests/test_real_agents.py.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml

from support import (FAST, base_env, events, finish, metadata, prompts, ralph, session_dir,
                     spawn, wait_for, write_config)

HOSTILE = Path(__file__).resolve().parent / "_hostile_agent.py"
MARKER = "123456:SECRET-MARKER-TOKEN"


def hostile_session(ws: Path, plan: dict, *, sid: str = "h", env: dict | None = None,
                    extra: tuple = (), config: dict | None = None):
    """`ralph session start` with the hostile agent playing every role; `plan`: which
    attacks each role's run tries ({"planner": ["rewrite", ...]})."""
    write_config(ws, {"agent": {"backend": "command",
                                "command": [sys.executable, str(HOSTILE)]}, **(config or {})})
    return ralph(ws, "session", "start", "build it", "--id", sid, *extra,
                 env=base_env(**FAST, HOSTILE_PLAN=json.dumps(plan),
                              HOSTILE_OUTSIDE=str(ws.parent / "outside"), **(env or {})))


def attacks(ws: Path) -> dict[str, dict]:
    found = {}
    for line in (ws / "attacks.jsonl").read_text().splitlines():
        record = json.loads(line)
        found[record["attack"]] = record
    return found


def refused_writes(ws: Path) -> dict[str, str]:
    """The files the agent's sandbox kept it from writing, and why."""
    return {r["path"]: r["error"] for r in map(json.loads,
                                                (ws / "attacks.jsonl").read_text().splitlines())
            if r["attack"] == "refused-write"}


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` (links not followed) and a digest of what it holds."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture
def outside(workspace) -> Path:
    """A directory outside the workspace the agent aims at; it must stay as it is."""
    path = workspace.parent / "outside"
    path.mkdir()
    (path / "authorized_keys").write_text("ssh-ed25519 AAAA the-owner\n")
    return path


def test_a_rewritten_workspace_changes_none_of_the_engines_decisions(workspace, outside):
    """The agent rewrites ralph.yml (its command, limits, paths outside, Telegram's API and
    chats) and plants a config, metadata, a bus, an APPROVE signal and an answer in the
    session's work area; paused by its iteration limit, the session is resumed by the
    human: the engine runs the command, limits and paths it started with. Its sandbox
    shows it ralph.yml read-only, so that rewrite is now refused there and then; the same
    config planted by hand (as an agent run with `--sandbox none` could) is still refused
    by the engine."""
    before = tree(outside)
    r = hostile_session(workspace, {"planner": ["rewrite"]}, extra=("--max-iterations", "1"))
    assert r.returncode == 5, r.stdout + r.stderr
    found = attacks(workspace)
    assert found["control_dir_given"]["inside_workspace"] is False
    assert refused_writes(workspace) == {str(workspace / "ralph.yml"): "Read-only file system"}
    assert "evil-ran" not in (workspace / "ralph.yml").read_text()   # the rewrite never landed
    sd = session_dir(workspace, "h")
    r = ralph(workspace, "session", "resume", "h", env=base_env(**FAST))
    # the limit it started with holds: the resume is refused (it would pause at once)
    assert r.returncode == 2 and "max_iterations is 1 " in r.stderr, r.stdout + r.stderr
    meta = metadata(sd)
    assert meta["limits"]["max_iterations"] == 1 and meta["status"] == "paused"
    assert not (workspace / "evil-ran").exists()        # the planted command never ran
    assert tree(outside) == before                      # no docs, no trace written there
    snapshot = yaml.safe_load((sd / "config.yaml").read_text())
    assert snapshot["agent"]["command"] == [sys.executable, str(HOSTILE)]
    assert snapshot["RObot"]["telegram"]["api_url"] is None
    assert snapshot["RObot"]["telegram"]["allowed_chat_ids"] == []
    evs = events(sd)
    assert [e["payload"]["trigger"] for e in evs if e["topic"] == "session.transition"] == \
        ["plan_ready", "batch_done", "next_iteration", "pause"]
    assert all(e["source"] == "engine" for e in evs if e["topic"] == "session.transition")
    assert not [f for f in (sd / "signals/processed").iterdir()]   # no APPROVE taken
    assert not list((sd / "answers").iterdir())
    # a config that is the workspace's (agent-writable) may not point outside it, nor move
    # the bot to another API root or chat than the sessions started with
    (workspace / "ralph.yml").write_text(found["workspace config"]["text"])
    r = ralph(workspace, "session", "start", "again", "--id", "h2", env=base_env(**FAST))
    assert r.returncode == 2 and "leads outside the workspace" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = ralph(workspace, "bot", "run",
              env=base_env(RALPH_TELEGRAM_BOT_TOKEN=MARKER))
    assert r.returncode == 2 and "differs from what session h started with" in r.stderr
    assert MARKER not in r.stdout + r.stderr
    # a config whose agents changed is refused until the human adopts it
    write_config(workspace, {"agent": {"backend": "demo"}})
    r = ralph(workspace, "session", "start", "again", "--id", "h3", env=base_env(**FAST))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "what it runs changed since session h started: $.agent.backend is now " \
        "\"demo\" (was \"command\") (also $.agent.command)" in r.stderr, r.stderr
    r = ralph(workspace, "session", "start", "again", "--id", "h3", "--accept-config",
              env=base_env(**FAST))
    assert r.returncode == 0, r.stderr
    assert "ralph: adopted ralph.yml as it is now, unlike session h: $.agent.backend, " \
        "$.agent.command" in r.stderr, r.stderr


def test_the_humans_verbs_refuse_inside_a_run_however_it_hides(workspace, outside):
    """answer, signal, resume, init from the agent's shell: exit 2, one line, recorded on
    the bus as the run's; also with a cleared environment, setsid and a double fork."""
    r = hostile_session(workspace, {"planner": ["human"]})
    assert r.returncode == 0, r.stdout + r.stderr
    found = attacks(workspace)
    verbs = {k: v for k, v in found.items() if k.startswith("verb ")}
    assert len(verbs) == 9, sorted(verbs)
    for name, what in verbs.items():
        if name == "verb double fork":   # its grandchild's record says it
            continue
        assert what["code"] == 2, (name, what)
        assert "refused inside agent run" in what["err"], (name, what)
        assert len(what["err"].strip().splitlines()) == 1, (name, what)
    sd = session_dir(workspace, "h")
    refused = [e for e in events(sd) if e["topic"] == "cli.refused"]
    assert len(refused) >= 8 and {e["source"] for e in refused} == {"planner"}
    assert {e["payload"]["command"] for e in refused} >= {
        "session answer", "signal", "session resume", "init"}
    assert not list((sd / "signals/processed").iterdir())   # no signal was dropped
    assert not list((sd / "signals/inputs").iterdir())
    assert "agent.command" not in (workspace / "ralph.yml").read_text() or \
        str(HOSTILE) in (workspace / "ralph.yml").read_text()   # init --force refused


def test_agents_cannot_speak_as_the_engine_or_another_run(workspace, outside):
    """Reserved topics are refused in one line and recorded as the run's attempt; a line
    written straight into the run's outbox is taken as the run's own (its claimed source
    is not; naming no run, it is still the run's, never a human's), or refused where it
    names another run; `ralph emit` with the environment cleared is still the run's (it
    finds its session, the one its sandbox shows it, and the run by its supervisor); an
    event past the cap is refused (from `emit` in one line; written straight into the
    outbox, 3 MiB, skipped unread)."""
    r = hostile_session(workspace, {"planner": ["engine"]},
                        config={"event_loop": {"max_event_bytes": 1024}})
    assert r.returncode == 0, r.stdout + r.stderr
    found = attacks(workspace)
    for topic in ("session.transition", "human.response", "human.timeout", "emit.refused",
                  "fallback.triggered", "gate.note", "human.question"):
        what = found["emit " + topic]
        assert what["code"] == 2 and "reserved" in what["err"], (topic, what)
    assert found["emit too large"]["code"] == 2
    assert "at most 1024" in found["emit too large"]["err"]
    evs = events(sd := session_dir(workspace, "h"))
    engine_topics = {e["topic"] for e in evs if e["source"] == "engine"}
    assert not engine_topics & {"human.response", "human.timeout", "fallback.triggered",
                                "human.question", "gate.note"}
    assert all(e["source"] == "engine" for e in evs if e["topic"] == "session.transition")
    assert found["emit with env -i"]["code"] == 0, found["emit with env -i"]["err"]
    forged = [e for e in evs if e["topic"] == "note.forged"]
    assert [(e["source"], e["payload"]) for e in forged] == [("planner", "as the engine"),
                                                             ("planner", "as a human"),
                                                             ("planner", "env cleared")]
    assert not [e for e in evs if e["source"] == "cli"]   # nobody spoke as a human
    refusals = [e["payload"] for e in evs if e["topic"] in ("emit.refused", "cli.refused")]
    assert any("it names run 0000-other, but it is in the outbox of run" in p.get("why", "")
               for p in refusals)
    assert any("at most 1024 bytes" in p.get("why", "") for p in refusals)   # the 3 MiB line
    assert not [e for e in evs if e["topic"] == "note.huge"]
    assert sum("reserved" in p.get("why", "") for p in refusals) == 7
    assert metadata(sd)["status"] == "completed"


def test_a_poll_takes_its_own_roles_signals_only(workspace, outside):
    """`signals poll --role reviewer` from the executor's run is refused, and the STEER
    meant for the reviewer reaches the reviewer, not the executor."""
    write_config(workspace, {"agent": {"backend": "command",
                                       "command": [sys.executable, str(HOSTILE)]}})
    proc = spawn(workspace, "session", "start", "build it", "--id", "h",
                 env=base_env(**FAST, HOSTILE_PLAN=json.dumps({"executor": ["wait", "poll"]})))
    wait_for(lambda: (workspace / "waiting-executor").exists(), timeout=60)
    r = ralph(workspace, "signal", "steer", "for the reviewer only", "--target", "reviewer",
              "--session", "h")
    assert r.returncode == 0, r.stderr
    (workspace / "go").touch()
    code, out, err = finish(proc, timeout=120)
    assert code == 0, out + err
    poll = attacks(workspace)["poll as the reviewer"]
    assert poll["code"] == 2 and "the executor's signals" in poll["err"], poll
    sd = session_dir(workspace, "h")
    assert "for the reviewer only" in "".join(prompts(sd, "reviewer", "t1"))
    assert "for the reviewer only" not in "".join(prompts(sd, "executor", "t1"))


def test_no_secret_reaches_an_agent(workspace, outside):
    """The tokens the engine holds (Telegram's, the web view's, any RALPH_*_TOKEN) are in
    no agent's environment, no ancestor's /proc environ or argv the agent can read."""
    secrets = {"RALPH_TELEGRAM_BOT_TOKEN": MARKER, "RALPH_WEB_TOKEN": MARKER + "-web",
               "RALPH_SOMETHING_API_KEY": MARKER + "-key"}
    r = hostile_session(workspace, {"planner": ["secrets"], "executor": ["secrets"]},
                        env=secrets)
    assert r.returncode == 0, r.stdout + r.stderr
    found = [v for k, v in attacks(workspace).items() if k == "secrets"]
    assert found and all(not f["found"] for f in found), found
    for path in workspace.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert b"SECRET-MARKER" not in path.read_bytes(), path


def test_links_planted_in_the_work_area_lead_the_engine_nowhere(workspace, outside):
    """The agent swaps the inbox, the logs, the next iteration's directory and the
    scratchpad for links to a directory outside the workspace; the engine goes on (its
    next prompts, logs, replies, notes) and writes nothing there."""
    before = tree(outside)
    r = hostile_session(workspace, {"planner": ["links"]})
    assert r.returncode == 0, r.stdout + r.stderr
    r2 = ralph(workspace, "session", "status", "h")
    assert r2.returncode == 0
    assert tree(outside) == before
    assert metadata(session_dir(workspace, "h"))["status"] == "completed"


@pytest.mark.parametrize("damage", ["empty", "missing", "unreadable"])
def test_a_damaged_config_snapshot_refuses_to_resume(workspace, damage):
    """An emptied snapshot resumed silently on the demo agent (its defaults) and marked the
    session completed: now resume refuses in one line, and nothing changes."""
    r = ralph(workspace, "session", "start", "obj", "--id", "s", "--max-iterations", "1",
              env=base_env(**FAST))
    assert r.returncode == 5, r.stdout + r.stderr
    snapshot = session_dir(workspace, "s") / "config.yaml"
    if damage == "empty":
        snapshot.write_text("")
    elif damage == "missing":
        snapshot.unlink()
    else:
        snapshot.unlink()
        snapshot.mkdir()
    before = metadata(session_dir(workspace, "s"))
    r = ralph(workspace, "session", "resume", "s", "--max-iterations", "3",
              env=base_env(**FAST))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "config snapshot" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr
    assert metadata(session_dir(workspace, "s")) == before


def test_a_removed_work_area_is_made_again_and_the_session_goes_on(workspace, outside):
    """An executor that runs `git clean -fdx` (the work area, its outbox and the engine's
    presence gone with it): its own events are refused (no engine there to hear them), the
    engine makes the work area again for the next run, and the session completes."""
    r = hostile_session(workspace, {"executor": ["clean"]})
    assert r.returncode == 0, r.stdout + r.stderr
    found = attacks(workspace)
    assert found["work build.done"]["code"] == 0   # the retry's, heard
    sd = session_dir(workspace, "h")
    assert metadata(sd)["status"] == "completed"
    assert (workspace / ".ralph-sessions" / "h" / "runs").is_dir()
    done = [e for e in events(sd) if e["topic"] == "build.done"]
    assert len(done) == 1 and done[0]["source"] == "executor"
