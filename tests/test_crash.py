"""Crash safety (DESIGN §4, §10): a real engine killed with SIGKILL at any durable write,
or at a random moment, leaves a session that `ralph session resume` completes, with the
same tasks, progress, files and transition log as a run that was never interrupted.

How the kill points are chosen: the engine counts its durable writes (per process) and,
when RALPH_TEST_CRASH_AT_WRITE=N is set (only tests set it), SIGKILLs itself right after
the Nth. RALPH_TEST_WRITE_TRACE=path makes it log "N pid kind path" for every write: an
uninterrupted traced run (the `baseline` fixture) gives the write list the matrix picks
from. RALPH_TEST_CRASH_POINTS=all (read by this file only) kills at every write instead
of the default spread of 22; RALPH_TEST_CRASH_POINTS=N (N >= 20) picks N.
"""
from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

import _crashkit as kit
from ralph import session_store
from _crashkit import KILLED, Write, run_all
from support import (EVIDENCE, FAST, base_env, metadata, progress_markers, ralph, signal_file,
                     spawn, wait_for, write_config, write_scenario)

SID = "crash"
OBJECTIVE = "Build a greeting CLI"


def session_dir(ws: Path) -> Path:
    return kit.session_dir(ws, SID)


def start(ws: Path, **env):
    return ralph(ws, "session", "start", OBJECTIVE, "--id", SID, env=base_env(**FAST, **env))


def resume(ws: Path, **env):
    return ralph(ws, "session", "resume", SID, env=base_env(**FAST, **env))


def read_trace(trace: Path, ws: Path) -> list[Write]:
    return kit.read_trace(trace, ws, SID)


# --- what a session left on disk (the checks live in _crashkit, shared by the crash suites) ---

transitions = kit.transitions


def check_after_kill(ws: Path) -> None:
    kit.check_after_kill(ws, SID)


def check_finished(ws: Path) -> dict:
    return kit.check_finished(ws, SID)


def outcome(ws: Path) -> dict:
    return kit.outcome(ws, SID)


# --- the uninterrupted run every crashed one is compared with ---

class Baseline(NamedTuple):
    writes: list[Write]
    outcome: dict

    @property
    def creating(self) -> list[Write]:
        """The writes made while the session is built aside (before it is renamed in)."""
        return kit.creation(self.writes)

    @property
    def running(self) -> list[Write]:
        return self.writes[len(self.creating):]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Baseline:
    root = tmp_path_factory.mktemp("baseline")
    ws = root / "ws"
    ws.mkdir()
    r = start(ws, RALPH_TEST_WRITE_TRACE=root / "trace")
    assert r.returncode == 0, r.stdout + r.stderr
    writes = read_trace(root / "trace", ws)
    assert [w.n for w in writes] == list(range(1, len(writes) + 1)), "one engine process"
    result = check_finished(ws)
    assert result["status"] == "completed"
    assert result["progress"] == {"1": {"greet": "x", "farewell": "x", "cli": "x"}}
    assert result["tasks"] == {"total": 3, "completed": 3, "failed": 0, "pending": 0}
    return Baseline(writes, result)


