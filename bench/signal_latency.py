"""Bench 3: signal-to-handled latency while the engine waits, against a 250 ms poller.

A real session runs in a subprocess (`ralph session start` with the demo agent and
`knowledge.approval: required`), so after iteration 1 the engine waits, event-driven, in
KNOWLEDGE_APPROVAL. The bench drops INFO signals one at a time (session_store.signals.drop)
and measures from just before the drop until `signals/processed/<name>` exists (the engine
writes it whole, with handling_metadata, so existence means handled), polling the file
system every ~0.1 ms. A random pause of 0-250 ms before each drop puts the drops at random
phases of the poller's cycle.

The baseline is the same handling code (Engine.checkpoint over a second session) run by
a subprocess that polls every 250 ms instead of waiting for file-system events.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from _common import (Row, median, ms, now, percentile, ralph_script, ratio, say, session_dir,
                     session_env, stop_process, wait_for_text)

HERE = os.path.dirname(os.path.abspath(__file__))
POLL_INTERVAL = 0.25
CONFIG = """\
knowledge:
  approval: required
  timeout_seconds: 600
"""


class ConsumerDied(RuntimeError):
    pass


def _wait_handled(path: str, proc: subprocess.Popen, timeout: float = 15.0) -> float:
    deadline = time.perf_counter() + timeout
    while not os.path.exists(path):
        now_ = time.perf_counter()
        if now_ > deadline or proc.poll() is not None:
            raise ConsumerDied(f"{os.path.basename(path)} not handled within {timeout:g} s "
                               f"(consumer exit code {proc.poll()})")
        time.sleep(0.0001)
    return time.perf_counter()


def measure(control: str, proc: subprocess.Popen, count: int, warmup: int,
            seed: int = 2024) -> tuple[list[float], list[float]]:
    """(latencies, drop costs) in seconds, for `count` INFO signals after `warmup`."""
    from ralph.session_store import parse_yaml, signals
    rng = random.Random(seed)
    processed = os.path.join(control, "signals", "processed")
    latencies, drops, names = [], [], []
    for i in range(warmup + count):
        time.sleep(rng.uniform(0, POLL_INTERVAL))
        t0 = time.perf_counter()
        name = signals.drop(control, "INFO", f"latency probe {i}", now=now())
        t_dropped = time.perf_counter()
        t1 = _wait_handled(os.path.join(processed, name), proc)
        names.append(name)
        if i >= warmup:
            latencies.append(t1 - t0)
            drops.append(t_dropped - t0)
    for name in names:  # every one handled once, with its handling_metadata
        with open(os.path.join(processed, name), "rb") as f:
            doc = parse_yaml(f.read(), name)
        if not doc.get("handling_metadata", {}).get("action_taken"):
            raise RuntimeError(f"latency bench: {name} has no handling_metadata")
    return latencies, drops


def bench_engine(base: str, count: int, warmup: int) -> dict:
    from ralph.session_store import _signals, signals
    workspace = tempfile.mkdtemp(prefix="ralph-bench-latency-", dir=base)
    log = os.path.join(workspace, "engine.log")
    config = os.path.join(workspace, "ralph.yml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(CONFIG)
    env = session_env(RALPH_DEMO_SLEEP_SCALE="0")
    control = session_dir(workspace, "latency")
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen([ralph_script(), "session", "start", "bench: signal latency",
                                     "-c", config, "--id", "latency"], cwd=workspace, env=env,
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_for_text(log, "waiting for `ralph signal approve`", proc, timeout=120,
                          what="latency bench")
            latencies, drops = measure(control, proc, count, warmup)
            start = time.perf_counter()
            signals.drop(control, "ABORT", "latency bench done", now=now())
            code = proc.wait(timeout=30)
            abort_exit = time.perf_counter() - start
            if code != 4:
                raise RuntimeError(f"latency bench: the session exited {code} after ABORT, "
                                   f"expected 4")
            guidance = os.path.getsize(os.path.join(control, _signals.GUIDANCE_FILE))
        finally:
            stop_process(proc)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return {"lat": latencies, "drops": drops, "abort_exit": abort_exit, "guidance": guidance}


def bench_poller(base: str, count: int, warmup: int) -> dict:
    from ralph import session_store
    workspace = tempfile.mkdtemp(prefix="ralph-bench-poller-", dir=base)
    try:
        session = session_store.create(workspace, "bench: 250 ms poller baseline", now=now())
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_poller.py"), workspace,
                                 session.id, str(POLL_INTERVAL)], stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True)
        try:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"latency bench: the poller did not start (exit {proc.wait()})")
            latencies, drops = measure(session.dir, proc, count, warmup)
        finally:
            stop_process(proc)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return {"lat": latencies, "drops": drops}


def run(base: str, count: int = 100, warmup: int = 3) -> list[Row]:
    say(f"latency: {count} INFO signals to a session waiting in KNOWLEDGE_APPROVAL")
    eng = bench_engine(base, count, warmup)
    say(f"latency: the same {count} signals to a {POLL_INTERVAL * 1000:.0f} ms poller")
    pol = bench_poller(base, count, warmup)
    e, p = eng["lat"], pol["lat"]
    e50, e99, p50, p99 = percentile(e, 50), percentile(e, 99), percentile(p, 50), percentile(p, 99)
    tenth = max(1, count // 10)
    aim = "met" if p50 >= 10 * e50 else "NOT met"
    return [
        Row("3 signal latency", "drop -> handled while waiting, p50",
            ms(e50), ms(p50) + " (250 ms poller)", ratio(e50, p50, 3),
            note=f"{p50 / e50:.1f}x lower; aim >= 10x lower: {aim}; {count} signals; "
                 f"mean {ms(sum(e) / len(e))} vs {ms(sum(p) / len(p))}"),
        Row("3 signal latency", "drop -> handled while waiting, p99",
            ms(e99), ms(p99) + " (250 ms poller)", ratio(e99, p99, 3),
            note=f"engine: first {tenth} median {ms(median(e[:tenth]))}, last {tenth} median "
                 f"{ms(median(e[-tenth:]))} (guidance.yaml {eng['guidance']} B at the end); "
                 f"drop itself {ms(median(eng['drops']), 3)}; ABORT -> exit "
                 f"{ms(eng['abort_exit'], 0)}"),
    ]
