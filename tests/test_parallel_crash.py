"""Crash safety of a parallel batch (`event_loop.parallel: 4`, engine/parallel.py): a real
engine SIGKILLed at a durable write in the middle of the batch, while its lanes' agents
run in their worktrees, leaves a session that `ralph session resume` completes with the
same tasks, progress, files and path as an uninterrupted run; the session's branch holds
each task's commit once, and its merge; no worktree nor lane branch is left.

The kill points: every durable write of an uninterrupted traced run (the `baseline`
fixture, RALPH_TEST_WRITE_TRACE) from the transition into EXECUTING_BATCH (persisted,
then recorded) to the transition out of it: the tasks' [/] markers, the executors'
prompts and outbox resets, their events, the lanes' `git.commit` records, the [x] each
merge is followed by, the transition. The lanes write from several threads, so which
write is the Nth differs from run to run: a kill right after the Nth write is a valid
crash point all the same, and the trace of a killed run is not compared with the
baseline's. While the lanes run, each writes what the others do: there the first write of
each kind is a point, and each task's commit record; then every write of the merges' end
(`kept`). RALPH_TEST_PARALLEL_CRASH_POINTS=N keeps N points, evenly spread.
"""
from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest

import _crashkit as kit
from _crashkit import KILLED, Write, run_all
from support import EVIDENCE, REVIEW_OK, base_env, ralph, write_config, write_scenario

pytestmark = pytest.mark.slow

SID = "par"
TASKS = ("t1", "t2", "t3", "t4")
STEPS = [
    {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": {
        "tasks": [{"id": t, "title": t.upper()} for t in TASKS]}}]},
    {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
    # every lane's agent is still running when another lane's write is the kill point
    {"role": "executor", "sleep": 0.3, "write": {"{task}.txt": "made by {task}\n"},
     "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
    {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]},
]


def git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost",
                           *args], cwd=ws, check=True, capture_output=True, text=True).stdout


def git_workspace(ws: Path, steps: list[dict] = STEPS) -> None:
    """A repository on main whose one commit holds the scenario and a ralph.yml with
    `event_loop.parallel: 4`."""
    ws.mkdir(parents=True)
    scenario = write_scenario(ws, steps)
    write_config(ws, {"agent": {"backend": "demo", "script": scenario.name},
                      "event_loop": {"parallel": len(TASKS)}})
    git(ws, "init", "--quiet", "--initial-branch=main")
    git(ws, "add", "--all")
    git(ws, "commit", "--quiet", "--message", "the project")


def env(**extra) -> dict:
    # the demo's sleeps kept (scale 1): the lanes' runs overlap the kill
    return base_env(RALPH_DEMO_SLEEP_SCALE="1", **extra)


def start(ws: Path, **extra):
    return ralph(ws, "session", "start", "four tasks at once", "--id", SID, env=env(**extra))


def resume(ws: Path):
    return ralph(ws, "session", "resume", SID, env=env())


class Point(NamedTuple):
    write: Write
    what: str    # the baseline's write at that number: its kind, and an event's topic


class Baseline(NamedTuple):
    points: list[Point]   # the batch's writes, in the baseline's order
    outcome: dict


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    with kit.scratch_state(tmp_path_factory.mktemp("parallel-crash"), "parallel") as path:
        yield path


