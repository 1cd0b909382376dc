"""Bench 1: engine overhead per transition, with a no-op in-process agent.

Every iteration is PLANNING -> EXECUTING_BATCH -> REVIEWING_BATCH -> PLANNING (3
transitions, one task, no knowledge staged). The planner plans one task in iterations
1..N and says LOOP_COMPLETE in iteration N + 1, so the run is 3N + 1 transitions.
An iteration's cost is the time between two consecutive planner invocations.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
import time

from _common import Row, median, ms, now, ratio, say

EVIDENCE = ("tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 91, "
            "complexity: 3, duplication: pass")


class NoopAgent:
    """Emits what each role must emit, through the session's outbox as `ralph emit` does
    (the engine takes it onto the bus), and returns at once."""

    def __init__(self, iterations: int, metadata_path):
        self.iterations = iterations
        self.metadata_path = metadata_path
        self.starts: list[float] = []          # perf_counter at each planner invocation
        self.cpu: list[float] = []             # process_time at the same moments
        self.metadata_sizes: dict[int, int] = {}
        self.own_cpu = 0.0                     # CPU of its own sends: a real agent's, not ours

    def run(self, inv, wakeup=None, should_stop=None):
        from ralph.engine.agents import Outcome
        from ralph.engine.tools.emit import publish
        cpu_start = time.process_time()
        env = inv.env
        it = int(env["RALPH_ITERATION"])

        def emit(topic, payload):
            publish(env["RALPH_SESSION_DIR"], topic, payload, run=env["RALPH_RUN_ID"])
        if inv.role == "planner":
            self.starts.append(time.perf_counter())
            self.cpu.append(time.process_time())
            if self.metadata_path is not None:   # (a database's session has no file)
                self.metadata_sizes[it] = os.path.getsize(self.metadata_path())
            if it > self.iterations:
                emit("LOOP_COMPLETE", "nothing left")
            else:
                emit("plan.ready", {"tasks": [
                    {"id": f"t{it}", "title": f"no-op task {it}", "batch": 1}]})
        elif inv.role == "executor":
            emit("build.done", EVIDENCE)
        elif inv.role == "reviewer":
            emit("review.done", "tests: pass, build: pass")
        # librarian: stages nothing
        self.own_cpu += time.process_time() - cpu_start
        return Outcome(exit_code=0)


def run(base: str, iterations: int = 1000, window: int = 100) -> list[Row]:
    from ralph import session_store
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.session_store import Limits, _atomic

    window = min(window, max(1, iterations // 2))
    workspace = tempfile.mkdtemp(prefix="ralph-bench-overhead-", dir=base)
    try:
        session = session_store.create(workspace, "bench: engine overhead", now=now(),
                                       limits=Limits(max_iterations=iterations + 1))
        agent = NoopAgent(iterations, lambda: session.metadata_path)
        engine = Engine(session, Config(), agent_for=lambda role: agent, out=io.StringIO())
        say(f"overhead: {iterations} iterations with a no-op in-process agent")
        writes_before, fsyncs_before = _atomic.durable_writes, _atomic.fsyncs
        start, cpu_start = time.perf_counter(), time.process_time()
        code = engine.run()
        total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        cpu -= agent.own_cpu   # the engine's: a real agent sends in its own process
        # all the engine's: the agent's sends are not durable writes, their records on
        # the bus are the engine's
        writes = _atomic.durable_writes - writes_before
        fsyncs = _atomic.fsyncs - fsyncs_before
        m = session.metadata
        transitions = m.orchestrator.transitions
        if code != 0 or m.status.value != "completed" or m.iteration != iterations + 1 \
                or transitions != 3 * iterations + 1:
            raise RuntimeError(f"overhead bench: unexpected end: exit {code}, status "
                               f"{m.status.value}, iteration {m.iteration}, "
                               f"{transitions} transitions")
        final_size = os.path.getsize(session.metadata_path)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)

    def windows(stamps):
        per = [b - a for a, b in zip(stamps, stamps[1:])]  # N intervals
        first, last = per[:window], per[-window:]
        return sum(first) / len(first), sum(last) / len(last), median(first), median(last)

    w_first, w_last, w_med_first, w_med_last = windows(agent.starts)
    c_first, c_last, _, _ = windows(agent.cpu)
    sizes = agent.metadata_sizes
    second = sizes.get(2, sizes.get(1))
    return [
        Row("1 engine overhead", "mean time per transition",
            f"{ms(total / transitions, 3)} (CPU {ms(cpu / transitions, 3)})",
            note=f"{transitions} transitions, {iterations} iterations in {total:.2f} s; CPU is "
                 f"the engine's (the in-process agent's own sends to the outbox left out, "
                 f"{ms(agent.own_cpu / transitions, 3)} per transition); "
                 f"{ms(total / iterations)} per iteration; "
                 f"{writes / transitions:.1f} durable writes ({fsyncs / transitions:.1f} "
                 f"fsyncs) per transition by the engine"),
        Row("1 engine overhead", f"mean iteration cost, last {window} iterations",
            f"{ms(w_last)} (CPU {ms(c_last)})",
            f"{ms(w_first)} (CPU {ms(c_first)}), first {window}",
            f"{ratio(w_last, w_first)} (CPU {ratio(c_last, c_first)})",
            note=f"should stay ~1.0 (CPU time is the figure a busy machine disturbs least); "
                 f"wall medians {ms(w_med_last)} vs {ms(w_med_first)}; metadata.yaml "
                 f"{second} B at iteration 2, {final_size} B at the end"),
    ]


def run_diagnostics(base: str, iterations: int = 300, rounds: int = 3) -> list[Row]:
    """The cost of `diagnostics: true` on a transition: the engine's CPU per transition with
    diagnostics on against off, the two interleaved over `rounds` in the same run (median)."""
    from ralph import session_store
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.session_store import Limits

    def cpu_per_transition(diagnostics: bool) -> float:
        workspace = tempfile.mkdtemp(prefix="ralph-bench-diagnostics-", dir=base)
        try:
            session = session_store.create(workspace, "bench: diagnostics", now=now(),
                                           limits=Limits(max_iterations=iterations + 1))
            agent = NoopAgent(iterations, None)
            engine = Engine(session, Config(diagnostics=diagnostics),
                            agent_for=lambda role: agent, out=io.StringIO())
            cpu_start = time.process_time()
            if engine.run() != 0:
                raise RuntimeError("diagnostics bench: the session did not complete")
            cpu = time.process_time() - cpu_start - agent.own_cpu
            return cpu / session.metadata.orchestrator.transitions
        finally:
            shutil.rmtree(workspace, ignore_errors=True)

    say(f"diagnostics: {rounds} rounds of {iterations} iterations, off and on")
    off, on = [], []
    for _ in range(rounds):
        off.append(cpu_per_transition(False))
        on.append(cpu_per_transition(True))
    return [Row("1 engine overhead", "CPU per transition with diagnostics on (aim < 1.10)",
                f"CPU {ms(median(on), 3)}", f"off: CPU {ms(median(off), 3)}",
                ratio(median(on), median(off)),
                note=f"median of {rounds} interleaved runs of {iterations} iterations each; "
                     f"rounds on {', '.join(ms(v, 3) for v in on)}, off "
                     f"{', '.join(ms(v, 3) for v in off)}")]