def choose_points(writes: list[Write], target: int = 22) -> list[Write]:
    """Every write with RALPH_TEST_CRASH_POINTS=all. Otherwise, to keep the suite fast: the
    riskiest points (each transition persisted in metadata but not yet recorded, the first
    write of every kind, each iteration's creation, the last write), then transition records
    and other writes, evenly spaced, up to `target`."""
    wanted = os.environ.get("RALPH_TEST_CRASH_POINTS", "")
    if wanted == "all":
        return list(writes)
    if wanted.isdigit():
        target = max(20, int(wanted))
    chosen, kinds, paths = {}, set(), set()
    for i, w in enumerate(writes):
        nxt = writes[i + 1] if i + 1 < len(writes) else None
        if (w.kind == "metadata" and nxt is not None and nxt.kind == "event") \
                or w.kind not in kinds \
                or (w.kind == "iteration-metadata" and w.path not in paths) \
                or nxt is None:
            chosen[w.n] = w
        kinds.add(w.kind)
        paths.add(w.path)
    rest = [w for w in writes if w.n not in chosen]
    for pool in ([w for w in rest if w.kind == "event"], [w for w in rest if w.kind != "event"]):
        need = min(target - len(chosen), len(pool))
        for i in range(max(need, 0)):
            w = pool[i * len(pool) // need]
            chosen[w.n] = w
    return sorted(chosen.values())



# --- the kill matrix ---

@pytest.mark.slow
def test_kill_at_every_kind_of_durable_write_then_resume_completes(tmp_path, baseline):
    points = choose_points(baseline.running)
    kinds = {w.kind for w in points}
    assert len(points) >= 20, points
    assert {"metadata", "event", "progress", "iteration-metadata", "task", "plan", "report",
            "prompt", "outbox-reset",
            "review", "knowledge-record", "knowledge-promote", "summary"} <= kinds, kinds
    # both trees: the control plane (state directory) and the work area (workspace)
    assert any(w.path.startswith(".ralph-sessions/") for w in points), points
    last = baseline.writes[-1].n

    def kill_at(w: Write) -> str | None:
        ws = tmp_path / f"w{w.n:03d}"
        ws.mkdir()
        try:
            r = start(ws, RALPH_TEST_CRASH_AT_WRITE=w.n)
            assert r.returncode == KILLED, f"not killed: exit {r.returncode}\n{r.stderr}"
            check_after_kill(ws)
            r = resume(ws)
            if w.n == last:  # the summary is the last write: the session was complete
                assert r.returncode == 2 and "nothing to resume" in r.stderr, r.stderr
            else:
                assert r.returncode == 0, f"resume exited {r.returncode}\n{r.stdout}{r.stderr}"
            assert check_finished(ws) == baseline.outcome
        except Exception as e:  # noqa: BLE001 - reported per point below
            return f"killed after write {w.n} ({w.kind} {w.path}): {type(e).__name__}: {e}"
        kit.remove_workspace(ws)
        return None

    failures = run_all(kill_at, points)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_kill_while_the_session_is_being_created_leaves_no_session(tmp_path, baseline):
    """The control plane is built aside and renamed in: a kill before the rename leaves no
    session (resume says so), whatever the work area already holds; starting again under
    the same id then runs normally. Every write of the creation is a point."""
    points = baseline.creating
    assert points[-1].kind == "event" and points[-1].creating, points
    assert any(w.path.startswith(".ralph-sessions/") for w in points), points

    def kill_at(w: Write) -> str | None:
        ws = tmp_path / f"c{w.n:03d}"
        ws.mkdir()
        try:
            r = start(ws, RALPH_TEST_CRASH_AT_WRITE=w.n)
            assert r.returncode == KILLED, r.stderr
            assert session_store.list_ids(str(ws)) == []
            for staged in Path(session_store.control_root(str(ws))).glob(
                    ".creating-*/metadata.yaml"):
                assert isinstance(yaml.safe_load(staged.read_text()), dict)
            r = resume(ws)
            assert r.returncode == 2 and "unknown session" in r.stderr, r.stderr
            r = start(ws)
            assert r.returncode == 0, r.stdout + r.stderr
            assert check_finished(ws) == baseline.outcome
        except Exception as e:  # noqa: BLE001
            return f"killed after write {w.n} ({w.kind} {w.path}): {type(e).__name__}: {e}"
        return None

    failures = run_all(kill_at, points)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_kill_again_and_again_while_recovering(tmp_path, baseline):
    """Resume is itself killed, early and often: between persisting a transition and
    recording it, then at its own first writes. Every transition is recorded once."""
    running = baseline.running
    commit = next(w for i, w in enumerate(running)
                  if w.kind == "metadata" and running[i + 1].kind == "event")
    ws = tmp_path / "ws"
    ws.mkdir()
    r = start(ws, RALPH_TEST_CRASH_AT_WRITE=commit.n)
    assert r.returncode == KILLED, r.stderr
    check_after_kill(ws)
    for n in (1, 1, 2, 4, 8):
        r = resume(ws, RALPH_TEST_CRASH_AT_WRITE=n)
        assert r.returncode == KILLED, f"resume with a kill at its write {n}: {r.returncode}"
        check_after_kill(ws)
    r = resume(ws)
    assert r.returncode == 0, r.stdout + r.stderr
    assert check_finished(ws) == baseline.outcome


@pytest.mark.slow
def test_kill_at_random_moments_then_resume_completes(tmp_path, baseline):
    """Agents sleep (scale 0.2) so kills land inside agent runs as well as between writes."""
    rng = random.Random(0xC4A5)
    delays = [round(rng.uniform(0.0, 1.2), 3) for _ in range(4)]

    kills = []

    def kill_after(job) -> str | None:
        i, delay = job
        ws = tmp_path / f"r{i}"
        ws.mkdir()
        try:
            p = spawn(ws, "session", "start", OBJECTIVE, "--id", SID,
                      env=base_env(RALPH_DEMO_SLEEP_SCALE="0.2"))
            wait_for(lambda: (session_dir(ws) / "metadata.yaml").exists()
                     or p.poll() is not None, timeout=30)
            # the wait is what is proven: killed `delay` seconds into the run (the crash's instant)
            time.sleep(delay)
            killed = p.poll() is None
            if killed:
                os.kill(p.pid, signal.SIGKILL)
            p.communicate(timeout=30)
            if killed:
                kills.append(delay)
                assert p.returncode == KILLED, p.returncode
                check_after_kill(ws)
                r = resume(ws)
                done = r.returncode == 2 and "nothing to resume" in r.stderr \
                    and (session_dir(ws) / "summary.md").exists()
                assert r.returncode == 0 or done, r.stdout + r.stderr
            else:  # the run ended before its moment came: it must have completed
                assert p.returncode == 0, p.returncode
            assert check_finished(ws) == baseline.outcome
        except Exception as e:  # noqa: BLE001
            return f"killed {delay}s into the run: {type(e).__name__}: {e}"
        return None

    failures = run_all(kill_after, list(enumerate(delays)))
    assert not failures, "\n".join(failures)
    assert len(kills) >= len(delays) // 2, f"only {kills} of {delays} killed a running engine"


@pytest.mark.slow
def test_kill_while_signals_are_handled_then_each_is_handled_once(tmp_path, baseline):
    """Signals wait in the mailbox of a crashed session; the resume that takes them is
    killed at each write of their handling (take, guidance queue, scratchpad, handled,
    delivery). After the final resume each signal is in processed/ once, with its
    handling_metadata, its note is in the scratchpad once, and the guidance was delivered."""
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    r = start(prepared, RALPH_TEST_CRASH_AT_WRITE=baseline.running[0].n)
    assert r.returncode == KILLED, r.stderr
    names = []
    for args in (("info", "keep functions small"),
                 ("steer", "use snake_case", "--target", "executor")):
        r = ralph(prepared, "signal", *args, "--session", SID, env=base_env())
        assert r.returncode == 0, r.stderr
        names.append(signal_file(r.stdout))

    traced = kit.copy_workspace(prepared, tmp_path / "traced")
    r = resume(traced, RALPH_TEST_WRITE_TRACE=tmp_path / "trace")
    assert r.returncode == 0, r.stdout + r.stderr
    writes = read_trace(tmp_path / "trace", traced)
    assert check_finished(traced) == baseline.outcome
    # the first signal's take, guidance queue, scratchpad note and handled mark; then the
    # guidance leaving the queue once a run carried it
    points, kinds = [], set()
    for w in writes:
        if (w.kind.startswith("signal-") or w.kind in ("guidance", "scratchpad")) \
                and w.kind not in kinds:
            points.append(w)
            kinds.add(w.kind)
    points.append([w for w in writes if w.kind == "guidance"][-1])
    assert kinds == {"signal-take", "guidance", "scratchpad", "signal-handled"}, writes

    def check_signals(ws: Path) -> None:
        sd = session_dir(ws)
        pad = (kit.work_area(ws, SID) / "scratchpad.md").read_text()
        assert not list((sd / "signals" / "inputs").iterdir())
        assert not list((sd / "signals" / "rejected").iterdir())
        assert sorted(p.name for p in (sd / "signals" / "processed").iterdir()) == sorted(names)
        for name in names:
            doc = yaml.safe_load((sd / "signals" / "processed" / name).read_text())
            assert doc["handling_metadata"]["handled_by"] == "Ralph-Orchestrator", doc
            assert pad.count(name) == 1, f"{name} in the scratchpad:\n{pad}"
        assert not yaml.safe_load((sd / "guidance.yaml").read_text()), "guidance not delivered"

    check_signals(traced)

    def kill_at(w: Write) -> str | None:
        ws = kit.copy_workspace(prepared, tmp_path / f"s{w.n:03d}")
        try:
            r = resume(ws, RALPH_TEST_CRASH_AT_WRITE=w.n)
            assert r.returncode == KILLED, r.stderr
            check_after_kill(ws)
            r = resume(ws)
            assert r.returncode == 0, r.stdout + r.stderr
            assert check_finished(ws) == baseline.outcome
            check_signals(ws)
        except Exception as e:  # noqa: BLE001
            return f"killed after write {w.n} ({w.kind} {w.path}): {type(e).__name__}: {e}"
        return None

    failures = run_all(kill_at, points)
    assert not failures, "\n".join(failures)


# --- one engine per session ---

def _agent_processes(work: Path) -> list[int]:
    """Pids of live processes whose environment names this session's work area (its
    agents)."""
    mark = f"RALPH_SESSION_DIR={work}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_second_engine_is_refused_and_a_killed_engines_lock_is_reclaimed(workspace):
    script = write_scenario(workspace, [
        {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
            "tasks": [{"id": "t1", "title": "One slow task"}]}}]},
        {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor", "sleep": 30, "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "reviewer", "emit": [{"topic": "review.done",
                                       "payload": "tests: pass, build: pass"}]},
    ])
    write_config(workspace, {"agent": {"backend": "demo", "script": str(script)}})
    first = spawn(workspace, "session", "start", "One slow task", "--id", "locked",
                  "-c", "ralph.yml", env=base_env(RALPH_DEMO_SLEEP_SCALE="1"))
    sd, work = kit.session_dir(workspace, "locked"), kit.work_area(workspace, "locked")
    try:
        wait_for(lambda: first.poll() is not None or (
            (sd / "metadata.yaml").exists()
            and metadata(sd)["orchestrator"]["state"] == "EXECUTING_BATCH"
            and _agent_processes(work)), timeout=30)
        assert first.poll() is None, first.communicate()

        r = ralph(workspace, "session", "resume", "locked", env=base_env(**FAST))
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1 and f"pid {first.pid}" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        r = ralph(workspace, "session", "start", "again", "--id", "locked",
                  env=base_env(**FAST))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
        assert first.poll() is None, "the refused engines disturbed the running one"

        os.kill(first.pid, signal.SIGKILL)
        first.communicate(timeout=10)
        assert first.returncode == KILLED
        wait_for(lambda: not _agent_processes(work), timeout=10)  # the agent died with it
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()

    check_after_kill_at(workspace, "locked")
    r = ralph(workspace, "session", "resume", "locked", env=base_env(**FAST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert progress_markers(sd)["1"] == {"t1": "x"}
    assert metadata(sd)["status"] == "completed"
    assert [t["trigger"] for t in transitions(sd)] == [
        "plan_ready", "batch_done", "next_iteration", "objective_met"]


def check_after_kill_at(ws: Path, session_id: str) -> None:
    sd = kit.session_dir(ws, session_id)
    assert isinstance(yaml.safe_load((sd / "metadata.yaml").read_text()), dict)
    session_store.load(str(ws), session_id)
