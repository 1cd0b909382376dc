"""Bench 18: what confinement costs a run (engine/running/sandbox.py).

One agent run as the engine makes it (`CommandAgent.run`: the supervisor, the logs, the
run's containment at its end) of a program that does nothing (`true`), confined in
ralph's bubblewrap sandbox and unconfined, alternated, median of N each; the difference
is the sandbox's cost per run (aim: <= 50 ms). For context, the same pair for the demo
agent (a Python program: what a CLI's start-up dwarfs).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

from _common import Row, median, ms, ratio, say


def _invocation(ws: str, sandbox, n: int):
    from ralph.engine.agents import Invocation, containment
    work = os.path.join(ws, ".ralph-sessions", "bench")
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    return Invocation(role="executor", prompt="", cwd=ws, timeout=60,
                      log_base=os.path.join(work, "logs", f"{n:04d}-executor"),
                      env={**os.environ, containment.RUN_MARK: f"bench-{n}",
                           containment.SESSION_MARK: work}, sandbox=sandbox)


def _pair(ws: str, sandbox, argv: list[str], runs: int) -> tuple[float, float]:
    from ralph.engine.agents import CommandAgent
    from ralph.engine.agents.presets import Command
    from ralph.engine.config import PromptMode
    agent = CommandAgent(Command(argv, PromptMode.STDIN))
    confined, plain = [], []
    for n in range(runs):
        for box, into in ((sandbox, confined), (None, plain)):
            started = time.perf_counter()
            outcome = agent.run(_invocation(ws, box, 2 * n + (box is None)))
            into.append(time.perf_counter() - started)
            assert outcome.exit_code == 0, (outcome.stderr_tail, argv)
    return median(confined), median(plain)


def run(base: str, runs: int = 30) -> list[Row]:
    from ralph.engine.running import sandbox as sb
    from ralph.engine.agents import demo_argv
    ws = tempfile.mkdtemp(prefix="sandbox-", dir=base)
    box = sb.find(hidden=(os.environ.get("RALPH_STATE_DIR", ""),))
    say(f"18 sandbox: {runs} runs of `true`, confined and not")
    confined, plain = _pair(ws, box, ["true"], runs)
    say(f"18 sandbox: {runs // 3 or 1} runs of the demo agent, confined and not")
    demo_confined, demo_plain = _pair(ws, box, [*demo_argv(None), "--help"], runs // 3 or 1)
    return [
        Row("18 sandbox", f"one run of `true` in ralph's sandbox (bubblewrap), median of "
            f"{runs}", ms(confined), ms(plain), ratio(confined, plain),
            f"the sandbox costs {ms(confined - plain)} a run (aim <= 50 ms)"),
        Row("18 sandbox", "one run of the demo agent (a Python program) in the sandbox",
            ms(demo_confined), ms(demo_plain), ratio(demo_confined, demo_plain),
            f"+{ms(demo_confined - demo_plain)}; {sys.version.split()[0]}"),
    ]
