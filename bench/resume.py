"""Bench 8: `ralph session resume` of a 1,000-iteration session, and of a session with
100,000 events in its history, against a 1-iteration one (aim, issue 16: the 100,000-event
resume <= 1.2x).

Each session is built in-process with overhead.py's no-op agent, which always plans one
more task: with max_iterations N the engine pauses on the limit when PLANNING iteration
N + 1 (exit 5). The bench then times `ralph session resume ID` as a subprocess, with the
limit unchanged: the CLI loads the session and its config, the engine reconciles (reads
the whole bus), recovers signals and questions, fires `resume`, meets the limit again and
pauses (exit 5, no agent run). So the figure is start-up + load + reconcile + recovery +
two transitions. Resumes of both sessions alternate, R runs each after a warm-up, and
each figure is the median.
"""
from __future__ import annotations

import io
import os
import resource
import shutil
import subprocess
import tempfile
import time

from _common import (Row, bus_path, config_snapshot, median, ms, now, ralph_script, ratio,
                     say, session_env)
from overhead import NoopAgent

TIMEOUT = 120.0   # one resume; more is a hang (subprocess.TimeoutExpired: an ERROR row)


def build(workspace: str, iterations: int, session_id: str, history: int = 0) -> dict:
    """A session paused by max_iterations after `iterations` full iterations; `history`
    events (agents' notes) on its bus before them, as a long-lived session has."""
    import json

    from ralph import session_store
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.session_store import Limits

    session = session_store.create(workspace, f"bench: resume {iterations}", now=now(),
                                   session_id=session_id, config_snapshot=config_snapshot(),
                                   limits=Limits(max_iterations=iterations))
    if history:   # written in one go (the engine's appends are what is measured elsewhere)
        with open(bus_path(session.dir), "ab") as f:
            f.write(b"".join((json.dumps(
                {"seq": seq, "ts": now().isoformat(), "topic": "agent.note",
                 "payload": f"note {seq}: what the agent saw at this step of its work",
                 "source": "executor", "iteration": 1, "state": "EXECUTING_BATCH"},
                separators=(",", ":")) + "\n").encode() for seq in range(2, history + 2)))
    agent = NoopAgent(iterations + 10, lambda: session.metadata_path)   # never completes
    start = time.perf_counter()
    code = Engine(session, Config(), agent_for=lambda role: agent, out=io.StringIO()).run()
    built = time.perf_counter() - start
    m = session.metadata
    if code != 5 or m.iteration != iterations + 1:
        raise RuntimeError(f"resume bench: building {session_id}: exit {code}, iteration "
                           f"{m.iteration}, status {m.status.value}")
    path = bus_path(session.dir)
    with open(path, "rb") as f:
        events = sum(1 for _ in f)
    return {"built": built, "events": events, "bus": os.path.getsize(path),
            "transitions": m.orchestrator.transitions}


def resume_once(workspace: str, session_id: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one `ralph session resume` subprocess."""
    argv = [ralph_script(), "session", "resume", session_id]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=workspace, env=session_env(), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 5:
        raise RuntimeError(f"resume bench: `ralph session resume {session_id}` exited "
                           f"{proc.returncode}, expected 5 (the limit again): "
                           f"{proc.stdout[-1500:]}")
    return elapsed, cpu


def load_and_reconcile(workspace: str, session_id: str, runs: int = 5) -> float:
    """In-process: session_store.load + Engine.reconcile, the part that grows; median."""
    from ralph import session_store
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session = session_store.load(workspace, session_id)
        Engine(session, Config(), agent_for=lambda role: None, out=io.StringIO()).reconcile()
        times.append(time.perf_counter() - start)
    return median(times)


def run(base: str, iterations: int = 1000, runs: int = 7, warmup: int = 1,
        history: int = 100_000) -> list[Row]:
    workspace = tempfile.mkdtemp(prefix="ralph-bench-resume-", dir=base)
    try:
        say(f"resume: building a {iterations}-iteration session and a 1-iteration one")
        big = build(workspace, iterations, "big")
        small = build(workspace, 1, "small")
        long = build(workspace, 1, "long", history=history)
        say(f"resume: `ralph session resume` x {runs} (+{warmup} warm-up) each, alternated")
        times: dict[str, list[float]] = {"big": [], "small": [], "long": []}
        cpus: dict[str, list[float]] = {"big": [], "small": [], "long": []}
        for i in range(warmup + runs):
            for key in times:
                elapsed, cpu = resume_once(workspace, key)
                if i >= warmup:
                    times[key].append(elapsed)
                    cpus[key].append(cpu)
        inproc = {key: load_and_reconcile(workspace, key) for key in times}
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    b, s = median(times["big"]), median(times["small"])
    bc, sc = median(cpus["big"]), median(cpus["small"])
    h, hc = median(times["long"]), median(cpus["long"])
    aim = "meets the aim" if h / s <= 1.2 else "misses the aim"
    return [
        Row("8 resume", f"`ralph session resume` with {long['events']:,} events on the bus "
                        f"(aim <= 1.2x), median", f"{ms(h, 0)} (CPU {ms(hc, 0)})",
            f"{ms(s, 0)} (CPU {ms(sc, 0)}), 1-iteration session",
            f"{ratio(h, s)} (CPU {ratio(hc, sc)})",
            note=f"{aim}; a {long['bus'] / 1e6:.1f} MB bus; the resume reads it from the end "
                 f"back (the last transition), never whole; in-process load + reconcile "
                 f"{ms(inproc['long'], 1)}"),
        Row("8 resume", f"`ralph session resume` of a {iterations:,}-iteration session, "
                        f"median", f"{ms(b, 0)} (CPU {ms(bc, 0)})",
            f"{ms(s, 0)} (CPU {ms(sc, 0)}), 1-iteration session",
            f"{ratio(b, s)} (CPU {ratio(bc, sc)})",
            note=f"a subprocess: start-up + load + reconcile + recovery + resume + limit "
                 f"pause, exit 5; {big['events']:,} events ({big['bus'] / 1e6:.1f} MB bus), "
                 f"{big['transitions']:,} transitions (vs {small['events']} events); "
                 f"in-process load + reconcile {ms(inproc['big'], 1)} vs "
                 f"{ms(inproc['small'], 1)}; {runs} runs "
                 f"each, min {ms(min(times['big']), 0)} vs {ms(min(times['small']), 0)}; "
                 f"building it took {big['built']:.1f} s"),
    ]
