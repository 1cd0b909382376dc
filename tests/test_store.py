"""The session store: atomic files, the append-only bus, strict metadata, the lock."""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from support import REPO, base_env, ralph
from ralph.session_store import (BadInput, SessionLocked, acquire_lock, append_event, create, load,
                           read_events, running_pid)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def test_create_lays_out_the_session(workspace):
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    control, work = Path(s.dir), workspace / ".ralph-sessions/s1"
    assert Path(s.work_dir) == work
    assert not control.is_relative_to(workspace)   # the control plane: out of agents' reach
    for sub in ("signals/inputs", "signals/processed", "signals/rejected", "questions",
                "answers", "iterations/1/tasks", "iterations/1/knowledge"):
        assert (control / sub).is_dir(), sub
    for sub in ("iterations/1/logs", "iterations/1/knowledge"):   # the agents' side
        assert (work / sub).is_dir(), sub
    assert (work / "scratchpad.md").is_file() and not (work / "metadata.yaml").exists()
    meta = yaml.safe_load((control / "metadata.yaml").read_text())
    assert meta["schema_version"] == 1 and meta["revision"] == 1
    assert meta["orchestrator"]["state"] == "PLANNING" and meta["status"] == "active"
    assert [e["topic"] for e in read_events(s.dir)[0]] == ["session.created"]
    # private: session data can carry secrets
    for folder in (control, work):
        assert oct(os.stat(folder).st_mode & 0o777) == "0o700", folder
    assert oct(os.stat(os.path.join(s.dir, "metadata.yaml")).st_mode & 0o777) == "0o600"
    assert oct(os.stat(work / "scratchpad.md").st_mode & 0o777) == "0o600"


def test_a_state_directory_inside_the_workspace_is_refused(workspace):
    """The control plane kept where agents write would be theirs to rewrite: refused in
    one line, before anything is made."""
    env = base_env(RALPH_STATE_DIR=workspace / "state")
    r = ralph(workspace, "session", "start", "obj", "--id", "s1", env=env)
    assert r.returncode == 2 and "lies inside the workspace" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (workspace / "state").exists() and not (workspace / ".ralph-sessions").exists()


def test_create_refuses_an_existing_or_bad_id(workspace):
    create(str(workspace), "obj", now=NOW, session_id="s1")
    with pytest.raises(BadInput, match="already exists"):
        create(str(workspace), "obj", now=NOW, session_id="s1")
    for bad in ("../x", "/abs", "-lead", "a" * 65, "sp ace", ".hidden"):
        with pytest.raises(BadInput, match="expected"):
            create(str(workspace), "obj", now=NOW, session_id=bad)
        with pytest.raises(BadInput, match="expected"):
            load(str(workspace), bad)


def test_typed_refusals_are_bad_input_with_the_same_words(workspace):
    """Callers catch what happened (AlreadyAnswered, ...), never a message; every one is
    a BadInput (exit 2) whose one line is unchanged."""
    from ralph import session_store
    from ralph.session_store import (AlreadyAnswered, QuestionCancelled, UnknownQuestion,
                               UnknownSession, questions)
    for error in (AlreadyAnswered, QuestionCancelled, UnknownQuestion, UnknownSession):
        assert issubclass(error, BadInput) and error.__name__ in session_store.__all__
    with pytest.raises(UnknownSession, match=r"^unknown session 'nope' in "):
        load(str(workspace), "nope")
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    with pytest.raises(UnknownQuestion, match=r"^unknown question 'q1'$"):
        questions.load_question(s.dir, "q1")
    with pytest.raises(UnknownQuestion):
        questions.answer(s.dir, "q1", "yes", now=NOW)

    def ask(qid):
        return questions.ask(s.dir, questions.Question(
            id=qid, text="Which?", asked_at=NOW, deadline=NOW, on_timeout="continue",
            context=questions.QuestionContext(session="s1", state="PLANNING", iteration=1)))
    ask("q1")
    questions.answer(s.dir, "q1", "first", now=NOW)
    with pytest.raises(AlreadyAnswered, match=r"^question q1 is already answered$"):
        questions.answer(s.dir, "q1", "second", now=NOW)
    assert questions.read_answer(s.dir, "q1").text == "first"
    questions.resolve(s.dir, ask("q2"), questions.QuestionStatus.CANCELLED, NOW)
    with pytest.raises(QuestionCancelled, match=r"^question q2 was cancelled: it takes no answer$"):
        questions.answer(s.dir, "q2", "late", now=NOW)


def test_sessions_let_go_keep_no_descriptor_open(workspace):
    """A long-lived process (the web view, the bot) loads sessions over and over and
    writes their work areas: each Session let go gives back the directories its work
    area kept open (the test suite's process once ran out of them: select() failed)."""
    session = create(str(workspace), "fds", now=NOW, session_id="f1")
    session.work.write("inbox/a.json", "{}", "reply")

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))
    before = open_fds()
    for _ in range(300):
        loaded = load(str(workspace), "f1")
        loaded.work.write("inbox/a.json", "{}", "reply")
        loaded.work.write("iterations/1/logs/x.log", "x", "log")
    del loaded
    assert open_fds() <= before + 1   # one Session's at most, none per load


