"""Bench 6: answer-to-unblock latency, against a 250 ms poll loop in the same run.

A real session runs in a subprocess (`ralph session start`, demo agent). Its scenario
plans T tasks; the executor emits `human.interact` on each of its first A attempts of a
task (a loop-level question: the engine holds before the next run) and `build.done` on
attempt A + 1. For each question the bench waits until the question file appears, then
a random 100-350 ms more (the engine is blocked by then, and the answers fall at random
phases of the poller's 250 ms cycle), writes the answer (session_store.questions.answer,
what `ralph session answer` does) and measures from just before that write until the
engine's next agent run starts: the executor's next `logs/<seq>-executor-<task>.stdout`
exists (the engine creates it just before it spawns the agent; the prompt file is written
just before that). The file system is polled every ~0.1 ms.

The baseline is the same engine, same scenario, whose hold sleeps on a fixed 250 ms poll
instead of waking on file-system events (_answer_poller.py).
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from _common import (Row, median, ms, now, percentile, ralph_script, ratio, run_logs, say,
                     session_dir, session_env, stop_process)
from overhead import EVIDENCE

HERE = os.path.dirname(os.path.abspath(__file__))
POLL_INTERVAL = 0.25
ASKS_PER_TASK = 10   # at most; the questions are spread evenly over the tasks


def scenario(tasks: int, asks: int) -> str:
    plan = ", ".join(f"{{id: t{i}, title: \"task {i}\", batch: 1}}" for i in range(1, tasks + 1))
    return f"""\
steps:
  - role: planner
    iteration: 1
    emit:
      - topic: plan.ready
        json: {{tasks: [{plan}]}}
  - role: planner
    emit:
      - {{topic: LOOP_COMPLETE, payload: "nothing left"}}
  - role: executor
    attempt: {asks + 1}
    emit:
      - {{topic: build.done, payload: "{EVIDENCE}"}}
  - role: executor
    emit:
      - {{topic: human.interact, payload: "May {{task}} go on? (question {{attempt}})"}}
  - role: reviewer
    emit:
      - {{topic: review.done, payload: "tests: pass, build: pass"}}
"""


CONFIG = """\
agent:
  backend: demo
  script: {script}
RObot:
  timeout_seconds: {timeout}
  on_timeout: continue
