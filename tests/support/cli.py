"""The real `ralph`, run as a subprocess in a temporary workspace (the integration tier)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

RALPH = [sys.executable, "-m", "ralph.engine"]
REPO = Path(__file__).resolve().parent.parent.parent
FAST = {"RALPH_DEMO_SLEEP_SCALE": "0"}


def base_env(**extra) -> dict:
    """This process's environment without any RALPH_* (but the demo's sleep scale and the
    test run's state directory), plus `extra`. ralph runs as installed (`pip install -e`),
    as a user's does: the repository is not put on the path, where its folders would be
    importable as top-level packages no user has."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RALPH_") or k in ("RALPH_DEMO_SLEEP_SCALE", "RALPH_STATE_DIR")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def ralph(ws: Path, *args, env: dict | None = None, timeout: float = 120,
          input: str | None = None) -> subprocess.CompletedProcess:
    """Run `ralph ARGS` in workspace `ws` and wait for it."""
    return subprocess.run(RALPH + [str(a) for a in args], cwd=ws, env=env or base_env(),
                          capture_output=True, text=True, timeout=timeout, input=input)


def signal_file(said: str) -> str:
    """The signal file `ralph signal` says it dropped: "... (signal file NAME)"."""
    return said.rsplit("(signal file ", 1)[1].strip().rstrip(")")


def spawn(ws: Path, *args, env: dict | None = None) -> subprocess.Popen:
    """Start `ralph ARGS` in `ws` without waiting (stdout/stderr captured)."""
    return subprocess.Popen(RALPH + [str(a) for a in args], cwd=ws, env=env or base_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str, str]:
    """Wait for a spawned `ralph`: (exit code, stdout, stderr); the test fails (and the
    process is killed) if it does not end within `timeout` seconds."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"ralph did not finish in {timeout}s:\n{out}\n{err}")
    return proc.returncode, out, err


def wait_for(predicate, timeout: float = 20, interval: float = 0.02, what: str = ""):
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds
    (saying `what` it waited for, or the predicate)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)   # poll: until the predicate holds
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
