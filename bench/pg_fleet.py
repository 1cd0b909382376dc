"""Bench 16: a fleet on one PostgreSQL store. A throwaway cluster (Debian's server, a
private port: tests/postgres_cluster.py) holds every session; N engines (10, then 100),
each its own `ralph session start` on the demo agent with RALPH_STORE_URL set, plan one
task, build, review, stage knowledge and wait in KNOWLEDGE_APPROVAL (`approval:
required`), where the engine handles signals as they land (woken by its session's NOTIFY).

- signal latency: INFO signals dropped one at a time into random sessions of the fleet
  (the store's verb, as `ralph signal` drops them), each timed from the drop until its
  row says handled (read on a connection of the bench's own, every 0.5 ms); aim p99 <=
  50 ms, as on files;
- the engine's CPU per transition: the in-process engine of bench 1 (a no-op agent), on
  the file store and on the PostgreSQL store in the same run, the latter while the fleet
  of N waits in the same database.

Each figure at 10 and at 100 sessions says how it grows with the fleet.
"""
from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from _common import Row, median, ms, now, percentile, ralph_script, ratio, say, session_env, \
    stop_process
from fleet import WAITS, write_config
from overhead import NoopAgent

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import postgres_cluster  # noqa: E402  (the test suite's throwaway cluster)

class StoreUrl:
    """RALPH_STORE_URL set in this process for a while (the store's verbs read it)."""

    def __init__(self, url: str | None):
        self.url, self.before = url, None

    def __enter__(self):
        self.before = os.environ.pop("RALPH_STORE_URL", None)
        if self.url:
            os.environ["RALPH_STORE_URL"] = self.url

    def __exit__(self, *exc):
        os.environ.pop("RALPH_STORE_URL", None)
        if self.before is not None:
            os.environ["RALPH_STORE_URL"] = self.before


def cpu_per_transition(base: str, url: str | None, iterations: int) -> float:
    """Bench 1's in-process engine on a store: CPU seconds per transition, the agent's
    own sends left out."""
    from ralph import session_store
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.session_store import Limits
    workspace = tempfile.mkdtemp(prefix="ralph-bench-pgcpu-", dir=base)
    try:
        with StoreUrl(url):
            session = session_store.create(workspace, "bench: cpu per transition", now=now(),
                                           limits=Limits(max_iterations=iterations + 1))
            agent = NoopAgent(iterations, None)
            engine = Engine(session, Config(), agent_for=lambda role: agent, out=io.StringIO())
            cpu_start = time.process_time()
            code = engine.run()
            cpu = time.process_time() - cpu_start - agent.own_cpu
            transitions = session.metadata.orchestrator.transitions
        if code != 0 or transitions != 3 * iterations + 1:
            raise RuntimeError(f"pg fleet bench: exit {code}, {transitions} transitions")
        return cpu / transitions
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def fleet(base: str, url: str, sessions: int, signals_count: int, iterations: int) -> dict:
    import psycopg
    workspace = tempfile.mkdtemp(prefix="ralph-bench-pgfleet-", dir=base)
    config = write_config(workspace, WAITS)
    env = session_env(RALPH_DEMO_SLEEP_SCALE="0", RALPH_STORE_URL=url)
    procs: dict[str, subprocess.Popen] = {}
    try:
        say(f"pg fleet: starting {sessions} engine(s) on one database")
        for i in range(sessions):
            sid = f"p{sessions:03d}-{i:03d}"
            with open(os.path.join(workspace, f"{sid}.log"), "wb") as log:
                procs[sid] = subprocess.Popen(
                    [ralph_script(), "session", "start", f"bench: pg fleet {i}", "-c", config,
                     "--id", sid], cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT)
        _wait_all_waiting(workspace, procs, deadline=time.monotonic() + 60 + 3 * sessions)
        say(f"pg fleet: {sessions} session(s) wait in KNOWLEDGE_APPROVAL; "
            f"{signals_count} signals")
        with StoreUrl(url), psycopg.connect(url, autocommit=True) as watch:
            from ralph import session_store
            handles = {sid: session_store.load(workspace, sid) for sid in procs}
            rng = random.Random(16)
            latencies = []
            for i in range(signals_count):
                time.sleep(rng.uniform(0, 0.05))
                sid = rng.choice(list(procs))
                t0 = time.perf_counter()
                name = handles[sid].signals.drop("INFO", f"pg fleet probe {i}", now=now())
                latencies.append(_wait_handled(watch, sid, name, procs[sid]) - t0)
        cpu = cpu_per_transition(base, url, iterations)   # beside the waiting fleet
        with StoreUrl(url):
            from ralph import session_store
            for sid in procs:
                session_store.load(workspace, sid).signals.drop("ABORT", "bench done",
                                                                now=now())
        for sid, proc in procs.items():
            if proc.wait(timeout=60) != 4:
                raise RuntimeError(f"pg fleet bench: {sid} exited {proc.returncode} "
                                   f"after ABORT")
        return {"lat": latencies, "cpu": cpu}
    finally:
        for proc in procs.values():
            stop_process(proc)
        shutil.rmtree(workspace, ignore_errors=True)


