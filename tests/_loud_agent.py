"""An agent (the `command` backend) that prints a lot, and how to measure the engine that
runs it. tests/test_agent_output.py and bench/agent_output.py use both.

    python _loud_agent.py   (the prompt on stdin; LOUD_BYTES in the environment)

Its planner's first run writes LOUD_BYTES of stream-json-like lines on its stdout
(LOUD_BYTES=0: a quiet twin); then every role does its work through `ralph emit` (one
task, built, reviewed, then LOOP_COMPLETE).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from _agent_outcome import outcome as role_outcome

LINE = (json.dumps({"type": "assistant", "message": {"content": [
    {"type": "text", "text": "noise " * 150}]}}) + "\n").encode()
# `python -m ralph.engine ARGS` whose own peak RSS (VmHWM: the engine's, not its agents', which
# are other processes) it writes to $ENGINE_PEAK_OUT as it exits
_MEASURED = ("import atexit, os, runpy, sys\n"
             "out = os.environ['ENGINE_PEAK_OUT']\n"
             "def peak():\n"
             "    with open('/proc/self/status') as s, open(out, 'w') as f:\n"
             "        f.write(next(l for l in s if l.startswith('VmHWM:')).split()[1])\n"
             "atexit.register(peak)\n"
             "sys.argv[0] = 'ralph'\n"
             "runpy.run_module('ralph.engine', run_name='__main__', alter_sys=True)\n")


def engine_measured(workspace: str, args: list[str], env: dict, peak_file: str,
                    timeout: float = 600) -> tuple[subprocess.CompletedProcess, int]:
    """Run `ralph ARGS` in `workspace`; what it did and its peak RSS in bytes."""
    done = subprocess.run([sys.executable, "-c", _MEASURED, *args], cwd=workspace,
                          env={**env, "ENGINE_PEAK_OUT": peak_file}, capture_output=True,
                          text=True, timeout=timeout)
    with open(peak_file) as f:
        return done, int(f.read()) * 1024


def loud_config(agent_python: str = sys.executable) -> dict:
    """The ralph.yml of a session this agent plays every role of."""
    return {"agent": {"backend": "command", "command": [agent_python, os.path.abspath(__file__)]}}


def _shout(size: int) -> None:
    chunk = LINE * max(1, (1 << 20) // len(LINE))
    while size > 0:
        size -= os.write(1, chunk[:size])


def main() -> int:
    sys.stdin.read()
    role, env = os.environ["RALPH_ROLE"], os.environ
    first = env.get("RALPH_ITERATION") == "1" and env.get("RALPH_ATTEMPT") == "1"
    if role == "planner" and first:
        _shout(int(env.get("LOUD_BYTES", "0")))
        print("the plan is ready", flush=True)
    outcome = role_outcome(role, plans=first)
    if outcome is None:
        return 0
    return subprocess.run([sys.executable, "-m", "ralph.engine", "emit", *outcome],
                          timeout=60).returncode


if __name__ == "__main__":
    sys.exit(main())
