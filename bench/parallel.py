"""Bench 14: a parallel batch (`event_loop.parallel: 4`) against the same batch run one
task after another (`parallel: 1`), in the same run.

Each session is a real `ralph session start` subprocess in a fresh git repository of its
own (a commit holding ralph.yml and the demo scenario), on the demo agent: the planner
plans four tasks in one batch, each executor sleeps `sleep` seconds (3) then writes
`.ralph-demo/<task>.txt` and emits build.done with passing evidence, the reviewer passes
each task, the planner then says LOOP_COMPLETE. The figure is the wall-clock of the whole
session, process start to exit: the engine, the agents' processes, with parallel the
worktrees, lane branches and merges, and in both modes a commit per task. The two modes
alternate (which goes first alternates too); each figure is the median. Also, from the
bus, the batch alone: the transition into EXECUTING_BATCH to the one out of it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

from _common import (Row, bus_path, median, ralph_script, ratio, say, session_dir,
                     session_env)

TASKS = ("t1", "t2", "t3", "t4")
EVIDENCE = ("tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 91, "
            "complexity: 3, duplication: pass")
TIMEOUT = 300.0   # one session; more is a hang (an ERROR row)
AIM = 0.35


def scenario(sleep: float) -> str:
    plan = {"tasks": [{"id": t, "title": f"task {t}"} for t in TASKS]}
    steps = [
        {"role": "planner", "iteration": 1, "emit": [{"topic": "plan.ready", "json": plan}]},
        {"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor", "sleep": sleep, "write": {"{task}.txt": "made by {task}\n"},
         "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "reviewer", "emit": [{"topic": "review.done",
                                       "payload": "tests: pass, build: pass"}]},
    ]
    return json.dumps({"steps": steps}, indent=1) + "\n"   # JSON is YAML


def git(cwd: str, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost",
                           *args], cwd=cwd, check=True, capture_output=True, text=True,
                          timeout=60).stdout


def repository(base: str, width: int, sleep: float) -> str:
    """A fresh git repository on branch main, its one commit the config and scenario."""
    ws = tempfile.mkdtemp(prefix=f"ralph-bench-parallel{width}-", dir=base)
    with open(os.path.join(ws, "scenario.yaml"), "w", encoding="utf-8") as f:
        f.write(scenario(sleep))
    with open(os.path.join(ws, "ralph.yml"), "w", encoding="utf-8") as f:
        f.write(f"agent: {{script: scenario.yaml}}\nevent_loop: {{parallel: {width}}}\n")
    git(ws, "init", "--quiet", "--initial-branch=main")
    git(ws, "add", "--all")
    git(ws, "commit", "--quiet", "--message", "the project")
    return ws


def session(base: str, width: int, sleep: float, sid: str) -> tuple[float, float]:
    """(whole session, the batch alone) in seconds, for one fresh repository; checks that
    the session did what it should (every task done and committed, no lane left)."""
    ws = repository(base, width, sleep)
    try:
        env = session_env(RALPH_DEMO_SLEEP_SCALE="1")   # the agents' sleeps are the point
        start = time.perf_counter()
        proc = subprocess.run([ralph_script(), "session", "start", f"bench: {sid}", "--id",
                               sid], cwd=ws, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=TIMEOUT)
        whole = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"parallel bench: parallel {width}: `ralph session start` "
                               f"exited {proc.returncode}: {proc.stdout[-1500:]}")
        check(ws, width, sid, proc.stdout)
        return whole, batch_seconds(session_dir(ws, sid))
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def check(ws: str, width: int, sid: str, output: str) -> None:
    made = sorted(os.listdir(os.path.join(ws, ".ralph-demo")))
    log = git(ws, "log", "--format=%P%x00%B%x01", f"main..ralph/{sid}").split("\x01")
    tasks = sorted(line.split(": ", 1)[1] for record in log for line in record.splitlines()
                   if line.startswith("Ralph-Task: "))
    merges = sum(len(record.split("\0")[0].split()) > 1 for record in log if record.strip())
    trees = git(ws, "worktree", "list", "--porcelain").count("worktree ")
    lanes = git(ws, "branch", "--list", "ralph-lane/*").split()
    want_merges = len(TASKS) if width > 1 else 0
    if made != [f"{t}.txt" for t in TASKS] or tasks != list(TASKS) \
            or merges != want_merges or trees != 1 or lanes \
            or f"{len(TASKS)}/{len(TASKS)} tasks done" not in output:
        raise RuntimeError(f"parallel bench: parallel {width}: unexpected end: files {made}, "
                           f"task commits {tasks}, {merges} merges, {trees} worktrees, lane "
                           f"branches {lanes}: {output[-1500:]}")


def batch_seconds(sd: str) -> float:
    """From the transition into EXECUTING_BATCH to the one out of it (the bus's times)."""
    from datetime import datetime
    into = out = None
    with open(bus_path(sd), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record["topic"] != "session.transition":
                continue
            payload = record["payload"]
            if payload["to"] == "EXECUTING_BATCH" and into is None:
                into = datetime.fromisoformat(record["ts"])
            elif payload["from"] == "EXECUTING_BATCH" and out is None:
                out = datetime.fromisoformat(record["ts"])
    if into is None or out is None:
        raise RuntimeError(f"parallel bench: no EXECUTING_BATCH on the bus of {sd}")
    return (out - into).total_seconds()


def run(base: str, rounds: int = 3, sleep: float = 3.0, width: int = 4) -> list[Row]:
    say(f"parallel: {len(TASKS)} tasks of {sleep:g} s each, parallel {width} vs 1, "
        f"{rounds} round(s), alternated")
    wall: dict[int, list[float]] = {width: [], 1: []}
    batch: dict[int, list[float]] = {width: [], 1: []}
    for i in range(rounds):
        for w in ((width, 1) if i % 2 == 0 else (1, width)):
            whole, part = session(base, w, sleep, f"p{w}-{i}")
            wall[w].append(whole)
            batch[w].append(part)
            say(f"parallel: round {i + 1}, parallel {w}: {whole:.2f} s (batch {part:.2f} s)")
    p, s = median(wall[width]), median(wall[1])
    bp, bs = median(batch[width]), median(batch[1])
    ideal = sleep * len(TASKS)
    aim = "meets the aim" if p / s <= AIM else "misses the aim"
    return [
        Row("14 parallel", f"a batch of {len(TASKS)} tasks of {sleep:g} s each, whole "
                           f"session, `parallel: {width}` (aim <= {AIM}x), median",
            f"{p:.2f} s", f"{s:.2f} s, `parallel: 1`", ratio(p, s),
            note=f"{aim}; real `ralph session start` in a fresh git repository each (demo "
                 f"agent, a commit per task; with {width} lanes a worktree and branch per "
                 f"task, merged in plan order); the agents sleep {sleep:g} s, so the floor is "
                 f"{sleep:g} s vs {ideal:g} s ({ratio(sleep, ideal)}); the rest, "
                 f"{p - sleep:.2f} s vs {s - ideal:.2f} s, is the engine, the agents' starts, "
                 f"git, the reviews and plans; {rounds} round(s), each mode min "
                 f"{min(wall[width]):.2f} vs {min(wall[1]):.2f} s"),
        Row("14 parallel", "the batch alone (into EXECUTING_BATCH to out of it, from the "
                           "bus), median",
            f"{bp:.2f} s", f"{bs:.2f} s", ratio(bp, bs),
            note=f"worktrees made, {len(TASKS)} executor runs, commits, merges, worktrees "
                 f"removed: {bp - sleep:.2f} s beyond one agent's {sleep:g} s, vs "
                 f"{bs - ideal:.2f} s beyond {ideal:g} s one after another"),
    ]
