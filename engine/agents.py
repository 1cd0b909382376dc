"""Agent backends: run one role invocation and report how it ended.

The engine reads what an agent *said* from the event bus; a backend only runs the
process: its own process group, a timeout that kills the whole group, stdout/stderr
kept in the iteration's logs/, and a stop request (PAUSE/ABORT) honoured at once.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import attrs

from session_store._atomic import open_private, read_nofollow

from .config import AgentConfig, Backend, PromptMode

KILL_GRACE_SECONDS = 2.0

# Non-interactive argv and prompt mode of the common agent CLIs.
PRESETS: dict[Backend, tuple[list[str], PromptMode]] = {
    Backend.CLAUDE: (["claude", "--print", "--output-format", "stream-json", "--verbose",
                      "--dangerously-skip-permissions"], PromptMode.STDIN),
    Backend.CODEX: (["codex", "exec", "--full-auto"], PromptMode.ARG),
    Backend.GEMINI: (["gemini", "--yolo", "-p"], PromptMode.ARG),
    Backend.KIRO: (["kiro-cli", "chat", "--no-interactive", "--trust-all-tools"], PromptMode.ARG),
    Backend.AMP: (["amp", "--dangerously-allow-all", "-x"], PromptMode.ARG),
    Backend.COPILOT: (["copilot", "--allow-all-tools", "-p"], PromptMode.ARG),
    Backend.OPENCODE: (["opencode", "run"], PromptMode.ARG),
}


@attrs.define
class Invocation:
    role: str
    prompt: str
    env: dict[str, str]
    cwd: str
    log_base: str          # iterations/<N>/logs/<seq>-<role>[-<task>]; .prompt.md/.stdout/.stderr
    timeout: float


@attrs.define
class Outcome:
    exit_code: int | None
    timed_out: bool = False
    stopped: str | None = None     # why the engine stopped it (PAUSE, ABORT), if it did
    stdout: str = ""
    duration: float = 0.0


def _die_with_parent() -> None:
    """In the child: SIGKILL when the engine dies, so a kill -9'd engine leaves no orphan."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class CommandAgent:
    """Any program: prompt on stdin, as the last argument, or as a file path argument."""

    def __init__(self, argv: list[str], prompt_mode: PromptMode):
        self.argv = list(argv)
        self.prompt_mode = prompt_mode

    def run(self, inv: Invocation, wakeup: threading.Event | None = None,
            should_stop=None) -> Outcome:
        """Run to the end, the timeout, or until `should_stop()` (asked whenever `wakeup`
        is set, by the mailbox watcher or by the process exiting) returns a reason."""
        argv = list(self.argv)
        stdin_data = None
        if self.prompt_mode is PromptMode.STDIN:
            stdin_data = inv.prompt.encode()
        elif self.prompt_mode is PromptMode.ARG:
            argv.append(inv.prompt)
        else:
            argv.append(inv.log_base + ".prompt.md")  # the engine keeps every prompt there
        started = time.monotonic()
        wakeup = wakeup or threading.Event()
        # private (0600) and never through a symlink planted at these predictable names
        with open(open_private(inv.log_base + ".stdout"), "wb") as out, \
                open(open_private(inv.log_base + ".stderr"), "wb") as err:
            try:
                proc = subprocess.Popen(
                    argv, cwd=inv.cwd, env=inv.env, stdout=out, stderr=err,
                    stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                    start_new_session=True, preexec_fn=_die_with_parent)
            except OSError as e:
                err.write(f"ralph: cannot start {argv[0]}: {e.strerror}\n".encode())
                return Outcome(exit_code=127)
            exited = threading.Event()
            if stdin_data is not None:
                threading.Thread(target=_feed, args=(proc, stdin_data), daemon=True).start()

            def reap():
                proc.wait()
                exited.set()
                wakeup.set()
            threading.Thread(target=reap, daemon=True).start()
            outcome = Outcome(exit_code=None)
            deadline = started + inv.timeout
            try:
                while not exited.is_set():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        outcome.timed_out = True
                        break
                    wakeup.wait(remaining)
                    wakeup.clear()
                    if not exited.is_set() and should_stop is not None:
                        outcome.stopped = should_stop()
                        if outcome.stopped:
                            break
            finally:  # also on ^C / SIGTERM: never leave the agent running
                if not exited.is_set():
                    _kill_group(proc, exited)
            outcome.exit_code = proc.wait()
        outcome.duration = time.monotonic() - started
        try:
            outcome.stdout = read_nofollow(inv.log_base + ".stdout").decode("utf-8",
                                                                             errors="replace")
        except OSError:   # replaced meanwhile (by a symlink, say): not read
            outcome.stdout = ""
        return outcome


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _kill_group(proc: subprocess.Popen, exited: threading.Event) -> None:
    """SIGTERM the agent's process group (it may save partial work), SIGKILL after a grace."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if grace is not None and exited.wait(grace):
            # the leader is gone; make sure nothing it started lives on
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return


def demo_argv(script: str | None) -> list[str]:
    argv = [sys.executable, "-m", "engine.demo_agent"]
    return argv + ["--script", script] if script else argv


def make_agent(config: AgentConfig) -> CommandAgent:
    if config.backend is Backend.DEMO:
        return CommandAgent(demo_argv(config.script), PromptMode.STDIN)
    if config.backend is Backend.COMMAND:
        return CommandAgent(config.command, config.prompt_mode)
    argv, mode = PRESETS[config.backend]
    return CommandAgent(argv + list(config.command), mode)


def installed_backend() -> Backend | None:
    """`--agent auto`: the first preset whose program is on the PATH."""
    for backend, (argv, _mode) in PRESETS.items():
        if shutil.which(argv[0]):
            return backend
    return None
