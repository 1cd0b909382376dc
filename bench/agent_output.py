"""Bench 17: the engine's peak memory when an agent prints 300 MB on its stdout.

Two `ralph session start` (this checkout's ralph, `python -m ralph.engine`, installed from
it), each a whole session whose `command` agent (tests/_loud_agent.py) plays every role:
one whose planner prints 300 MB of stream-json-like lines before its plan, a quiet twin
that prints none; alternated, rounds of both. The figure is the engine process's own
peak RSS (VmHWM of that process, read as it exits: not its agents', other processes),
the largest over the rounds. The engine reads and keeps a run's log bounded
(session_store/_runlog.py: its first 64 KiB and last 1 MiB): aim, within 20 MB of the
quiet twin. Before, it read each log whole: 981 MB against 34 MB.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import yaml

from _common import Row, say, session_env

LOUD_BYTES = 300_000_000
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import _loud_agent  # noqa: E402  (the test suite's loud agent, and how it measures)


def run(base: str, rounds: int = 3, loud_bytes: int = LOUD_BYTES) -> list[Row]:
    work = tempfile.mkdtemp(prefix="ralph-bench-output-", dir=base)
    peaks: dict[str, list[int]] = {"quiet": [], "loud": []}
    say(f"agent output: {rounds} round(s) of a session printing {loud_bytes / 1e6:.0f} MB "
        f"and its quiet twin")
    try:
        for n in range(rounds):
            for name, size in (("quiet", 0), ("loud", loud_bytes)):
                ws = os.path.join(work, f"{name}-{n}")
                os.makedirs(ws)
                with open(os.path.join(ws, "ralph.yml"), "w") as f:
                    yaml.safe_dump(_loud_agent.loud_config(), f)
                env = session_env(LOUD_BYTES=str(size))
                done, peak = _loud_agent.engine_measured(
                    ws, ["session", "start", "print a lot", "--id", "s"], env,
                    os.path.join(work, f"{name}-{n}.peak"))
                if done.returncode != 0:
                    raise RuntimeError(f"the {name} session exited {done.returncode}: "
                                       f"{done.stderr.strip()[-300:]}")
                peaks[name].append(peak)
                shutil.rmtree(ws)   # 300 MB of log
    finally:
        shutil.rmtree(work, ignore_errors=True)
    loud, quiet = max(peaks["loud"]), max(peaks["quiet"])
    return [Row("17 agent output", f"the engine's peak RSS, its agent printing "
                f"{loud_bytes / 1e6:.0f} MB on stdout", f"{loud / 1e6:.1f} MB",
                f"{quiet / 1e6:.1f} MB (a quiet twin)", f"{loud / quiet:.2f}",
                note=f"{(loud - quiet) / 1e6:+.1f} MB (aim: within 20 MB); the largest of "
                     f"{rounds} round(s) each, alternated")]
