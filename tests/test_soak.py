"""Issue 8: soak. One session of 100 iterations on the demo agent (one task an iteration,
a human.interact question every 10th), with signals dropped at random by a second process
and the questions answered by a third: it finishes with nothing lost, and the engine's
memory stays flat (VmRSS/VmHWM of its process, read from /proc when metadata.iteration
reaches 50 and 100). 100, not the 500 it once ran: each iteration is three confined agent
runs, and 500 made this one test longer than the rest of CI (150 was still a tenth of CI's
time, for a flatness 50 iterations apart show as well); RALPH_TEST_SOAK_ITERATIONS=500
runs the long one.

RALPH_TEST_SOAK_ITERATIONS=N runs N iterations instead (for a quick look; the test then
says so). The workspace goes to /dev/shm when it is there (_crashkit.scratch).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from _crashkit import scratch, state_in
from support import (EVIDENCE, FAST, RALPH, base_env, metadata, progress_markers, session_dir,
                     work_dir, write_config, write_scenario)
from ralph.session_store import questions

SID = "soak"
ITERATIONS = int(os.environ.get("RALPH_TEST_SOAK_ITERATIONS", "100"))
QUESTION_EVERY = 10
SEED = 0x50AC
ACTORS = Path(__file__).resolve().parent / "_soak_actors.py"
SAMPLES = (50 if ITERATIONS >= 100 else max(1, ITERATIONS // 10), ITERATIONS)


def scenario() -> list[dict]:
    asks = [{"role": "executor", "iteration": k, "attempt": 1, "emit": [
        {"topic": "human.interact", "json": {"text": f"question of iteration {k}"}}]}
        for k in range(QUESTION_EVERY, ITERATIONS + 1, QUESTION_EVERY)]
    return [
        {"role": "planner", "iteration": ITERATIONS + 1,
         "emit": [{"topic": "LOOP_COMPLETE", "payload": "all iterations done"}]},
        {"role": "planner", "emit": [{"topic": "plan.ready", "json": {"tasks": [
            {"id": "t{iteration}", "title": "the task of iteration {iteration}"}]}}]},
        *asks,
        {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "reviewer", "emit": [{"topic": "review.done",
                                       "payload": "tests: pass, build: pass"}]},
    ]


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in kB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def _iteration(sd: Path) -> int:
    try:
        return yaml.load((sd / "metadata.yaml").read_bytes(), Loader=yaml.CSafeLoader)["iteration"]
    except (FileNotFoundError, yaml.YAMLError, TypeError):
        return 0


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_soak_100_iterations_with_signals_and_answers_from_other_processes(tmp_path):
    root = scratch(tmp_path, "soak")
    with state_in(root):
        soak(root)
    shutil.rmtree(root, ignore_errors=True)


def soak(root: Path) -> None:
    ws = root / "ws"
    ws.mkdir()
    sd = session_dir(ws, SID)
    stop = ws / "STOP"
    script = write_scenario(ws, scenario())
    write_config(ws, {"agent": {"backend": "demo", "script": str(script)},
                      "event_loop": {"max_iterations": ITERATIONS + 10,
                                     "max_runtime_seconds": 3600},
                      "RObot": {"timeout_seconds": 300},
                      "fallback": {"enabled": False}})
    env = base_env(**FAST)
    out = open(root / "engine.out", "w")
    began = time.monotonic()
    engine = subprocess.Popen(RALPH + ["session", "start", "soak the engine", "--id", SID,
                                       "-c", str(ws / "ralph.yml")],
                              cwd=ws, env=env, stdout=out, stderr=subprocess.STDOUT)
    dropped_log, answered_log = root / "dropped.log", root / "answered.log"
    actors = [
        subprocess.Popen([sys.executable, str(ACTORS), "drop", str(sd), str(stop), str(SEED),
                          str(dropped_log), str(ITERATIONS - 5)], cwd=ws, env=env),
        subprocess.Popen([sys.executable, str(ACTORS), "answer", str(sd), str(stop),
                          str(answered_log)], cwd=ws, env=env),
    ]
    rss: dict[int, dict[str, int]] = {}
    at: dict[int, float] = {}
    marks = sorted(set(SAMPLES) | set(range(50, ITERATIONS + 1, 50)))
    try:
        while engine.poll() is None:
            n = _iteration(sd)
            for sample in marks:
                if n >= sample and sample not in rss:
                    rss[sample] = memory(engine.pid)
                    at[sample] = time.monotonic() - began
            if time.monotonic() - began > 1800:
                pytest.fail(f"the soak ran for 30 minutes; it stood at iteration {n}")
            time.sleep(0.02)   # poll: the engine's memory sampled at each iteration
        elapsed = time.monotonic() - began
    finally:
        stop.touch()
        for p in [engine, *actors]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        out.close()
    log = (root / "engine.out").read_text()
    assert engine.returncode == 0, log[-5000:]
    assert all(p.returncode == 0 for p in actors), [p.returncode for p in actors]

    # the work: every iteration's task done, counted once
    meta = metadata(sd)
    assert meta["status"] == "completed" and meta["iteration"] == ITERATIONS + 1
    assert meta["tasks"] == {"total": ITERATIONS, "completed": ITERATIONS, "failed": 0,
                             "pending": 0}
    marks = progress_markers(sd)
    assert marks == {str(k): {f"t{k}": "x"} for k in range(1, ITERATIONS + 1)}, \
        {k: v for k, v in marks.items() if v != {f"t{k}": "x"}}

    # every signal dropped was taken once, handled, and its guidance delivered
    dropped = dropped_log.read_text().split() if dropped_log.exists() else []
    processed = sd / "signals" / "processed"
    assert sorted(p.name for p in processed.iterdir()) == sorted(dropped)
    assert not list((sd / "signals" / "inputs").iterdir())
    assert not list((sd / "signals" / "rejected").iterdir())
    pad = (work_dir(sd) / "scratchpad.md").read_text()
    for name in dropped:
        doc = yaml.safe_load((processed / name).read_text())
        assert doc["handling_metadata"]["handled_by"] == "Ralph-Orchestrator", doc
        assert pad.count(f"({name})") == 1, name
    assert json.loads((sd / "guidance.yaml").read_text()) == []

    # every question answered, and its answer applied once
    asked = questions.questions(str(sd))
    answered = answered_log.read_text().split("\n") if answered_log.exists() else []
    assert len(asked) == ITERATIONS // QUESTION_EVERY
    assert sorted(q.id for q in asked) == sorted(a for a in answered if a)
    bus = [json.loads(line) for line in (sd / "events.jsonl").read_text().splitlines()]
    assert [r["seq"] for r in bus] == list(range(1, len(bus) + 1))
    responses = [r["payload"]["id"] for r in bus
                 if r["topic"] == "human.response" and r["source"] == "engine"]
    assert sorted(responses) == sorted(q.id for q in asked), "an answer applied twice, or never"
    for q in asked:
        assert q.status is questions.QuestionStatus.ANSWERED, q
        assert questions.read_answer(str(sd), q.id).text == f"the answer to {q.id}"
        logs = work_dir(sd) / "iterations" / str(q.context.iteration) / "logs"
        second = sorted(logs.glob("*-executor-*.prompt.md"))[-1].read_text()
        assert f"the answer to {q.id}" in second

    assert set(SAMPLES) <= set(rss), f"memory sampled at iterations {sorted(rss)} only"
    first, last = rss[SAMPLES[0]], rss[SAMPLES[1]]
    print(f"\nsoak: {ITERATIONS} iterations in {elapsed:.0f}s, {len(dropped)} signals, "
          f"{len(asked)} questions; engine memory at iteration {SAMPLES[0]}: VmRSS "
          f"{first['VmRSS'] / 1024:.1f} MB, VmHWM {first['VmHWM'] / 1024:.1f} MB; at "
          f"{SAMPLES[1]}: VmRSS {last['VmRSS'] / 1024:.1f} MB, VmHWM "
          f"{last['VmHWM'] / 1024:.1f} MB")
    previous = 0
    for n in sorted(rss):   # the pace and the memory along the way, to see any growth
        span = at[n] - at.get(previous, 0.0)
        print(f"  iteration {n:4d}: {at[n]:6.1f}s ({span / max(1, n - previous) * 1000:.0f} ms "
              f"an iteration since {previous}), VmRSS {rss[n]['VmRSS'] / 1024:.1f} MB")
        previous = n
    if ITERATIONS != 100:
        print(f"soak: RALPH_TEST_SOAK_ITERATIONS={ITERATIONS}: not CI's 100")
    assert last["VmRSS"] < 1.5 * first["VmRSS"] or last["VmRSS"] - first["VmRSS"] < 30 * 1024
    assert last["VmHWM"] < 1.5 * first["VmHWM"] or last["VmHWM"] - first["VmHWM"] < 30 * 1024
