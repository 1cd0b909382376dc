"""Bench 2: `ralph emit` cold start against the bare interpreter, in the same run.

Each command runs as a fresh subprocess, interleaved round by round so that drift in
the machine's load hits every command alike; the figure is the median wall time
(fork + exec + interpreter start + imports + the line in the outbox + exit). The emits
speak as an agent run that a real engine holds open (HeldRun): the engine takes them.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

from _common import HeldRun, Row, median, ms, ralph_script, ratio, say, timed_run


def run(base: str, runs: int = 30, warmup: int = 3) -> list[Row]:
    from ralph.session_store import read_events

    py = sys.executable
    ralph = ralph_script()
    workspace = tempfile.mkdtemp(prefix="ralph-bench-emit-", dir=base)
    held = None
    try:
        held = HeldRun(workspace, "emit")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RALPH_")}
        env.update(held.env)   # the agent run's own environment
        # Measure what an installed ralph costs: with cached bytecode. The warm-up runs
        # write it under the bench's temp dir, so the checkout stays clean even where
        # PYTHONDONTWRITEBYTECODE is set (then every start would compile ralph's modules).
        no_bytecode = bool(env.pop("PYTHONDONTWRITEBYTECODE", None))
        env["PYTHONPYCACHEPREFIX"] = os.path.join(workspace, "pycache")
        commands = {
            "base": [py, "-c", "pass"],
            "ralph": [ralph, "emit", "bench.tick", "from the console script"],
            "module": [py, "-m", "ralph.engine", "emit", "bench.tick",
                       "from python -m ralph.engine"],
            "libs": [py, "-c", "import transitions, attrs, yaml"],
            "nosite": [py, "-S", "-c", "pass"],
            # a CLI's pre-tool hook on a call no rule names: the engine's reply is `pass`
            "hook": [ralph, "tools", "approve", "--cli", "claude"],
        }
        call = b'{"tool_name": "Bash", "tool_input": {"command": "ls"}}'
        say(f"emit: {len(commands)} commands x {runs} runs (+{warmup} warm-up), interleaved")
        times: dict[str, list[float]] = {k: [] for k in commands}
        for i in range(warmup + runs):
            for key, argv in commands.items():
                elapsed = timed_run(argv, env, workspace, "emit",
                                    stdin=call if key == "hook" else None)
                if i >= warmup:
                    times[key].append(elapsed)
        held.stop()   # its run closed: every line it sent is taken
        ticks = [r for r in read_events(held.dir)[0] if r["topic"] == "bench.tick"]
        if len(ticks) != 2 * (warmup + runs):
            raise RuntimeError(f"emit bench: {len(ticks)} events on the bus, expected "
                               f"{2 * (warmup + runs)}")
    finally:
        if held is not None:
            held.stop()
        shutil.rmtree(workspace, ignore_errors=True)

    med = {k: median(v) for k, v in times.items()}
    base_label = f"{ms(med['base'], 1)} (python -c pass)"
    cached = ("bytecode cached in a temp PYTHONPYCACHEPREFIX"
              + (" (PYTHONDONTWRITEBYTECODE was set: unset for this bench)" if no_bytecode else ""))
    return [
        Row("2 emit cold start", "`ralph emit` (console script), median",
            ms(med["ralph"], 1), base_label, ratio(med["ralph"], med["base"]),
            note=f"+{ms(med['ralph'] - med['base'], 1)} over the interpreter; {runs} runs each, "
                 f"p90 {ms(_p90(times['ralph']), 1)}; {cached}"),
        Row("2 emit cold start", "`ralph tools approve` (a CLI's hook; no rule: `pass`), median",
            ms(med["hook"], 1), base_label, ratio(med["hook"], med["base"]),
            note=f"+{ms(med['hook'] - med['base'], 1)} over the interpreter: a round trip "
                 f"through the outbox to the engine and back, before each tool call a rule "
                 f"could name"),
        Row("2 emit cold start", "`python -m ralph.engine emit`, median",
            ms(med["module"], 1), base_label, ratio(med["module"], med["base"]),
            note=f"+{ms(med['module'] - med['base'], 1)} over the interpreter"),
        Row("2 emit cold start", "context: `python -c \"import transitions, attrs, yaml\"`",
            ms(med["libs"], 1), base_label, ratio(med["libs"], med["base"]),
            note="what emit would cost if it imported the engine's libraries"),
        Row("2 emit cold start", "context: `python -S -c pass` (no site, no .pth)",
            ms(med["nosite"], 1), base_label, ratio(med["nosite"], med["base"]),
            note="the interpreter without site-packages start-up (an editable install's "
                 ".pth finder is part of the baseline)"),
    ]


def _p90(values: list[float]) -> float:
    from _common import percentile
    return percentile(values, 90)
