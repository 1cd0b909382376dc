"""Bench 5: reading the bus: does an iteration cost more when events.jsonl is big?

Two sessions run the same K iterations with overhead.py's no-op in-process agent: one
fresh, one whose events.jsonl was filled beforehand with 100,000 valid records (a mix of
the topics agents and the engine write, ~250 B each, written straight to the file). The
engine reads the bus from its offset after every run, so an iteration must cost the same
on both: the ratio must stay ~1.0. Runs alternate fresh/filled twice, so drift in the
machine's load hits both alike; an iteration's cost is the time between two planner
invocations, as in bench 1.

The resume-time read is reported apart: Engine.reconcile reads the bus past what the index
of its once-keys covers (events.once-index) when an engine starts; the filler here is
written straight to the file, past that index, so the first start reads all of it, and
grows with the file (a bus the engine wrote is indexed as it grows: see bench 8).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import time

from _common import Row, bus_path, ms, now, ratio, say
from overhead import EVIDENCE, NoopAgent

FILLER_TOPICS = (
    ("executor", "EXECUTING_BATCH", "build.done", EVIDENCE),
    ("reviewer", "REVIEWING_BATCH", "review.done", "tests: pass, build: pass; reads well"),
    ("executor", "EXECUTING_BATCH", "human.progress", "halfway through the task, tests next"),
    ("engine", "REVIEWING_BATCH", "gate.note",
     {"topic": "review.done", "original_seq": 0, "note": "evidence accepted"}),
)


def fill_bus(session_dir: str, count: int) -> int:
    """Append `count` valid records after the session's own; returns the file's size."""
    from ralph.session_store import read_events
    path = bus_path(session_dir)
    records, _ = read_events(session_dir)
    seq = max((r["seq"] for r in records), default=0)
    lines = []
    for i in range(count):
        seq += 1
        source, state, topic, payload = FILLER_TOPICS[i % len(FILLER_TOPICS)]
        if isinstance(payload, dict):
            payload = dict(payload, original_seq=seq - 1)
        lines.append(json.dumps({"seq": seq, "ts": "2026-01-01T00:00:00.000+00:00",
                                 "topic": topic, "payload": payload, "source": source,
                                 "iteration": 1 + i // 40, "state": state},
                                separators=(",", ":")) + "\n")
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(lines))
        f.flush()
        os.fsync(f.fileno())
    return os.path.getsize(path)


def run_once(base: str, iterations: int, filler: int) -> dict:
    from ralph import session_store
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.session_store import Limits

    workspace = tempfile.mkdtemp(prefix="ralph-bench-bus-", dir=base)
    try:
        session = session_store.create(workspace, "bench: bus reading", now=now(),
                                       limits=Limits(max_iterations=iterations + 1))
        size = fill_bus(session.dir, filler) if filler else \
            os.path.getsize(bus_path(session.dir))
        agent = NoopAgent(iterations, lambda: session.metadata_path)
        engine = Engine(session, Config(), agent_for=lambda role: agent, out=io.StringIO())
        reconcile = engine.reconcile
        timed = {}

        def timed_reconcile():
            start, cpu = time.perf_counter(), time.process_time()
            reconcile()
            timed["wall"], timed["cpu"] = time.perf_counter() - start, time.process_time() - cpu

        engine.reconcile = timed_reconcile
        code = engine.run()
        m = session.metadata
        if code != 0 or m.status.value != "completed" or m.iteration != iterations + 1:
            raise RuntimeError(f"bus bench: unexpected end: exit {code}, status "
                               f"{m.status.value}, iteration {m.iteration}")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    starts, cpu = agent.starts, agent.cpu
    return {"wall": (starts[-1] - starts[0]) / (len(starts) - 1),
            "cpu": (cpu[-1] - cpu[0]) / (len(cpu) - 1),
            "reconcile": timed["wall"], "reconcile_cpu": timed["cpu"], "size": size}


def run(base: str, iterations: int = 150, filler: int = 100_000, rounds: int = 2) -> list[Row]:
    say(f"bus: {rounds} x {iterations} iterations on a fresh bus and on one holding "
        f"{filler:,} events, alternately")
    fresh, filled = [], []
    for _ in range(rounds):
        fresh.append(run_once(base, iterations, 0))
        filled.append(run_once(base, iterations, filler))

    def mean(rs, key):
        return sum(r[key] for r in rs) / len(rs)

    fw, fc, bw, bc = mean(fresh, "wall"), mean(fresh, "cpu"), mean(filled, "wall"), \
        mean(filled, "cpu")
    rw, rc = mean(filled, "reconcile"), mean(filled, "reconcile_cpu")
    rw0, rc0 = mean(fresh, "reconcile"), mean(fresh, "reconcile_cpu")
    size = filled[0]["size"]
    return [
        Row("5 bus reading", f"iteration cost with {filler:,} events in events.jsonl",
            f"{ms(bw)} (CPU {ms(bc)})", f"{ms(fw)} (CPU {ms(fc)}), fresh bus",
            f"{ratio(bw, fw)} (CPU {ratio(bc, fc)})",
            note=f"must stay ~1.0: the engine reads the bus from its offset; "
                 f"{rounds} x {iterations} iterations each, alternated; events.jsonl "
                 f"{size / 1e6:.1f} MB"),
        Row("5 bus reading", "information: resume-time read of the whole bus "
                             "(Engine.reconcile, once per engine start)",
            f"{ms(rw, 1)} (CPU {ms(rc, 1)})", f"{ms(rw0, 3)} (CPU {ms(rc0, 3)}), fresh bus",
            f"{ratio(rw, rw0, 0)} (CPU {ratio(rc, rc0, 0)})",
            note=f"expected to grow with the file: CPU {(rc - rc0) / filler * 1e6:.2f} us per "
                 f"event, {(rc - rc0) / (size / 1e6) * 1000:.0f} ms per MB (wall "
                 f"{(rw - rw0) / (size / 1e6) * 1000:.0f} ms per MB)"),
    ]
