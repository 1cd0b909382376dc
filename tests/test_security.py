"""Issue 8: what a session leaves on disk is private (its control plane in the state
directory and its work area in the workspace), the Telegram token is never written, chats
outside allowed_chat_ids change nothing, a planted lock, question or answer in the control
plane (a symlink, or a file of another user) is refused, and the links an agent plants in
its work area lead the engine's writes nowhere. SECURITY.md says what each test proves.

Everything here runs the real `ralph` as a subprocess. The modes test runs it under
umask 000, so a mode is restrictive because the engine chose it, not because the
caller's umask happened to be strict.
"""
from __future__ import annotations

import contextlib
import os
import stat
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from ralph.session_store import control_root
from support import (EVIDENCE, FAST, base_env, metadata, ralph, session_dir, spawn, wait_for,
                     work_dir, write_config, write_scenario)
from fake_telegram import FakeTelegram

MARKER = "SECRET-MARKER-TOKEN"
TOKEN = f"123456:{MARKER}"
CHAT, STRANGER = 111, 999
OTHER_UID = 54321

SESSION = [
    {"role": "planner", "iteration": 1, "sleep": 0.5, "emit": [{"topic": "plan.ready", "json": {
        "tasks": [{"id": "t1", "title": "T1"}]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
    {"role": "executor", "attempt": 1, "emit": [
        {"topic": "human.progress", "payload": "working on t1"},
        {"topic": "human.interact", "json": {"text": "Which database?",
                                             "options": ["postgres", "sqlite"]}}]},
    {"role": "executor", "write": {"src/app.py": "print('hi')\n"},
     "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
    {"role": "reviewer", "ask": {"question": "Ship it?", "timeout": 30, "default": "yes"},
     "emit": [{"topic": "review.done", "payload": "tests: pass, build: pass"}]},
    {"role": "librarian", "write_iteration": {"knowledge/notes.md": "# notes\n",
                                              "knowledge/deep/more.md": "# more\n"},
     "emit": [{"topic": "knowledge.staged", "payload": "notes"}]},
]


def pending_question(sd: Path, text: str) -> str:
    def find():
        for p in sorted((sd / "questions").glob("*.yaml")) if sd.exists() else []:
            q = yaml.safe_load(p.read_text())
            if q and q["status"] == "pending" and q["text"] == text and \
                    not (sd / "answers" / p.name).exists():
                return q["id"]
        return None
    return wait_for(find, timeout=60)


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def state_of(ws: Path) -> Path:
    """The workspace's folder in the state directory (its sessions' control planes)."""
    return Path(control_root(str(ws))).parent


def trees(ws: Path) -> list[Path]:
    """Where a workspace's sessions keep files: the work areas and the promoted docs (in
    the workspace), the control planes (in the state directory)."""
    return [ws / ".ralph-sessions", ws / ".docs", state_of(ws)]


def loose_modes(*roots: Path) -> list[str]:
    """Every path under `roots` (and the roots) that is not 0700 (dirs) / 0600 (files)."""
    found = []
    for root in roots:
        for path in [root, *root.rglob("*")]:
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                found.append(f"{path}: a symlink")
            elif stat.S_ISDIR(st.st_mode) and mode != 0o700:
                found.append(f"{path}: {mode:o}")
            elif stat.S_ISREG(st.st_mode) and mode != 0o600:
                found.append(f"{path}: {mode:o}")
    return found


# --- modes ---

def test_every_path_a_session_creates_is_private(workspace):
    """Under umask 000: directories 0700, files 0600 in the control plane (metadata, bus,
    signals, questions, answers, guidance, iterations, reports, reviews, knowledge
    records), in the work area (scratchpad, outbox, inbox replies, prompts, agent logs,
    staged knowledge) and in the promoted .docs; the state directory's folders too."""
    ws = workspace
    scenario = write_scenario(ws, SESSION)
    write_config(ws, {"agent": {"backend": "demo", "script": str(scenario)},
                      "fallback": {"enabled": False}})
    with umask(0):
        proc = spawn(ws, "session", "start", "modes objective", "--id", "m",
                     env=base_env(RALPH_DEMO_SLEEP_SCALE=1))
        sd = session_dir(ws, "m")
        qid = pending_question(sd, "Which database?")
        r = ralph(ws, "signal", "info", "a note for the next prompt", "--session", "m")
        assert r.returncode == 0, r.stderr
        r = ralph(ws, "session", "answer", "m", "postgres")
        assert r.returncode == 0, r.stderr
        in_run = pending_question(sd, "Ship it?")
        assert ralph(ws, "session", "answer", "m", "yes", "--question", in_run).returncode == 0
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
        r = ralph(ws, "init", "-o", "fresh.yml")
        assert r.returncode == 0, r.stderr
    assert (sd / f"answers/{qid}.yaml").exists() and (sd / "guidance.yaml").exists()
    assert list((sd / "signals/processed").iterdir())
    assert (ws / ".docs/notes.md").exists() and (ws / ".docs/deep/more.md").exists()
    assert (sd / "iterations/1/knowledge/promoted.yaml").exists()
    work = work_dir(sd)
    assert list((work / "iterations/1/logs").glob("*.stdout"))
    assert list((work / "iterations/1/logs").glob("*.prompt.md"))
    assert (work / "runs").is_dir() and (work / "scratchpad.md").exists()
    assert loose_modes(*trees(ws)) == []
    assert stat.S_IMODE(state_of(ws).parent.stat().st_mode) == 0o700   # workspaces/
    assert stat.S_IMODE((ws / "fresh.yml").stat().st_mode) == 0o600   # it may hold a token


# --- Telegram: the token, and chats not allowed ---

ENV_DUMP = textwrap.dedent('''
    import os, sys
    # an agent that shows the engine's environment to whoever reads its log
    print("ENV " + repr(sorted(os.environ.items())), flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "ralph.engine.demo_agent", "--script", sys.argv[1]])
''')


def test_the_token_is_never_written_and_strangers_change_nothing(workspace, tmp_path):
    ws = workspace
    scenario = write_scenario(ws, SESSION)
    (ws / "agent.py").write_text(ENV_DUMP)
    write_config(ws, {
        "agent": {"backend": "command", "command": [sys.executable, str(ws / "agent.py"),
                                                    str(scenario)]},
        "fallback": {"enabled": False},
        "RObot": {"enabled": True, "timeout_seconds": 60,
                  "telegram": {"allowed_chat_ids": [CHAT]}}})
    with FakeTelegram(TOKEN) as fake:
        env = base_env(RALPH_TELEGRAM_BOT_TOKEN=TOKEN, RALPH_TELEGRAM_API_URL=fake.url,
                       RALPH_DEMO_SLEEP_SCALE=1, NO_PROXY="127.0.0.1,localhost",
                       no_proxy="127.0.0.1,localhost")
        with umask(0):
            proc = spawn(ws, "session", "start", "telegram objective", "--id", "t", env=env)
        sd = session_dir(ws, "t")
        question = fake.wait_message(lambda m: "Which database?" in m.get("text", ""), timeout=60)
        qid = pending_question(sd, "Which database?")
        pad = (work_dir(sd) / "scratchpad.md").read_bytes()
        guidance = (sd / "guidance.yaml").exists()

        # a chat outside allowed_chat_ids: an answer, guidance, @routing and every command
        stranger = [fake.push(STRANGER, "sqlite", reply_to=question),
                    fake.push(STRANGER, "use mysql instead"), fake.push(STRANGER, "@t steer"),
                    *(fake.push(STRANGER, f"/{c}") for c in
                      ("stop", "pause", "approve", "skip", "resume t", "status", "tail", "help")),
                    fake.push(STRANGER, "sqlite", reply_to=question, user_id=CHAT)]
        fake.wait_confirmed(stranger[-1])
        assert not list((sd / "answers").iterdir())
        for box in ("inputs", "processed", "rejected"):
            assert not list((sd / "signals" / box).iterdir()), box
        assert (work_dir(sd) / "scratchpad.md").read_bytes() == pad
        assert (sd / "guidance.yaml").exists() == guidance
        assert fake.messages(STRANGER) == []

        answered = fake.push(CHAT, "postgres", reply_to=question)
        assert "Answer recorded" in fake.wait_reply(answered)["text"]
        ship = fake.wait_message(lambda m: "Ship it?" in m.get("text", ""), timeout=60)
        fake.push(CHAT, "yes", reply_to=ship)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-2000:] + err[-3000:]
        fake.wait_text("Session t completed")
        assert fake.wrong_tokens == 0
    answer = yaml.safe_load((sd / f"answers/{qid}.yaml").read_text())
    assert (answer["text"], answer["channel"]) == ("postgres", "telegram")
    assert "ignored a message from chat 999" in err
    logs = "".join(p.read_text() for p in work_dir(sd).glob("iterations/*/logs/*.stdout"))
    assert "ENV [" in logs and "RALPH_SESSION_ID" in logs   # the agents' env was dumped
    # the channel's state: in the control root, beside the sessions, out of agents' reach
    assert (Path(control_root(str(ws))) / ".telegram/state.yaml").exists()
    assert not (ws / ".ralph-sessions/.telegram").exists()
    # the marker: in no file of the workspace (logs, work areas) or of the state directory
    # (control planes, channel state, snapshot), in no output
    for path in [*ws.rglob("*"), *state_of(ws).rglob("*")]:
        if path.is_file() and not path.is_symlink():
            assert MARKER.encode() not in path.read_bytes(), path
    assert MARKER not in out and MARKER not in err
    assert loose_modes(*trees(ws)) == []


def test_a_token_from_the_config_file_stays_out_of_the_session(workspace, tmp_path):
    ws = workspace
    scenario = write_scenario(ws, [{"role": "planner", "sleep": 1.5,
                                    "emit": [{"topic": "LOOP_COMPLETE"}]}])
    config = write_config(tmp_path, {
        "agent": {"backend": "demo", "script": str(scenario)},
        "RObot": {"enabled": True, "telegram": {"bot_token": TOKEN, "allowed_chat_ids": [CHAT]}}},
        "outside.yml")
    with FakeTelegram(TOKEN) as fake:
        env = base_env(RALPH_TELEGRAM_API_URL=fake.url, NO_PROXY="127.0.0.1,localhost",
                       no_proxy="127.0.0.1,localhost", RALPH_DEMO_SLEEP_SCALE=1)
        r = ralph(ws, "session", "start", "obj", "--id", "c", "-c", config, env=env)
        assert r.returncode == 0, r.stderr
        assert fake.calls_of("getUpdates") and fake.wrong_tokens == 0   # the token was used
    snapshot = yaml.safe_load((session_dir(ws, "c") / "config.yaml").read_text())
    assert snapshot["RObot"]["telegram"]["bot_token"] is None
    for path in [*ws.rglob("*"), *state_of(ws).rglob("*")]:
        if path.is_file():
            assert MARKER.encode() not in path.read_bytes(), path
    assert MARKER not in r.stdout + r.stderr


# --- planted locks, questions and answers ---

@pytest.fixture
def paused(workspace) -> Path:
    """A session paused by its iteration limit (resumable), from the built-in demo."""
    r = ralph(workspace, "session", "start", "demo objective", "--id", "p", "--max-iterations",
              "1", env=base_env(**FAST))
    assert r.returncode == 5, r.stdout + r.stderr
    return session_dir(workspace, "p")


def test_a_symlinked_lock_is_refused_and_its_target_untouched(workspace, paused, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("VICTIM\n")
    (paused / "session.lock").unlink()
    (paused / "session.lock").symlink_to(victim)
    r = ralph(workspace, "session", "resume", "p", "--max-iterations", "5", env=base_env(**FAST))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "session.lock" in r.stderr and "symlink" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert victim.read_text() == "VICTIM\n"            # not truncated, no pid written
    assert metadata(paused)["status"] == "paused"
    listed = ralph(workspace, "session", "list", "--json")
    assert listed.returncode == 0 and yaml.safe_load(listed.stdout)[0]["running"] is False


def test_a_lock_of_another_user_is_refused(workspace, paused):
    os.chown(paused / "session.lock", OTHER_UID, OTHER_UID)
    r = ralph(workspace, "session", "resume", "p", "--max-iterations", "5", env=base_env(**FAST))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "another user" in r.stderr and f"uid {OTHER_UID}" in r.stderr
    assert metadata(paused)["status"] == "paused"
    assert (paused / "session.lock").stat().st_uid == OTHER_UID


def _question_doc(qid: str, text: str) -> dict:
    t = datetime.now(timezone.utc)
    return {"id": qid, "text": text, "asked_at": t.isoformat(),
            "deadline": (t + timedelta(hours=1)).isoformat(), "on_timeout": "continue",
            "context": {"session": "p", "state": "PLANNING", "iteration": 1}}


def test_planted_question_files_are_refused(workspace, paused, tmp_path):
    outside = tmp_path / "outside.yaml"
    outside.write_text(yaml.safe_dump(_question_doc("qlink", "SECRET question via a link")))
    (paused / "questions/qlink.yaml").symlink_to(outside)
    other = paused / "questions/qother.yaml"
    other.write_text(yaml.safe_dump(_question_doc("qother", "SECRET question of another user")))
    os.chown(other, OTHER_UID, OTHER_UID)
    forged = paused / "questions/qforged.yaml"   # its id would send every write elsewhere
    forged.write_text(yaml.safe_dump(_question_doc("../../../escaped", "SECRET forged id")))
    for qid, why in (("qlink", "symlinks are refused"), ("qother", "another user"),
                     ("qforged", "$.id")):
        r = ralph(workspace, "session", "answer", "p", "an answer", "--question", qid)
        assert r.returncode == 2 and why in r.stderr, (qid, r.stderr)
        assert "Traceback" not in r.stderr
    assert not list((paused / "answers").iterdir())
    r = ralph(workspace, "session", "answer", "p", "an answer")   # no pending question
    assert r.returncode == 2 and "no pending question" in r.stderr, r.stderr
    status = ralph(workspace, "session", "status", "p", "--json")
    assert status.returncode == 0 and "SECRET" not in status.stdout
    # the engine resumes past them: they are no questions of this session
    r = ralph(workspace, "session", "resume", "p", "--max-iterations", "5", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert outside.read_text().count("SECRET") == 1
    # the forged id would climb out of questions/ (and answers/) into the state directory
    assert not list(workspace.parent.rglob("escaped*"))
    assert not list(state_of(workspace).rglob("escaped*"))
    assert not list(state_of(workspace).parent.glob("escaped*"))
    for path in [*paused.rglob("*"), *work_dir(paused).rglob("*")]:
        if path.is_file() and not path.is_symlink() and path != other and path != forged:
            assert b"SECRET" not in path.read_bytes(), path


@pytest.mark.parametrize("plant", ["symlink", "other-user"])
def test_a_planted_answer_is_refused(workspace, tmp_path, plant):
    """An answers/<QID>.yaml the engine did not get from a channel: the engine stops with
    one line naming it (exit 2, the session resumable) rather than act on it."""
    ws = workspace
    scenario = write_scenario(ws, SESSION)
    write_config(ws, {"agent": {"backend": "demo", "script": str(scenario)},
                      "fallback": {"enabled": False}})
    proc = spawn(ws, "session", "start", "objective", "--id", "a", env=base_env(**FAST))
    sd = session_dir(ws, "a")
    qid = pending_question(sd, "Which database?")
    doc = {"question": qid, "text": "SECRET planted answer",
           "answered_at": datetime.now(timezone.utc).isoformat(), "channel": "cli"}
    target = sd / "answers" / f"{qid}.yaml"
    if plant == "symlink":
        outside = tmp_path / "answer.yaml"
        outside.write_text(yaml.safe_dump(doc))
        (sd / "answers/.aside").symlink_to(outside)
    else:
        (sd / "answers/.aside").write_text(yaml.safe_dump(doc))
        os.chown(sd / "answers/.aside", OTHER_UID, OTHER_UID)
    os.rename(sd / "answers/.aside", target)   # appears whole, as a channel's answer does
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, out[-2000:] + err[-2000:]
    assert str(target) in err and "Traceback" not in err
    assert metadata(sd)["status"] == "active"
    assert metadata(sd)["pending_question"] == qid
    for path in [*sd.rglob("*"), *work_dir(sd).rglob("*")]:
        if path.is_file() and not path.is_symlink() and path != target:
            assert b"SECRET" not in path.read_bytes(), path
    # a human removes it; the session resumes into the same question and goes on
    target.unlink()
    proc = spawn(ws, "session", "resume", "a", env=base_env(**FAST))
    assert pending_question(sd, "Which database?") == qid
    assert ralph(ws, "session", "answer", "a", "sqlite").returncode == 0
    in_run = pending_question(sd, "Ship it?")
    assert ralph(ws, "session", "answer", "a", "yes", "--question", in_run).returncode == 0
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]


# --- links an agent plants in its work area ---

HOSTILE = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    env = os.environ
    if env["RALPH_ROLE"] == "executor" and env["RALPH_ATTEMPT"] == "1":
        # a hostile run: every path the engine writes next in the work area becomes a
        # link to a directory or a file outside the workspace; then it waits for the test
        work, it, outside = (Path(env["RALPH_SESSION_DIR"]), Path(env["RALPH_ITERATION_DIR"]),
                             Path(sys.argv[2]))

        def swap(path, target):
            if path.is_dir() and not path.is_symlink():
                path.rename(path.with_name(path.name + ".mine"))
            elif path.exists() or path.is_symlink():
                path.unlink()
            path.symlink_to(target)
        swap(it / "logs", outside / "logs")
        swap(it / "knowledge", outside / "knowledge")
        channel = work / "runs" / env["RALPH_RUN_ID"]
        swap(channel / "inbox", outside / "inbox")
        swap(channel / "outbox.jsonl", outside / "victim.txt")
        swap(work / "runs", outside / "runs")
        swap(work / "scratchpad.md", outside / "victim.txt")
        ws = Path(env["RALPH_WORKSPACE"])
        (ws / "ready").touch()
        while not (ws / "go").exists():
            time.sleep(0.02)   # poll: until the test says go
        sys.exit(0)   # emits nothing: the task's next attempt runs
    os.execv(sys.executable, [sys.executable, "-m", "ralph.engine.demo_agent", "--script", sys.argv[1]])
''')


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root` (links not followed): its kind and content."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        kind = "l" if stat.S_ISLNK(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else "f"
        out[str(path.relative_to(root))] = (kind, path.read_bytes() if kind == "f" else None)
    return out


def test_links_an_agent_plants_in_its_work_area_lead_the_engine_nowhere(workspace, tmp_path):
    """An agent may write its work area, so it may plant a link where the engine writes
    next there: the next runs' logs, the knowledge it stages, its run's inbox of replies
    and outbox (which the engine truncates), the runs' channels, the scratchpad. The engine
    walks every one of those paths from the work area's descriptor without following a
    link: nothing outside changes, nothing outside is read or promoted into the workspace,
    the links are set aside and the session completes."""
    ws = workspace
    outside = tmp_path / "outside"
    for rel, text in (("victim.txt", "VICTIM\n"), ("logs/0003-executor-t1.stdout", "VICTIM\n"),
                      ("inbox/r0000000000000000.json", '{"VICTIM": 1}\n'),
                      ("runs/0004-executor-t1/outbox.jsonl", "VICTIM\n"),
                      ("knowledge/secret.md", "SECRET outside the workspace\n")):
        (outside / rel).parent.mkdir(parents=True, exist_ok=True)
        (outside / rel).write_text(text)
    before = snapshot(outside)
    scenario = write_scenario(ws, [
        {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
            "tasks": [{"id": "t1", "title": "T1"}]}}]},
        {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "reviewer", "emit": [{"topic": "review.done",
                                       "payload": "tests: pass, build: pass"}]},
        {"role": "librarian", "emit": [{"topic": "knowledge.staged", "payload": "notes"}]},
    ])
    (ws / "agent.py").write_text(HOSTILE)
    write_config(ws, {"agent": {"backend": "command", "command": [
        sys.executable, str(ws / "agent.py"), str(scenario), str(outside)]},
        "fallback": {"enabled": False}})
    # unconfined: what is proven is the engine's own walk, for a human who runs with
    # `--sandbox none` (confined, the runs' channels are not the run's to swap at all)
    proc = spawn(ws, "session", "start", "links objective", "--id", "h", "--sandbox", "none",
                 env=base_env(**FAST))
    try:
        wait_for(lambda: (ws / "ready").exists() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.communicate()
        # a human's note, outside the run: the engine writes it into the scratchpad
        r = ralph(ws, "signal", "info", "a note for the scratchpad", "--session", "h")
        assert r.returncode == 0, r.stderr
        (ws / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert snapshot(outside) == before, "a file outside the workspace changed"
    sd = session_dir(ws, "h")
    work = work_dir(sd)
    assert metadata(sd)["status"] == "completed"
    assert not (ws / ".docs/secret.md").exists()
    for path in [*ws.rglob("*"), *sd.rglob("*")]:
        if path.is_file() and not path.is_symlink():
            assert b"SECRET" not in path.read_bytes(), path
    # set aside and made anew: the engine's writes went into the work area
    for rel in ("iterations/1/logs", "runs", "scratchpad.md"):
        assert not (work / rel).is_symlink(), rel
    assert list((work / "iterations/1/logs").glob("*-reviewer-t1.stdout"))
    assert (work / "scratchpad.md").read_text().count("a note for the scratchpad") == 1
