"""ruff over the code, the tests and the benches, and mypy over the store (the interface a
second backend implements): part of the test command, so CI runs them."""
from __future__ import annotations

import subprocess
import sys

from support import REPO


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def test_ruff_finds_nothing():
    r = run("ruff", "check", "--no-cache", "engine", "states", "session_store", "tests", "bench")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_stores_types_check():
    r = run("mypy", "--no-incremental", "session_store")
    assert r.returncode == 0, r.stdout + r.stderr