"""


def write_config(workspace: str, tasks: int, asks: int, timeout: float = 600,
                 steps: str | None = None, name: str = "ralph") -> str:
    """ralph.yml (`name`.yml) and its demo scenario: `steps`, or scenario(tasks, asks)."""
    script = os.path.join(workspace, f"{name}-scenario.yaml")
    with open(script, "w", encoding="utf-8") as f:
        f.write(steps or scenario(tasks, asks))
    config = os.path.join(workspace, f"{name}.yml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(CONFIG.format(script=script, timeout=timeout))
    return config


def start_session(workspace: str, config: str, session_id: str, poll: float | None,
                  log: str) -> subprocess.Popen:
    """`ralph session start`, or the same through the 250 ms poller when `poll` is set."""
    args = ["session", "start", f"bench: {session_id}", "-c", config, "--id", session_id]
    argv = [ralph_script()] + args if poll is None else \
        [sys.executable, os.path.join(HERE, "_answer_poller.py"), str(poll)] + args
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=workspace, env=session_env(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def next_question(control: str, seen: set, proc: subprocess.Popen, log: str,
                  timeout: float = 60.0) -> str:
    """The id of the next question file to appear in the session whose control plane is
    `control` (polled every 2 ms)."""
    from ralph.session_store import questions
    deadline = time.monotonic() + timeout
    while True:
        new = [qid for qid in questions.ids(control) if qid not in seen]
        if new:
            seen.update(new)
            return new[0]
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(log, encoding="utf-8", errors="replace") as f:
                output = f.read()[-2000:]
            raise RuntimeError(f"answer bench: no question within {timeout:g} s (exit "
                               f"{proc.poll()}); the session's output:\n{output}")
        time.sleep(0.002)


def _wait_file(path: str, proc: subprocess.Popen, timeout: float = 15.0) -> float:
    deadline = time.perf_counter() + timeout
    while not os.path.exists(path):
        if time.perf_counter() > deadline or proc.poll() is not None:
            raise RuntimeError(f"answer bench: {os.path.basename(path)} did not appear within "
                               f"{timeout:g} s of the answer (exit {proc.poll()})")
        time.sleep(0.0001)
    return time.perf_counter()


def measure(base: str, questions_count: int, poll: float | None, seed: int,
            budget: float) -> dict:
    from ralph.session_store import questions, signals
    deadline = time.monotonic() + budget
    label = "poller" if poll else "engine"
    workspace = tempfile.mkdtemp(prefix=f"ralph-bench-answer-{label}-", dir=base)
    rng = random.Random(seed)
    tasks = -(-questions_count // ASKS_PER_TASK)
    asks = -(-questions_count // tasks)
    config = write_config(workspace, tasks, asks)
    control = session_dir(workspace, label)
    log = os.path.join(workspace, "engine.log")
    latencies, writes, seen = [], [], set()
    try:
        proc = start_session(workspace, config, label, poll, log)
        try:
            for _ in range(tasks * asks):
                if time.monotonic() > deadline and len(latencies) >= 3:
                    break   # over the budget: the figures come from what was measured
                qid = next_question(control, seen, proc, log)
                question = questions.load_question(control, qid)
                if question.kind != "loop" or not question.context.task:
                    raise RuntimeError(f"answer bench: unexpected question {qid} "
                                       f"({question.kind}): {question.text}")
                logs = run_logs(workspace, label, question.context.iteration)
                seq = max(int(n[:4]) for n in os.listdir(logs) if n.endswith(".stdout"))
                expected = os.path.join(logs, f"{seq + 1:04d}-executor-"
                                              f"{question.context.task}.stdout")
                time.sleep(0.1 + rng.uniform(0, POLL_INTERVAL))
                t0 = time.perf_counter()
                questions.answer(control, qid, "yes, go on", now=now(), channel="bench")
                t_written = time.perf_counter()
                t1 = _wait_file(expected, proc)
                latencies.append(t1 - t0)
                writes.append(t_written - t0)
            expected_code = 0
            if len(latencies) < tasks * asks:
                signals.drop(control, "ABORT", "answer bench: over its budget", now=now())
                expected_code = 4
            code = proc.wait(timeout=120)
            if code != expected_code:
                raise RuntimeError(f"answer bench: the {label} session exited {code}, "
                                   f"expected {expected_code}")
        finally:
            stop_process(proc)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return {"lat": latencies, "writes": writes}


def run(base: str, count: int = 40, warmup: int = 2, budget: float = 90.0) -> list[Row]:
    """`budget`: seconds for each of the two sessions; past it, no more questions."""
    total = count + warmup
    say(f"answer: {total} loop questions answered while `ralph session start` holds")
    eng = measure(base, total, None, seed=2025, budget=budget)
    say(f"answer: the same {total} questions to an engine that polls every "
        f"{POLL_INTERVAL * 1000:.0f} ms")
    pol = measure(base, total, POLL_INTERVAL, seed=2025, budget=budget)
    e, p = eng["lat"][warmup:count + warmup], pol["lat"][warmup:count + warmup]
    short = "" if len(e) == count and len(p) == count else \
        f" (the budget of {budget:g} s cut it short: {len(e)} and {len(p)} of {count})"
    e50, e99, p50, p99 = percentile(e, 50), percentile(e, 99), percentile(p, 50), percentile(p, 99)
    aim = "met" if p50 >= 10 * e50 else "NOT met"
    return [
        Row("6 answer latency", "answer written -> next agent run starts, p50",
            ms(e50), ms(p50) + " (250 ms poll)", ratio(e50, p50, 3),
            note=f"{p50 / e50:.1f}x lower; aim: far below the poller (>= 10x): {aim}; "
                 f"{len(e)} questions{short}; mean {ms(sum(e) / len(e))} vs {ms(sum(p) / len(p))}"),
        Row("6 answer latency", "answer written -> next agent run starts, p99",
            ms(e99), ms(p99) + " (250 ms poll)", ratio(e99, p99, 3),
            note=f"max {ms(max(e))} vs {ms(max(p))}; writing the answer itself "
                 f"{ms(median(eng['writes']), 3)}; the latency includes the engine's "
                 f"bookkeeping (answer applied, metadata saved, prompt written)"),
    ]
