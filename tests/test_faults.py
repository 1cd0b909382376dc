"""Faults beyond kill -9: many writers of one file at once, a frozen engine, a stepped
wall clock, no file-system watcher (a full or failing disk: tests/test_disk_faults.py)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from ralph.engine import clock as engine_clock
from ralph.session_store._watch import watch
from ralph.session_store import write_atomic
from support import (EVIDENCE, FAST, REPO, REVIEW_OK, base_env, events, finish, metadata,
                     question_files, ralph, session_dir, spawn, wait_for, write_config,
                     write_scenario)
from support.engines import config, engine_for
from support.recording import SUCCEED, RecordingAgent
from support.sessions import new_session

PAD = "x" * 4000     # bigger than one write of a pipe, so a torn file would show


def _parse(text: str) -> str:
    doc = yaml.safe_load(text)
    assert doc["pad"] == PAD, "a torn read"
    return doc["who"]


def test_threads_and_processes_rewriting_one_file_never_tear_it(tmp_path):
    """DESIGN §4: a reader never sees half a file, even with writers in threads of one
    process (a channel's thread beside the engine's) and in other processes at once."""
    path = tmp_path / "question.yaml"
    write_atomic(str(path), yaml.safe_dump({"who": "start", "pad": PAD}))
    errors: list[str] = []
    reads = [0]
    done = threading.Event()

    def write_in_thread(k: int) -> None:
        try:
            for i in range(200):
                write_atomic(str(path), yaml.safe_dump({"who": f"t{k}-{i}", "pad": PAD}))
        except Exception as e:  # noqa: BLE001 - every failure is the test's finding
            errors.append(f"writer t{k}: {type(e).__name__}: {e}")

    def read() -> None:
        while not done.is_set():
            try:
                _parse(path.read_text())
                reads[0] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(f"reader: {type(e).__name__}: {e}")

    script = ("import sys, yaml\nfrom ralph.session_store import write_atomic\n"
              "for i in range(200):\n"
              "    write_atomic(sys.argv[1], yaml.safe_dump({'who': f'p{sys.argv[2]}-{i}', "
              f"'pad': {PAD!r}}}))\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), str(k)], cwd=REPO,
                              env=base_env(), stderr=subprocess.PIPE, text=True)
             for k in range(2)]
    threads = [threading.Thread(target=write_in_thread, args=(k,)) for k in range(4)]
    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    done.set()
    for t in readers:
        t.join()
    assert not errors, errors[:5]
    assert reads[0] > 50
    assert _parse(path.read_text()).startswith(("t", "p"))
    assert [p.name for p in tmp_path.iterdir()] == ["question.yaml"]   # no temp file left


# --- a frozen engine (SIGSTOP, a suspended laptop) ---

FROZEN = [
    {"role": "planner", "iteration": 1,
     "emit": [{"topic": "plan.ready", "json": {"tasks": [{"id": "t1", "title": "T1"}]}}]},
    {"role": "executor", "attempt": 1,
     "emit": [{"topic": "human.interact", "payload": "Tabs or spaces?"}]},
    {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE", "payload": "nothing left"}]},
]


def test_a_frozen_engine_is_seen_refuses_a_second_and_applies_a_passed_deadline_once(
        workspace):
    script = write_scenario(workspace, FROZEN)
    write_config(workspace, {"agent": {"backend": "demo", "script": str(script)},
                             "RObot": {"timeout_seconds": 3}, "fallback": {"enabled": False}})
    engine = spawn(workspace, "session", "start", "freeze me", "--id", "f1",
                   env=base_env(**FAST))
    sd = session_dir(workspace, "f1")
    try:
        wait_for(lambda: sd.exists() and list((sd / "questions").glob("*.yaml")), timeout=60)
        os.kill(engine.pid, signal.SIGSTOP)
        [question] = question_files(sd)
        view = json.loads(ralph(workspace, "session", "status", "f1", "--json").stdout)
        assert view["running"] and view["engine_stopped"], view
        text = ralph(workspace, "session", "status", "f1").stdout
        assert f"engine pid {engine.pid} is stopped" in text and "no progress since" in text
        assert " stopped" in ralph(workspace, "session", "list").stdout
        second = ralph(workspace, "session", "resume", "f1")
        assert second.returncode == 2 and "locked by a running engine" in second.stderr
        # the wait is what is proven: the question's deadline passes while it is frozen
        time.sleep(max(0.0, _seconds_until(question["deadline"])) + 0.2)
        os.kill(engine.pid, signal.SIGCONT)
        code, out, err = finish(engine, timeout=60)
    finally:
        if engine.poll() is None:
            os.kill(engine.pid, signal.SIGCONT)
            engine.kill()
    assert code == 0, out + err
    timeouts = [e for e in events(sd) if e["topic"] == "human.timeout"]
    assert len(timeouts) == 1, timeouts
    assert metadata(sd)["status"] == "completed"


def _seconds_until(when) -> float:
    """Seconds from now to `when` (a question file's deadline, as YAML reads it)."""
    when = when if isinstance(when, datetime) else datetime.fromisoformat(when)
    return (when - datetime.now(timezone.utc)).total_seconds()


# --- the wall clock stepped while a question waits ---

@pytest.mark.parametrize("step", [timedelta(hours=1), timedelta(hours=-1)],
                         ids=["forward", "back"])
def test_a_stepped_clock_neither_loses_a_deadline_nor_fires_it_early(
        workspace, clock, monkeypatch, step):
    """The rule (engine/clock.py): a deadline is a wall-clock instant; a step forward past
    it fires it at the next reading of the clock; a step back postpones it by the step,
    the wait reading the clock again at least every CHECK_SECONDS. The clock is stepped
    (freezegun) during the hold's first wait, as NTP would step it."""
    session = new_session(workspace, clock=clock)
    timeout = 600 if step > timedelta(0) else 2
    engine = engine_for(session, RecordingAgent(), clock=clock,
                        config=config({"RObot": {"timeout_seconds": timeout}}))
    question = engine.desk.ask("Deploy now?", on_timeout="continue")
    asked = clock.now()
    waits: list[float] = []
    waited = clock.wait

    def stepped_during_the_first_wait(wakeup, seconds):
        waits.append(seconds)
        if len(waits) == 1:
            clock.frozen.tick(step)
            return False
        return waited(wakeup, seconds)
    monkeypatch.setattr(clock, "wait", stepped_during_the_first_wait)
    engine.desk.hold()
    if step > timedelta(0):          # stepped past the deadline: fired at once
        assert clock.now() == asked + step and len(waits) == 1
    else:                            # the 2 s deadline became an hour away: fired then
        assert clock.now() == question.deadline
        assert sum(waits[1:]) == pytest.approx(timeout - step.total_seconds())
    assert max(waits) <= engine_clock.CHECK_SECONDS
    timeouts = [e for e in events(session.dir) if e["topic"] == "human.timeout"]
    assert len(timeouts) == 1 and timeouts[0]["payload"]["id"] == question.id


# --- no file-system watcher ---

def test_a_watcher_that_cannot_start_falls_back_to_a_1_second_poll(tmp_path):
    woken = threading.Event()
    seen: list[str] = []
    watching = watch([str(tmp_path / "no-such-directory")], woken, notify=seen.append)
    try:
        assert watching.failed                      # it says why
        assert woken.wait(2.5), "no wakeup from the fallback poll"
        assert seen == [str(tmp_path / "no-such-directory")]
    finally:
        watching()


def test_the_bus_wakes_the_engine_and_the_writes_beside_it_do_not(tmp_path):
    """The engine follows the bus as its file: its own metadata writes next to it, at
    every step, must not wake it (through watchdog they cost more CPU than the step)."""
    bus = tmp_path / "events.jsonl"
    bus.write_text("")
    woken = threading.Event()
    watching = watch([], woken, files=[str(bus)])
    try:
        for i in range(5):
            write_atomic(str(tmp_path / "metadata.yaml"), f"revision: {i}\n")
        assert not woken.wait(0.5), "woken by a write beside the bus"
        with open(bus, "a") as f:
            f.write('{"seq": 1}\n')
        assert woken.wait(5), "not woken by an append to the bus"
    finally:
        watching()


def test_a_file_that_cannot_be_watched_alone_is_watched_through_its_directory(tmp_path):
    woken = threading.Event()
    watching = watch([], woken, files=[str(tmp_path / "not-yet.jsonl")])
    try:
        (tmp_path / "not-yet.jsonl").write_text("{}\n")
        assert woken.wait(5), "no wakeup: the directory was not watched instead"
    finally:
        watching()


def test_the_engine_says_so_when_no_watcher_works(workspace, clock, monkeypatch):
    import watchdog.observers
    import watchdog.observers.polling

    class Broken:
        def __init__(self, *a, **k):
            raise OSError(28, "inotify watch limit reached")
    monkeypatch.setattr(watchdog.observers, "Observer", Broken)
    monkeypatch.setattr(watchdog.observers.polling, "PollingObserver", Broken)
    session = new_session(workspace)
    out = io.StringIO()
    engine = engine_for(session, RecordingAgent(otherwise=SUCCEED), clock=clock, out=out)
    assert engine.run() == 0
    assert "no file-system watcher works here" in out.getvalue()
    failed = [e for e in events(session.dir) if e["topic"] == "engine.watcher_failed"]
    assert len(failed) == 1 and "inotify watch limit" in failed[0]["payload"]["why"]
