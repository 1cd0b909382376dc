"""Issue 8: torn writes. A crash in the middle of a write leaves either a torn last line in
an appended file (the bus, events.jsonl; the outbox agents append to, in the work area) or
a half-written temp file next to a file that is rewritten whole (temp, fsync, rename).
Loading recovers to the last complete record, nothing else is lost, the session resumes
and completes, and stray temp files are ignored: never read as a signal, an answer or
metadata, never listed as a waiting signal, and never deleted. (They are ours alone,
`.<name>.<pid>.tmp`: a sweep of those whose pid is dead, at engine start, would be safe;
the engine does not do it today, so they stay until a human removes them.)

The sessions are real (`ralph` subprocesses playing a demo scenario); the cuts are made
on what a SIGKILL (RALPH_TEST_CRASH_AT_WRITE) left on disk.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

import _crashkit as kit
from ralph import session_store
from _crashkit import KILLED
from support import (EVIDENCE, FAST, base_env, metadata, ralph, signal_file, spawn, wait_for,
                     write_config, write_scenario)
from ralph.session_store import questions, read_events, signals

SID = "torn"
OBJECTIVE = "Tear the bus"
QUESTION = "Which database?"

STEPS = [
    {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {"tasks": [
        {"id": "t1", "title": "the one task", "batch": 1}]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]},
    {"role": "executor", "task": "t1", "attempt": 1,
     "emit": [{"topic": "human.interact", "json": {"text": QUESTION}}]},
    {"role": "executor", "write": {"out/{task}.py": "# {task}\n"},
     "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": "tests: pass, build: pass"}]},
]
ROOTS = (".docs", ".ralph-demo/out")


def sd_of(ws: Path) -> Path:
    return kit.session_dir(ws, SID)


def work_of(ws: Path) -> Path:
    return kit.work_area(ws, SID)


def start(ws: Path, **env):
    return spawn(ws, "session", "start", OBJECTIVE, "--id", SID, "-c", ws / "ralph.yml",
                 env=base_env(**FAST, **env))


def resume(ws: Path, **env):
    return ralph(ws, "session", "resume", SID, env=base_env(**FAST, **env))


def answer_when_asked(ws: Path, proc) -> None:
    """The human: answers the question once it is pending (the engine holds for it)."""
    def pending():
        if proc.poll() is not None:
            return "exited"
        return questions.pending(str(sd_of(ws))) if (sd_of(ws) / "questions").is_dir() else []
    found = wait_for(pending, timeout=60)
    assert found != "exited", proc.communicate()
    r = ralph(ws, "session", "answer", SID, "sqlite")
    assert r.returncode == 0, r.stderr


def setup_ws(ws: Path) -> None:
    ws.mkdir(parents=True)
    scenario = write_scenario(ws, STEPS)
    write_config(ws, {"agent": {"backend": "demo", "script": str(scenario)},
                      "RObot": {"timeout_seconds": 60}})


class Run:
    """An uninterrupted, traced run: its writes and its outcome."""

    def __init__(self, root: Path):
        self.ws = root / "ws"
        setup_ws(self.ws)
        proc = start(self.ws, RALPH_TEST_WRITE_TRACE=root / "trace")
        answer_when_asked(self.ws, proc)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
        self.writes = kit.read_trace(root / "trace", self.ws, SID)
        self.outcome = kit.check_finished(self.ws, SID, ROOTS)
        assert self.outcome["status"] == "completed"
        assert self.outcome["progress"] == {"1": {"t1": "x"}}

    def point(self, kind: str, after: str | None = None, last: bool = False) -> int:
        """The n of the first (or last) write of `kind`, after the first write of `after`."""
        writes = self.writes
        if after:
            i = next(i for i, w in enumerate(writes) if w.kind == after)
            writes = writes[i + 1:]
        found = [w for w in writes if w.kind == kind]
        return (found[-1] if last else found[0]).n


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    return Run(tmp_path_factory.mktemp("torn-baseline"))


@pytest.fixture
def space(tmp_path):
    """Room for many workspace copies and their sessions' control planes (tmpfs when
    there is one)."""
    path = kit.scratch(tmp_path, "torn")
    with kit.state_in(path):
        yield path
    shutil.rmtree(path, ignore_errors=True)


def killed_at(root: Path, n: int, run: Run) -> Path:
    """A workspace whose engine was SIGKILLed right after its write n (the same write as
    the uninterrupted run's n: the human answers the same way, the traces are compared)."""
    ws = root / "killed"
    setup_ws(ws)
    proc = start(ws, RALPH_TEST_CRASH_AT_WRITE=n, RALPH_TEST_WRITE_TRACE=root / "trace")
    if any(w.kind == "question-status" for w in run.writes[:n]):   # it got its answer
        answer_when_asked(ws, proc)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == KILLED, out + err
    got = [w.kind for w in kit.read_trace(root / "trace", ws, SID)]
    assert got == [w.kind for w in run.writes[:n]], "the run went another way"
    kit.check_after_kill(ws, SID)
    return ws


def copy(src: Path, dst: Path) -> Path:
    return kit.copy_workspace(src, dst)


def resumed_with(base: Path, ws: Path, path: Path, data: bytes, run: Run) -> None:
    """`base` copied to `ws`, its file `path` (of the copy) holding `data`, resumed to the
    end (the human answers): the outcome of the uninterrupted run."""
    copy(base, ws)
    path.write_bytes(data)
    proc = spawn(ws, "session", "resume", SID, env=base_env(**FAST))
    answer_when_asked(ws, proc)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert kit.check_finished(ws, SID, ROOTS) == run.outcome


def resume_forked(workspaces: list[Path], workers: int = kit.WORKERS) -> dict[Path, tuple]:
    """`ralph session resume` of each workspace, each in a process of its own forked from
    this one (which has the engine imported already: a resume that only has to finish a
    session then costs milliseconds, not an interpreter's start). {ws: (exit code, output)}.
    The forks are made from this thread alone, with no other thread running."""
    import ralph.engine.cli  # noqa: F401 - imported here, once, for the children
    import ralph.engine.config  # noqa: F401
    import ralph.engine.driver  # noqa: F401
    import ralph.states.complete  # noqa: F401
    import watchdog.observers  # noqa: F401
    import watchdog.observers.polling  # noqa: F401
    env = base_env(**FAST)
    running: dict[int, Path] = {}
    results: dict[Path, tuple] = {}
    todo = list(workspaces)
    while todo or running:
        while todo and len(running) < workers:
            ws = todo.pop(0)
            pid = os.fork()
            if pid == 0:   # the child: the CLI, as `ralph` runs it
                code = 99
                try:
                    fd = os.open(ws.parent / f"{ws.name}.out",
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    sys.stdout = open(1, "w", closefd=False)   # not pytest's capture
                    sys.stderr = open(2, "w", closefd=False)
                    os.chdir(ws)
                    os.environ.clear()
                    os.environ.update(env)
                    code = ralph.engine.cli.main(["session", "resume", SID])
                except BaseException:  # noqa: BLE001 - the parent reads it in the output
                    import traceback
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            running[pid] = ws
        pid, status = os.wait()
        if pid not in running:
            # an orphan of an earlier test (a run's supervisor) adopted by this process,
            # which an in-process `session start` made a subreaper: reaped, not ours
            continue
        ws = running.pop(pid)
        results[ws] = (os.waitstatus_to_exitcode(status),
                       (ws.parent / f"{ws.name}.out").read_text(errors="replace"))
    return results


# --- a torn last line in events.jsonl ---

def tear(ws: Path) -> tuple[bytes, bytes]:
    """(the bus up to its last line, that last line with its newline)."""
    data = (sd_of(ws) / "events.jsonl").read_bytes()
    assert data.endswith(b"\n")
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    return data[:start], data[start:]


def check_torn_bus_reads(ws: Path, whole: bytes) -> None:
    """Readers see every complete record and nothing of the torn one; the strict loader
    and the status view are not disturbed."""
    sd = sd_of(ws)
    records, offset = read_events(str(sd))
    assert offset == len(whole)
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert len(records) == whole.count(b"\n")
    session_store.load(str(ws), SID)


@pytest.mark.slow
def test_final_transition_record_torn_at_every_byte_then_resume_completes(space, run):
    """The session's last record (the objective_met transition, appended after the
    metadata that says COMPLETE) is cut at every byte: the resume skips the torn part,
    cuts it off when it appends the record again, and writes the summary."""
    base = killed_at(space, run.point("event", last=True), run)
    whole, line = tear(base)
    assert json.loads(line)["topic"] == "session.transition"
    assert json.loads(line)["payload"]["trigger"] == "objective_met"
    transitions = len(run.outcome["transitions"])
    began = time.monotonic()
    workspaces = {}
    for c in range(len(line)):
        ws = workspaces[c] = copy(base, space / f"c{c:04d}")
        (sd_of(ws) / "events.jsonl").write_bytes(whole + line[:c])
        check_torn_bus_reads(ws, whole)
    exits = resume_forked(list(workspaces.values()))

    def cut_at(c: int) -> str | None:
        ws = workspaces[c]
        try:
            code, output = exits[ws]
            assert code == 0, output
            assert kit.check_finished(ws, SID, ROOTS) == run.outcome
            # every line parses (checked above): the torn part was cut, the record
            # written again in its place, once
            records = kit.records(sd_of(ws))
            assert (sd_of(ws) / "events.jsonl").read_bytes().startswith(whole)
            assert len(records) == whole.count(b"\n") + 1
            assert records[-1]["payload"]["trigger"] == "objective_met"
            assert len(kit.transitions(sd_of(ws))) == transitions
        except Exception as e:  # noqa: BLE001 - reported per cut
            return f"cut at byte {c} of {len(line)}: {type(e).__name__}: {e}"
        kit.remove_workspace(ws)
        return None

    failures = [f for f in map(cut_at, range(len(line))) if f]
    print(f"\ntorn final record: {len(line)} cuts resumed in {time.monotonic() - began:.0f}s")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_mid_session_record_torn_then_agents_and_engine_append_after_it(space, run):
    """A record in the middle of a session (the plan_ready transition, with the whole
    batch still to run) cut at every byte: readers skip it and the next appender (the
    engine re-recording the transition) cuts it off; a spread of the cuts is resumed to
    the end, where every agent's and the engine's records follow in order."""
    first_transition = next(w.n for w, before in zip(run.writes[1:], run.writes)
                            if w.kind == "event" and before.kind == "metadata"
                            and not w.creating)
    base = killed_at(space, first_transition, run)
    whole, line = tear(base)
    assert json.loads(line)["payload"]["trigger"] == "plan_ready", line
    # every byte: the store's readers and appender, on this real bus
    probe = copy(base, space / "probe")
    bus = sd_of(probe) / "events.jsonl"
    for c in range(len(line)):
        bus.write_bytes(whole + line[:c])
        check_torn_bus_reads(probe, whole)
        record = session_store.append_event(str(sd_of(probe)), "probe.after", {"cut": c})
        assert record["seq"] == whole.count(b"\n") + 1
        assert bus.read_bytes() == whole + (json.dumps(record, ensure_ascii=False,
                                                       separators=(",", ":")) + "\n").encode()
    # a spread of cuts, each resumed to the end by the real engine
    cuts = sorted({1, 2, len(line) - 2, len(line) - 1} | set(range(0, len(line), 23)))

    def cut_at(c: int) -> str | None:
        ws = space / f"m{c:04d}"
        try:
            resumed_with(base, ws, sd_of(ws) / "events.jsonl", whole + line[:c], run)
        except Exception as e:  # noqa: BLE001
            return f"cut at byte {c} of {len(line)}: {type(e).__name__}: {e}"
        kit.remove_workspace(ws)
        return None

    failures = kit.run_all(cut_at, cuts)
    assert not failures, "\n".join(failures)


# --- what a killed engine's run left in the outbox ---

@pytest.mark.slow
def test_outbox_lines_a_killed_run_left_are_refused_once_and_a_torn_one_dropped(space, run):
    """The engine is killed right after recording the planner's plan.ready, taken from the
    outbox (the record says where it came from: `via`); the planner's run had appended one
    more line, here whole (a line no engine read) or cut (an agent killed mid-append). The
    resume records plan.ready no second time (its via says it was read), refuses the whole
    unread line once, as its run's (that run ended with its engine), drops a torn one
    unrecorded, and completes like an uninterrupted run."""
    base = killed_at(space, run.point("event", after="prompt"), run)
    [channel] = (work_of(base) / "runs").iterdir()   # the planner's run's, the one open
    posted = Path("runs") / channel.name / "outbox.jsonl"
    outbox = (work_of(base) / posted).read_bytes()
    header = json.loads(outbox.split(b"\n", 1)[0])
    open_run = header["run"]
    recorded = kit.records(sd_of(base))[-1]
    assert recorded["topic"] == "plan.ready" and recorded["run"] == open_run, recorded
    assert recorded["via"] == [header["phase"], len(outbox)], (recorded, len(outbox))
    line = (json.dumps({"kind": "event", "id": "r" + "0" * 16, "topic": "note.left",
                        "payload": "left by the planner's run", "run": open_run})
            + "\n").encode()
    cuts = sorted({1, 2, len(line) // 2, len(line) - 2, len(line) - 1, len(line)})

    def cut_at(c: int) -> str | None:
        ws = space / f"o{c:04d}"
        try:
            resumed_with(base, ws, work_of(ws) / posted, outbox + line[:c], run)
            bus = kit.records(sd_of(ws))
            # (the planner runs again: its new run's plan.ready is its own)
            assert [r["via"] for r in bus if r["topic"] == "plan.ready"
                    and r["run"] == open_run] == [recorded["via"]], "read twice"
            assert not [r for r in bus if r["topic"] == "note.left"], "a dead run's line taken"
            refused = [r for r in bus if r["topic"] == "emit.refused"
                       and r["payload"].get("topic") == "note.left"]
            if c == len(line):
                [r] = refused
                assert r["run"] == open_run, r
                assert "ended with the engine" in r["payload"]["why"], r
                assert r["via"] == [header["phase"], len(outbox) + len(line)], r
            else:
                assert refused == [], "a torn line recorded"
        except Exception as e:  # noqa: BLE001 - reported per cut
            return f"cut at byte {c} of {len(line)}: {type(e).__name__}: {e}"
        kit.remove_workspace(ws)
        return None

    failures = kit.run_all(cut_at, cuts)
    assert not failures, "\n".join(failures)


# --- half-written temp files ---

DEAD_PID = 2 ** 22 + 12345   # above pid_max's default: no live process has it


def plant(path: Path, content: bytes) -> Path:
    """What a writer killed mid-write leaves: `.<name>.<pid>.tmp`, half of its content."""
    tmp = path.parent / f".{path.name}.{DEAD_PID}.tmp"
    tmp.write_bytes(content[: max(1, len(content) // 2)])
    return tmp


@pytest.mark.slow
def test_half_written_temp_files_are_ignored_and_nothing_is_lost(space, run):
    """Killed while its question is pending; then writers die mid-write next to the
    session's files: the metadata, the guidance queue, the iteration's metadata and
    progress, the question, and a signal and an answer that never landed (the control
    plane), and the scratchpad (the work area).
    Loading sees the last complete version of each; a complete signal and a complete
    answer written afterwards are both taken; resume completes like an uninterrupted run;
    the temp files are left as they were."""
    ws = killed_at(space, run.point("event", after="question"), run)
    sd, work = sd_of(ws), work_of(ws)
    meta_before = (sd / "metadata.yaml").read_bytes()
    qid = metadata(sd)["pending_question"]
    assert qid and (sd / "questions" / f"{qid}.yaml").exists()
    now = datetime.now(timezone.utc)
    doc = yaml.safe_dump({"type": "INFO", "target": "ALL", "message": "a torn signal"}).encode()
    answer_doc = yaml.safe_dump({"question": qid, "text": "a torn answer",
                                 "answered_at": now.isoformat(), "channel": "cli"}).encode()
    planted = [
        plant(sd / "metadata.yaml", meta_before),
        plant(sd / "guidance.yaml", b'[{"id": "x", "target": "all", "message": "torn"}]\n'),
        plant(work / "scratchpad.md", (work / "scratchpad.md").read_bytes() + b"\n- torn note\n"),
        plant(sd / "iterations" / "1" / "metadata.yaml",
              (sd / "iterations" / "1" / "metadata.yaml").read_bytes()),
        plant(sd / "iterations" / "1" / "progress.md",
              (sd / "iterations" / "1" / "progress.md").read_bytes()),
        plant(sd / "questions" / f"{qid}.yaml", (sd / "questions" / f"{qid}.yaml").read_bytes()),
        plant(sd / "signals" / "inputs" / "signal.260101-000000-000-deadbeef.yaml", doc),
        plant(sd / "answers" / f"{qid}.yaml", answer_doc),
    ]
    contents = {p: p.read_bytes() for p in planted}

    # loading recovers to the last complete version of everything
    loaded = session_store.load(str(ws), SID)
    assert (sd / "metadata.yaml").read_bytes() == meta_before
    assert loaded.metadata.pending_question == qid
    assert signals.waiting(str(sd)) == []
    assert [q.id for q in questions.pending(str(sd))] == [qid]
    assert questions.read_answer(str(sd), qid) is None
    view = ralph(ws, "session", "status", SID, "--json")
    assert view.returncode == 0, view.stderr
    assert json.loads(view.stdout)["waiting_signals"] == []
    listed = ralph(ws, "session", "list", "--json")
    assert listed.returncode == 0 and "error" not in json.loads(listed.stdout)[0], listed.stdout

    # what lands whole afterwards is taken, once
    r = ralph(ws, "signal", "info", "a whole signal", "--session", SID)
    assert r.returncode == 0, r.stderr
    whole_signal = signal_file(r.stdout)
    r = ralph(ws, "session", "answer", SID, "sqlite")
    assert r.returncode == 0, r.stderr
    r = ralph(ws, "session", "answer", SID, "postgres", "--question", qid)
    assert r.returncode == 2 and "already answered" in r.stderr

    r = resume(ws)
    assert r.returncode == 0, r.stdout + r.stderr
    assert kit.check_finished(ws, SID, ROOTS) == run.outcome
    processed = sorted(p.name for p in (sd / "signals" / "processed").iterdir())
    assert processed == [whole_signal]
    assert "handling_metadata" in yaml.safe_load((sd / "signals" / "processed" /
                                                  whole_signal).read_text())
    assert not list((sd / "signals" / "rejected").iterdir())
    assert (work / "scratchpad.md").read_text().count("a whole signal") == 1
    assert "torn" not in (work / "scratchpad.md").read_text()
    assert questions.load_question(str(sd), qid).status is questions.QuestionStatus.ANSWERED
    assert questions.read_answer(str(sd), qid).text == "sqlite"
    bus = kit.records(sd)
    assert sum(1 for e in bus if e["topic"] == "human.response"
               and e["payload"].get("id") == qid) == 1
    assert sum(1 for e in bus if e["topic"] == "human.question"
               and e["payload"].get("id") == qid) == 1
    prompts = sorted((work / "iterations" / "1" / "logs").glob("*.prompt.md"))
    executor = [p.read_text() for p in prompts if "-executor-t1." in p.name]
    assert "sqlite" in executor[-1]
    assert sum("a whole signal" in p.read_text() for p in prompts) == 1
    assert json.loads((sd / "guidance.yaml").read_text()) == []
    # the stray temp files were ignored and are still there, untouched
    assert {p: p.read_bytes() for p in planted if p.exists()} == contents
