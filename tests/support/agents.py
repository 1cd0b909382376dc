"""A rig for the real agent CLIs (installed from npm into tests/agents/ by .ci/run): a
workspace outside any git repository, a private HOME, the CLI pointed at a scripted
model server, and `ralph` run as a user runs it. The PATH holds the CLIs and the system
only, never the venv: agents must find `ralph` by the absolute path the prompt gives.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .cli import RALPH, REPO, base_env
from .disk import session_dir
from .model_server import Brain, ModelServer

AGENTS_BIN = REPO / "tests" / "agents" / "node_modules" / ".bin"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
CLIS = ("claude", "codex", "gemini")


def cli_path(name: str) -> Path:
    path = AGENTS_BIN / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed in {AGENTS_BIN} (.ci/run installs it)")
        pytest.skip(f"{name} is not installed: npm install --prefix tests/agents")
    return path


class Rig:
    """One agent CLI, one workspace, one scripted model. `subscriber`: Claude Code logs in
    as a claude.ai subscriber (an OAuth token, no API key), the one way it reads a usage
    limit's reset."""

    def __init__(self, cli: str, tmp: Path, brain: Brain | None = None,
                 subscriber: bool = False):
        cli_path(cli)
        self.cli = cli
        self.ws = tmp / "ws"
        self.ws.mkdir()
        # a home where the user's is (not in /tmp, which every run has a private one of:
        # the sandbox must hide its secrets itself), and Codex makes its sandbox helper's
        # alias in $CODEX_HOME, which it refuses to under the temporary directory
        home = self.home = Path(tempfile.mkdtemp(prefix="ralph-cli-home-", dir=Path.home()))
        self.server = ModelServer(brain).start()
        env = base_env()
        env.update(HOME=str(home), PATH=f"{AGENTS_BIN}:{SYSTEM_PATH}")
        if cli == "claude":
            env.update(ANTHROPIC_BASE_URL=self.server.url,
                       CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")
            for login in ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"):
                env.pop(login, None)
            env.update({"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-scripted"} if subscriber
                       else {"ANTHROPIC_API_KEY": "sk-scripted"})
        elif cli == "gemini":
            # the API-key login a user picks once (Gemini CLI asks for it otherwise)
            (home / ".gemini").mkdir()
            (home / ".gemini" / "settings.json").write_text(
                '{"security": {"auth": {"selectedType": "gemini-api-key"}}}')
            env.update(GOOGLE_GEMINI_BASE_URL=self.server.url, GEMINI_API_KEY="scripted")
        else:
            codex_home = home / ".codex"
            codex_home.mkdir()
            (codex_home / "config.toml").write_text(
                'model = "gpt-5-codex"\nmodel_provider = "scripted"\n\n'
                '[model_providers.scripted]\nname = "scripted model server"\n'
                f'base_url = "{self.server.url}/v1"\nwire_api = "responses"\n')
            env.update(CODEX_HOME=str(codex_home))
        self.env = env

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.home, ignore_errors=True)

    def start(self, *args: str, sid: str = "real") -> subprocess.Popen:
        """`ralph session start` with `--agent <cli>` and nothing else configured."""
        return subprocess.Popen(
            RALPH + ["session", "start", "Write hello.txt that says hello", "--agent", self.cli,
                     "--id", sid, *args], cwd=self.ws, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def resume(self, sid: str = "real", *args: str) -> subprocess.Popen:
        return subprocess.Popen(RALPH + ["session", "resume", sid, *args], cwd=self.ws,
                                env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def ralph(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(RALPH + list(args), cwd=self.ws, env=env or self.env,
                              capture_output=True, text=True, timeout=60)

    def session_dir(self, sid: str = "real") -> Path:
        """The session's control plane."""
        return session_dir(self.ws, sid)


def processes_marked(work: Path) -> list[tuple[int, str]]:
    """Live processes carrying the run mark of the session whose work area is `work`
    (runs are marked with it): (pid, command line)."""
    from ralph.engine.agents import containment
    found = []
    for pid in containment.find(str(work)):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found.append((pid, cmd.strip()))
    return found


def wait_for_process(work: Path, needle: str, timeout: float = 60) -> int:
    """The pid of the marked process of the session whose work area is `work` whose
    command line holds `needle`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid, cmd in processes_marked(work) if work.exists() else []:
            if needle in cmd:
                return pid
        time.sleep(0.05)   # poll: until the process runs
    raise AssertionError(f"no process running {needle!r} in {work}")
