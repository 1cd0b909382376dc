"""ruff over the code, the tests and the benches, and mypy over the store (the interface a
second backend implements): part of the test command, so CI runs them."""
from __future__ import annotations

import re
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


SLEEP = re.compile(r"\btime\.sleep\(")
REASONS = ("# poll:", "# the wait is what is proven")


def test_each_wall_clock_wait_in_the_tests_says_why():
    """Time in tests is the injected clock, moved with freezegun (tests/support/clock.py);
    a real `time.sleep` is either a wait-until loop's interval or the wait a test proves,
    and says which on its line or in the comment just above it."""
    unexplained = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if not SLEEP.search(line) or line.lstrip().startswith("#"):
                continue
            above = [x for x in lines[max(0, i - 3):i] if x.lstrip().startswith("#")]
            if not any(r in text for text in [line, *above] for r in REASONS):
                unexplained.append(f"{path.relative_to(REPO)}:{i + 1}: {line.strip()}")
    assert not unexplained, "a wall-clock wait without its reason (# poll: ..., or " \
                            "# the wait is what is proven: ...):\n" + "\n".join(unexplained)