def check_git(ws: Path) -> Counter:
    """The session's branch: one commit per task (its Ralph-Task trailer), each merged
    once by a merge commit whose second parent it is (or, run alone, committed on the
    branch itself); the working tree on that branch and clean; the main tree the only
    worktree; no lane branch, no lane directory."""
    branch = f"ralph/{SID}"
    assert git(ws, "symbolic-ref", "--short", "HEAD").strip() == branch
    task_commits, merges = {}, Counter()
    for commit in git(ws, "rev-list", f"main..{branch}").split():
        parents, subject, body = git(ws, "show", "--no-patch", "--format=%P%x00%s%x00%b",
                                     commit).split("\0")
        if len(parents.split()) > 1:
            task = subject.split("merge task ", 1)[1].split(":", 1)[0]
            merges[task] += 1
            merged = parents.split()[1]
            assert f"Ralph-Task: {task}" in git(ws, "show", "--no-patch", "--format=%b",
                                                merged).splitlines(), (subject, merged)
        else:
            tasks = [line.split(": ", 1)[1] for line in body.splitlines()
                     if line.startswith("Ralph-Task: ")]
            assert len(tasks) == 1, (subject, body)
            assert tasks[0] not in task_commits, \
                f"task {tasks[0]} committed twice: {task_commits[tasks[0]]}, {commit}"
            task_commits[tasks[0]] = commit
    assert sorted(task_commits) == list(TASKS), task_commits
    # merged once each; but a task left alone to run (a resume finds one task of the batch
    # unfinished) runs in the main tree, its commit straight on the session's branch
    assert set(merges) <= set(TASKS) and max(merges.values(), default=1) == 1, merges
    mainline = git(ws, "rev-list", "--first-parent", f"main..{branch}").split()
    for task in set(TASKS) - set(merges):
        assert task_commits[task] in mainline, f"task {task}: neither merged nor on {branch}"
    status = git(ws, "status", "--porcelain", "--untracked-files=all", "--", ".",
                 ":(exclude).ralph-sessions")
    assert status == "", status
    trees = [line.split(" ", 1)[1] for line in git(ws, "worktree", "list", "--porcelain")
             .splitlines() if line.startswith("worktree ")]
    assert trees == [os.path.realpath(ws)], trees
    assert git(ws, "branch", "--list", "ralph-lane/*") == ""
    lanes = Path(kit.state_of(ws)) / "worktrees" / SID
    assert not lanes.exists() or not any(lanes.iterdir()), list(lanes.iterdir())
    return merges


def check_done(ws: Path) -> tuple[dict, Counter]:
    """What must equal the uninterrupted run's, and the tasks merged."""
    return kit.check_finished(ws, SID), check_git(ws)


@pytest.fixture(scope="module")
def baseline(root) -> Baseline:
    ws = root / "baseline" / "ws"
    git_workspace(ws)
    trace = ws.parent / "trace"
    r = start(ws, RALPH_TEST_WRITE_TRACE=trace)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tasks on 4 lanes" in r.stdout, r.stdout
    writes = kit.read_trace(trace, ws, SID)
    assert [w.n for w in writes] == list(range(1, len(writes) + 1)), "one engine process"
    result, merged = check_done(ws)
    assert merged == Counter(TASKS), merged   # all four ran on lanes
    assert result["status"] == "completed"
    assert result["progress"] == {"1": {t: "x" for t in TASKS}}
    assert result["tasks"] == {"total": 4, "completed": 4, "failed": 0, "pending": 0}
    assert {f: text for f, text in result["files"].items() if f.startswith(".ralph-demo/")} \
        == {f".ralph-demo/{t}.txt": f"made by {t}\n" for t in TASKS}
    # each write to the bus appends one record: the Nth such write is the record seq N
    recs = kit.records(kit.session_dir(ws, SID))
    events = [w for w in writes if w.kind == "event"]
    assert len(events) == len(recs)
    topic = {w.n: r["topic"] for w, r in zip(events, recs)}
    seq = {w.n: r["seq"] for w, r in zip(events, recs)}
    into, out = [r["seq"] for r in recs if r["topic"] == "session.transition"
                 and "EXECUTING_BATCH" in (r["payload"]["to"], r["payload"]["from"])]
    first = next(i for i, w in enumerate(writes) if seq.get(w.n) == into)
    last = next(i for i, w in enumerate(writes) if seq.get(w.n) == out)
    assert writes[first - 1].kind == "metadata"   # the transition persisted, then recorded
    batch = writes[first - 1:last + 1]
    points = [Point(w, f"{w.kind} {topic[w.n]}" if w.n in topic else w.kind) for w in batch]
    kit.remove_workspace(ws)
    return Baseline(points, result)


def kept(points: list[Point]) -> list[Point]:
    """While the lanes run, their writes come in any order and each lane writes what the
    others do: the first write of each kind is a point, and each task's commit record. The
    merges' end, in the engine's order: every write (each task's [x], the transition)."""
    tail = len(points) - 2 * len(TASKS) - 2
    seen: set[str] = set()
    return [p for i, p in enumerate(points)
            if i >= tail or p.what == "event git.commit" or not (p.what in seen
                                                                or seen.add(p.what))]


