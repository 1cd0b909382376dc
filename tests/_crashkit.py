"""What the crash suites (test_crash, test_matrix, test_torn) check on a session a kill
left behind, and on the session once resumed to its end. Shared, so every suite holds a
session to the same invariants.

Functions take the workspace and the session id: the session's control plane is in the
state directory (`session_dir`), its work area in the workspace (`work_area`). A copy of a
workspace (`copy_workspace`) copies both, as a second checkout with its sessions.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import yaml

from ralph.session_store import control_root, work_root
from _planes import FilePlane, Plane
from support import RALPH, base_env, progress_markers, progress_view_markers
from support import session_dir as control_dir
from ralph.engine.machine import TRANSITIONS
from ralph.states import State

KILLED = -signal.SIGKILL
WORKERS = max(2, min(4, os.cpu_count() or 2))


class Write(NamedTuple):
    n: int
    kind: str
    # relative to the session's control plane; `state:` and the path relative to the
    # workspace's folder in the state directory (`state:sessions/.creating-<id>-<pid>/...`
    # while the session is built aside); else relative to the workspace (the work area:
    # `.ralph-sessions/<id>/...`); else absolute
    path: str

    @property
    def creating(self) -> bool:
        """A write into the session's control plane as it is built aside."""
        return self.path.startswith(STAGING)


STAGING = "state:sessions/.creating-"


def scratch(tmp_path: Path, name: str) -> Path:
    """Where a slow suite puts its many workspaces: $RALPH_TEST_SCRATCH_DIR, else /dev/shm
    when it is there (a SIGKILL does not care about fsync, and tmpfs makes hundreds of
    runs and copies fast), else tmp_path. The caller removes it."""
    chosen = os.environ.get("RALPH_TEST_SCRATCH_DIR")
    shm = Path("/dev/shm")
    if chosen:
        return Path(tempfile.mkdtemp(prefix=f"ralph-{name}-", dir=chosen))
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix=f"ralph-{name}-", dir=shm))
    path = tmp_path / name
    path.mkdir()
    return path


@contextmanager
def state_in(root: Path):
    """The sessions' control planes in `root/state` (the state directory, RALPH_STATE_DIR,
    of this process and of every `ralph` it starts) while inside: a slow suite keeps them
    beside its workspaces, on the same fast disk, and removes them with them."""
    old = os.environ.get("RALPH_STATE_DIR")
    os.environ["RALPH_STATE_DIR"] = str(root / "state")
    try:
        yield root / "state"
    finally:
        if old is None:
            del os.environ["RALPH_STATE_DIR"]
        else:
            os.environ["RALPH_STATE_DIR"] = old


@contextmanager
def scratch_state(tmp_path: Path, name: str):
    """A slow suite's place (`scratch`) with the sessions' control planes in it
    (`state_in`) while inside; removed at the end."""
    path = scratch(tmp_path, name)
    try:
        with state_in(path):
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def session_dir(ws: Path, sid: str) -> Path:
    """The session's control plane (in the state directory)."""
    return control_dir(ws, sid)


def work_area(ws: Path, sid: str) -> Path:
    """The session's work area (in the workspace)."""
    return Path(work_root(str(ws))) / sid


def state_of(ws: Path) -> Path:
    """The workspace's folder in the state directory: its sessions' control planes."""
    return Path(control_root(str(ws))).parent


def copy_workspace(src: Path, dst: Path) -> Path:
    """Copy a workspace and its sessions' control planes: `dst` is a workspace of its own,
    its sessions where they were in `src`. (The control root may be there already: a
    disk mounted in its place.)"""
    shutil.copytree(src, dst, symlinks=True)
    if state_of(src).exists():
        shutil.copytree(state_of(src), state_of(dst), symlinks=True, dirs_exist_ok=True)
        (state_of(dst) / "workspace").write_text(os.path.realpath(dst) + "\n")
    return dst


def remove_workspace(ws: Path) -> None:
    """A workspace, and its sessions' control planes."""
    shutil.rmtree(state_of(ws), ignore_errors=True)
    shutil.rmtree(ws, ignore_errors=True)


def creation(writes: list[Write]) -> list[Write]:
    """The writes of a session's creation: up to its last one into the control plane built
    aside (the work area's first files are written before it is renamed in)."""
    last = max((i for i, w in enumerate(writes) if w.creating), default=-1)
    return writes[:last + 1]


def read_trace(trace: Path, ws: Path, sid: str) -> list[Write]:
    """The writes of a RALPH_TEST_WRITE_TRACE file, paths made relative (see Write)."""
    roots = ((session_dir(ws, sid), ""), (state_of(ws), "state:"), (Path(ws), ""))
    writes = []
    for line in trace.read_text().splitlines():
        n, _pid, kind, path = line.split(" ", 3)
        p, shown = Path(path), path
        for root, prefix in roots:
            if p.is_relative_to(root):
                shown = prefix + str(p.relative_to(root))
                break
        writes.append(Write(int(n), kind, shown))
    return writes


