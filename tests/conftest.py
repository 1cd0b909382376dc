"""Shared helpers: run the real `ralph` as a subprocess in a temporary workspace, write
demo scenarios, read what a session left on disk."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

RALPH = [sys.executable, "-m", "engine"]
REPO = Path(__file__).resolve().parent.parent


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RALPH_") or k == "RALPH_DEMO_SLEEP_SCALE"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture
def workspace(tmp_path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def ralph(ws: Path, *args, env: dict | None = None, timeout: float = 120,
          input: str | None = None) -> subprocess.CompletedProcess:
    """Run `ralph ARGS` in workspace `ws` and wait for it."""
    return subprocess.run(RALPH + [str(a) for a in args], cwd=ws, env=env or base_env(),
                          capture_output=True, text=True, timeout=timeout, input=input)


def spawn(ws: Path, *args, env: dict | None = None) -> subprocess.Popen:
    """Start `ralph ARGS` in `ws` without waiting (stdout/stderr captured)."""
    return subprocess.Popen(RALPH + [str(a) for a in args], cwd=ws, env=env or base_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def write_scenario(ws: Path, steps: list[dict], name: str = "scenario.yaml") -> Path:
    path = ws / name
    path.write_text(yaml.safe_dump({"steps": steps}, sort_keys=False))
    return path


def write_config(ws: Path, config: dict, name: str = "ralph.yml") -> Path:
    path = ws / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def session_dirs(ws: Path) -> list[Path]:
    root = ws / ".ralph-sessions"
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.exists() else []


def only_session(ws: Path) -> Path:
    dirs = session_dirs(ws)
    assert len(dirs) == 1, dirs
    return dirs[0]


def events(session_dir: Path) -> list[dict]:
    out = []
    for line in (session_dir / "events.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def metadata(session_dir: Path) -> dict:
    return yaml.safe_load((session_dir / "metadata.yaml").read_text())


def progress_markers(session_dir: Path) -> dict[str, dict[str, str]]:
    """{iteration: {task_id: marker}} from every iterations/<N>/progress.md."""
    out = {}
    for it in sorted((session_dir / "iterations").iterdir(), key=lambda p: int(p.name)):
        pm = it / "progress.md"
        if pm.exists():
            marks = {}
            for line in pm.read_text().splitlines():
                if line.startswith("- ["):
                    marks[line[6:].split(":")[0]] = line[3]
            out[it.name] = marks
    return out


FAST = {"RALPH_DEMO_SLEEP_SCALE": "0"}


@pytest.fixture
def web(workspace):
    """start(*args, env=None): a real `ralph web` in the workspace (tests/_web.py), stopped
    at the end of the test."""
    from _web import WebServer
    servers = []

    def start(*args, env=None):
        servers.append(WebServer(workspace, *args, env=env))
        return servers[-1]
    yield start
    for s in servers:
        s.stop(expect=None)


def wait_for(predicate, timeout: float = 20, interval: float = 0.02):
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")


# --- test artefacts (the browser tests' screenshots), listed at the end of the run ---

ARTIFACTS = pytest.StashKey[list]()


def artifacts_dir() -> Path:
    """$RALPH_TEST_ARTIFACTS, else ralph-test-artifacts/ in the temp directory."""
    import tempfile
    root = os.environ.get("RALPH_TEST_ARTIFACTS") or os.path.join(tempfile.gettempdir(),
                                                                  "ralph-test-artifacts")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def pytest_configure(config):
    config.stash[ARTIFACTS] = []


def pytest_terminal_summary(terminalreporter, config):
    saved = config.stash.get(ARTIFACTS, [])
    if saved:
        terminalreporter.write_line(f"test artefacts ({len(saved)}), look at them:")
        for path in saved:
            terminalreporter.write_line(f"  {path}")