def choose(points: list[Point]) -> list[Point]:
    wanted = os.environ.get("RALPH_TEST_PARALLEL_CRASH_POINTS", "")
    if not wanted.isdigit() or int(wanted) >= len(points):
        return points
    n = int(wanted)
    return [points[i * len(points) // n] for i in range(n)]


def test_kill_at_each_durable_write_of_a_parallel_batch_then_resume_completes(root, baseline):
    points = choose(kept(baseline.points))
    whats = Counter(p.what for p in points)
    if points == kept(baseline.points):   # every kind the batch writes is a point
        assert {"metadata", "event session.transition", "progress", "event git.commit",
                "event build.done", "prompt", "outbox-reset", "report"} <= set(whats), whats
        assert whats["event git.commit"] == len(TASKS)
        # the [x] of each task after its merge (the marker, then its view), then the
        # transition
        assert [p.what for p in points[-2 * len(TASKS) - 2:]] == \
            ["iteration-metadata", "progress"] * len(TASKS) \
            + ["metadata", "event session.transition"], points[-12:]

    def kill_at(p: Point) -> str | None:
        ws = root / "points" / f"w{p.write.n:03d}" / "ws"
        try:
            git_workspace(ws)
            r = start(ws, RALPH_TEST_CRASH_AT_WRITE=p.write.n)
            assert r.returncode == KILLED, f"not killed: exit {r.returncode}\n{r.stderr}"
            kit.check_after_kill(ws, SID)
            r = resume(ws)
            assert r.returncode == 0, f"resume exited {r.returncode}\n{r.stdout}{r.stderr}"
            result, _ = check_done(ws)
            assert result == baseline.outcome, {
                k: (result[k], baseline.outcome[k]) for k in result
                if result[k] != baseline.outcome.get(k)}
        except Exception as e:  # noqa: BLE001 - reported per point below
            return f"killed after write {p.write.n} (in the baseline: {p.what} " \
                   f"{p.write.path}): {type(e).__name__}: {e}"
        kit.remove_workspace(ws)
        return None

    failures = run_all(kill_at, points)
    print(f"\nparallel crash matrix: {len(points)} of {len(baseline.points)} writes; "
          + ", ".join(f"{k} {v}" for k, v in sorted(whats.items())))
    assert not failures, f"{len(failures)} of {len(points)} points failed:\n" + \
        "\n".join(failures)


def test_a_task_merged_before_its_x_is_done_on_resume_not_merged_twice(root, baseline):
    """No durable write lies between a lane's merge and the [x] after it, so the matrix
    cannot stop there; a kill at another moment can. That state is made here: killed
    right after t1's [x] (the first write after the lanes), before progress.md shows it,
    t1 put back to [/] in the iteration's metadata (the truth of markers). The merge is
    the task's commit point: the resume marks t1 done and does not run it again; its agent
    would change the file again (the attempt is in it) and its work would be committed and
    merged twice."""
    steps = [dict(step) for step in STEPS]
    steps[2]["write"] = {"{task}.txt": "made by {task}, attempt {attempt}\n"}
    x_t1 = baseline.points[-2 * len(TASKS) - 2]
    assert x_t1.what == "iteration-metadata"
    ws = root / "merged-not-x" / "ws"
    git_workspace(ws, steps)
    r = start(ws, RALPH_TEST_CRASH_AT_WRITE=x_t1.write.n)
    assert r.returncode == KILLED, r.stdout + r.stderr
    path = kit.session_dir(ws, SID) / "iterations" / "1" / "metadata.yaml"
    meta = json.loads(path.read_text())
    assert [meta["progress"][t]["marker"] for t in TASKS] == ["x", "/", "/", "/"], meta
    meta["progress"]["t1"]["marker"] = "/"
    path.write_text(json.dumps(meta))
    r = resume(ws)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "task t1: merged into the session's branch before the engine stopped" in r.stdout
    result, merged = check_done(ws)   # one commit and one merge per task
    assert merged == Counter(TASKS), merged
    assert result["progress"] == {"1": {t: "x" for t in TASKS}}
    assert result["files"][".ralph-demo/t1.txt"] == "made by t1, attempt 1\n"
    kit.remove_workspace(ws)