def records(sd: Path) -> list[dict]:
    return [json.loads(line) for line in (sd / "events.jsonl").read_text().splitlines()]


def transitions(sd: Path) -> list[dict]:
    return [e["payload"] for e in records(sd) if e["topic"] == "session.transition"]


def check_after_kill(ws: Path, sid: str, plane: Plane | None = None) -> None:
    """What must hold at any instant: metadata parses (plainly and strictly); every record
    of the bus but a torn last line (files) is whole. `plane`: the files by default."""
    (plane or FilePlane(ws, sid)).check_whole(finished=False)


def check_finished(ws: Path, sid: str, roots: tuple[str, ...] = (".docs", ".ralph-demo"),
                   plane: Plane | None = None) -> dict:
    """Invariants of a finished session; returns what must equal an uninterrupted run."""
    plane = plane or FilePlane(ws, sid)
    sd = session_dir(ws, sid)
    plane.check_whole(finished=True)
    recs = plane.records()
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    log = [e["payload"] for e in recs if e["topic"] == "session.transition"]
    assert [t["n"] for t in log] == list(range(1, len(log) + 1)), \
        f"one record per transition, numbered without gaps: {[t['n'] for t in log]}"
    state = State.PLANNING
    for t in log:
        assert t["from"] == state.value, f"{t} does not follow {state}"
        assert any(row.trigger == t["trigger"] and state in row.sources
                   and row.dest.value == t["to"] for row in TRANSITIONS), f"not in the table: {t}"
        state = State(t["to"])
    meta = plane.metadata()
    assert meta["orchestrator"]["state"] == state.value
    assert meta["orchestrator"]["transitions"] == len(log)
    assert (sd / "summary.md").exists()
    assert (holder := plane.running_pid()) is None, f"still held by an engine: {holder}"
    assert not plane.mailbox().unfinished, "a take or a rejection never finished"
    assert progress_view_markers(sd) == progress_markers(sd), "progress.md is not the markers' view"
    return outcome(ws, sid, roots, plane)


def outcome(ws: Path, sid: str, roots: tuple[str, ...] = (".docs", ".ralph-demo"),
            plane: Plane | None = None) -> dict:
    """What a finished session must share with an uninterrupted run of the same scenario:
    status, tasks, progress, iteration records, the files the work produced, the path."""
    plane = plane or FilePlane(ws, sid)
    sd = session_dir(ws, sid)
    meta = plane.metadata()
    files = {}
    for pattern in ("iterations/*/tasks/*", "iterations/*/reviews/*", "iterations/*/plan.md",
                    "iterations/*/knowledge/*"):
        for p in sd.glob(pattern):
            if p.is_file() and not p.name.startswith("."):
                files[str(p.relative_to(sd))] = _without_times(p)
    work = work_area(ws, sid)   # the knowledge staged and not promoted
    for p in work.glob("iterations/*/knowledge/*"):
        if p.is_file() and not p.name.startswith("."):
            files[str(p.relative_to(ws))] = _without_times(p)
    for root in roots:
        for p in (ws / root).rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                files[str(p.relative_to(ws))] = p.read_text()
    iterations = {}
    for it in (sd / "iterations").iterdir():
        im = yaml.safe_load((it / "metadata.yaml").read_text())
        iterations[it.name] = {k: im.get(k) for k in (
            "tasks_defined", "librarian_done", "knowledge_staged", "knowledge_decision",
            "rejections", "tasks_before")}
        iterations[it.name]["planned"] = im.get("planning_completed_at") is not None
        iterations[it.name]["completed"] = im.get("completed_at") is not None
    return {"status": meta["status"], "state": meta["orchestrator"]["state"],
            "iteration": meta["iteration"], "tasks": meta["tasks"],
            "progress": progress_markers(sd), "iterations": iterations, "files": files,
            "transitions": [(t["from"], t["trigger"], t["to"]) for t in
                            (e["payload"] for e in plane.records()
                             if e["topic"] == "session.transition")]}


_TIMED = {"promoted.yaml", "carried_from.yaml"}   # their `at` is the time of the run


def _without_times(p: Path) -> str:
    if p.name in _TIMED:
        doc = yaml.safe_load(p.read_text())
        doc.pop("at", None)
        return yaml.safe_dump(doc)
    return p.read_text()


def run_all(fn, items, workers: int = WORKERS) -> list[str]:
    """fn(item) -> a failure message or None, on a few threads; the failures."""
    with ThreadPoolExecutor(workers) as pool:
        return [f for f in pool.map(fn, items) if f]


def killed_then_resumed(ws: Path, sid: str, start, point: int, expected: dict) -> None:
    """`start(ws, **env)` SIGKILLed right after durable write `point`: the session is whole,
    and one `session resume` completes it with the uninterrupted run's outcome."""
    killed = start(ws, RALPH_TEST_CRASH_AT_WRITE=point)
    assert killed.returncode == KILLED, killed.stderr
    check_after_kill(ws, sid)
    resumed = subprocess.run(RALPH + ["session", "resume", sid], cwd=ws,
                             env=base_env(), capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert check_finished(ws, sid) == expected