def _wait_all_waiting(workspace: str, procs: dict, deadline: float) -> None:
    waiting: set[str] = set()
    while len(waiting) < len(procs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"pg fleet bench: only {len(waiting)} of {len(procs)} "
                               f"sessions reached KNOWLEDGE_APPROVAL")
        for sid, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"pg fleet bench: session {sid} exited {proc.returncode}")
            if sid not in waiting:
                with open(os.path.join(workspace, f"{sid}.log"), "rb") as f:
                    if b"waiting for `ralph signal approve`" in f.read():
                        waiting.add(sid)
        time.sleep(0.1)


def _wait_handled(conn, sid: str, name: str, proc: subprocess.Popen,
                  timeout: float = 15.0) -> float:
    deadline = time.perf_counter() + timeout
    while True:
        row = conn.execute("SELECT state FROM ralph_signals WHERE session_id = %s AND name = %s",
                           (sid, name)).fetchone()
        if row and row[0] == "handled":
            return time.perf_counter()
        if time.perf_counter() > deadline or proc.poll() is not None:
            raise RuntimeError(f"pg fleet bench: {name} of {sid} not handled within "
                               f"{timeout:g} s (engine exit code {proc.poll()})")
        time.sleep(0.0005)


def run(base: str, sizes: tuple[int, ...] = (10, 100), signals_count: int = 100,
        iterations: int = 200) -> list[Row]:
    if postgres_cluster.bindir() is None:
        raise RuntimeError("PostgreSQL's server is not installed (apt-get install postgresql)")
    # beside the sessions (a tmpfs by default: the store pays no disk either side), a
    # folder of its own that the server's user can walk
    root = tempfile.mkdtemp(prefix="ralph-bench-postgres-", dir=os.path.dirname(base))
    os.chmod(root, 0o755)
    try:
        url = postgres_cluster.start(root)
        say("pg fleet: CPU per transition, file store")
        on_files = cpu_per_transition(base, None, iterations)
        results = {n: fleet(base, url, n, signals_count, iterations) for n in sizes}
    finally:
        postgres_cluster.stop(root, "immediate")
        shutil.rmtree(root, ignore_errors=True)
    small = results[sizes[0]]
    rows = []
    for n, r in results.items():
        p50, p99 = median(r["lat"]), percentile(r["lat"], 99)
        rows.append(Row("16 pg fleet", f"signal drop -> handled, {n} engines on one PostgreSQL, "
                                       f"p50 / p99 (aim p99 <= 50 ms)",
                        f"{ms(p50, 1)} / {ms(p99, 1)}",
                        f"{sizes[0]} engines: {ms(median(small['lat']), 1)} / "
                        f"{ms(percentile(small['lat'], 99), 1)}",
                        ratio(p99, percentile(small["lat"], 99)) + " (p99)",
                        note=("meets the aim" if p99 <= 0.050 else "misses the aim")
                             + f"; {len(r['lat'])} signals into random sessions; woken by "
                               f"each session's own NOTIFY"))
    for n, r in results.items():
        rows.append(Row("16 pg fleet", f"engine CPU per transition on PostgreSQL, {n} engines "
                                       f"waiting in the same database",
                        ms(r["cpu"], 3), f"file store: {ms(on_files, 3)}",
                        ratio(r["cpu"], on_files),
                        note=f"bench 1's in-process engine, {3 * iterations + 1} transitions; "
                             f"{ratio(r['cpu'], small['cpu'])} of the figure at {sizes[0]} "
                             f"engines"))
    return rows