def _make_work_area(ws: str, sid: str, go) -> None:
    from ralph.session_store import WorkArea
    go.wait()
    WorkArea(os.path.join(ws, ".ralph-sessions", sid)).write("scratchpad.md", sid)


def test_sessions_started_together_in_a_new_workspace_both_start(tmp_path):
    """Engines starting at the same moment in a workspace that has no `.ralph-sessions/`
    yet each make it where missing: the one that finds it made a moment ago goes on (it
    stopped with FileExistsError: a flake in CI's two concurrent `session start`)."""
    forked = multiprocessing.get_context("fork")
    for n in range(20):
        ws = tmp_path / f"ws{n}"
        ws.mkdir()
        go = forked.Barrier(4)
        procs = [forked.Process(target=_make_work_area, args=(str(ws), f"s{i}", go))
                 for i in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0], n
        assert sorted(os.listdir(ws / ".ralph-sessions")) == ["s0", "s1", "s2", "s3"]


def test_save_increments_revision(workspace):
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    s.save(NOW)
    s.save(NOW)
    assert load(str(workspace), "s1").metadata.revision == 3


@pytest.mark.parametrize("edit, path", [
    (lambda m: m.update(iteration="two"), "$.iteration"),
    (lambda m: m.update(surprise=1), "$"),
    (lambda m: m["orchestrator"].update(state="DANCING"), "$.orchestrator.state"),
    (lambda m: m["usage"].update(cost_usd="free"), "$.usage.cost_usd"),
    (lambda m: m["tasks"].update(extra=True), "$.tasks"),
])
def test_corrupt_metadata_is_refused_with_its_path(workspace, edit, path):
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    meta_path = os.path.join(s.dir, "metadata.yaml")
    data = yaml.safe_load(open(meta_path))
    edit(data)
    text = yaml.safe_dump(data)
    with open(meta_path, "w") as f:
        f.write(text)
    with pytest.raises(BadInput) as e:
        load(str(workspace), "s1")
    assert meta_path in str(e.value) and f"{path}:" in str(e.value)
    # through the CLI: exit 2, one line, no traceback, and the file untouched
    for args in (["session", "resume", "s1"], ["session", "status", "s1"]):
        r = ralph(workspace, *args)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert path in r.stderr and "metadata.yaml" in r.stderr
    assert open(meta_path).read() == text


def test_events_append_and_read_incrementally(workspace):
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    records, offset = read_events(s.dir)
    append_event(s.dir, "a.b", {"x": 1}, source="executor", iteration=1, state="PLANNING")
    append_event(s.dir, "c", "text")
    new, offset2 = read_events(s.dir, offset)
    assert [(e["seq"], e["topic"]) for e in new] == [(2, "a.b"), (3, "c")]
    assert set(new[0]) == {"seq", "ts", "topic", "payload", "source", "iteration", "state"}
    assert read_events(s.dir, offset2) == ([], offset2)


def test_torn_last_line_is_skipped_then_cut(workspace):
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    append_event(s.dir, "one")
    path = os.path.join(s.dir, "events.jsonl")
    whole = open(path, "rb").read()
    line = json.dumps({"seq": 3, "ts": "x", "topic": "torn", "payload": None}).encode()
    for cut in range(1, len(line)):
        with open(path, "wb") as f:
            f.write(whole + line[:cut])
        records, offset = read_events(s.dir)
        assert [r["topic"] for r in records] == ["session.created", "one"]
        assert offset == len(whole)
    record = append_event(s.dir, "after")
    assert record["seq"] == 3
    lines = open(path, "rb").read().splitlines()
    assert [json.loads(x)["seq"] for x in lines] == [1, 2, 3]


def _append_many(session_dir, worker, count):
    for i in range(count):
        append_event(session_dir, "load.test", {"worker": worker, "i": i}, source=f"w{worker}")


def test_concurrent_appenders_lose_nothing(workspace):
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(s.dir, w, 200)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records, _ = read_events(s.dir)
    assert [r["seq"] for r in records] == list(range(1, 802))
    got = {(r["payload"]["worker"], r["payload"]["i"]) for r in records[1:]}
    assert got == {(w, i) for w in range(4) for i in range(200)}


def test_lock_refuses_a_second_holder_and_is_reclaimed_after_death(workspace):
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from ralph.session_store import acquire_lock; "
         # the wait is what is proven: it holds the lock until killed
         "acquire_lock(sys.argv[1], 's1'); print('held', flush=True); time.sleep(60)", s.dir],
        env=base_env(), cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert running_pid(s.dir) == holder.pid
    with pytest.raises(SessionLocked, match=f"pid {holder.pid}"):
        acquire_lock(s.dir, "s1")
    holder.kill()
    holder.wait()
    assert running_pid(s.dir) is None
    acquire_lock(s.dir, "s1").release()


def test_lock_refuses_a_symlink(workspace, tmp_path):
    s = create(str(workspace), "obj", now=NOW, session_id="s1")
    target = tmp_path / "elsewhere"
    target.write_text("")
    os.symlink(target, os.path.join(s.dir, "session.lock"))
    with pytest.raises(BadInput, match="symlink"):
        acquire_lock(s.dir, "s1")
