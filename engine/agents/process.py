"""An agent run as a process: started, watched, and stopped whole.

The engine reads what an agent *said* from the event bus; this only runs the process:
the prompt on stdin, as an argument or as a file (open at a number: `/dev/fd/N`; no
session id is ever in a run's command line, which any local user reads), stdout/stderr
kept in the iteration's logs/ and read back bounded (session_store/_runlog.py), a
timeout, and a stop request (PAUSE/ABORT) honoured at once. When the run is
over, for whatever reason, its end is announced first (the engine then takes no more
events from it), and then every process it started is stopped (containment). The agent
runs under the run's supervisor (engine/running/supervisor.py), which tells its exit code and
stops the run itself should the engine die first.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable


from ralph.session_store import keep_bounded, open_beneath

from ..running import containment, procfs, supervisor
from ..config import PromptMode
from ..running.sandbox import Sandbox
from .preset import (ARG_LIMIT, PROMPT_FILE, ApprovalHook, McpServer, Preset, QuotaSeen, RunEnd,
                     RunReport, RunSetup, UsageLimit)


@dataclass(slots=True)
class Invocation:
    role: str
    prompt: str
    env: dict[str, str]        # carries the run's marks (containment.RUN_MARK, SESSION_MARK)
    cwd: str
    log_base: str          # <work area>/iterations/<N>/logs/<seq>-<role>[-<task>]: .prompt.md...
    timeout: float
    ask_timeout: float = 600.0               # how long a human question may block a tool
    ended: Callable[[], None] = lambda: None  # the run is over: no event of it is taken
    mcp: McpServer | None = None             # ralph's MCP server, where the CLI takes it
    conversation: str | None = None          # the CLI's conversation to continue (resumes)
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)   # the engine's clock
    in_worktree: bool = False    # cwd is a parallel batch's worktree, not the workspace
    approve: ApprovalHook | None = None      # the CLI's pre-tool hook asks ralph (presets)
    sandbox: Sandbox | None = None           # what the run can reach (None: unconfined)
    read_only: tuple[str, ...] = ()          # inside what it writes: what it may only read
    writable: tuple[str, ...] = ()           # and inside those, what it writes after all


@dataclass(slots=True)
class Outcome:
    exit_code: int | None
    timed_out: bool = False
    stopped: str | None = None     # why the engine stopped it (PAUSE, ABORT), if it did
    stdout: str = ""
    duration: float = 0.0
    report: RunReport = field(default_factory=RunReport)
    stderr_tail: str = ""          # its last stderr line (a failing CLI says why there)
    left_behind: int = 0           # processes still running when it ended, then stopped
    limit: UsageLimit | None = None   # it ended on its CLI's usage or rate limit
    conversation: str | None = None   # the CLI's id of its conversation (to continue it)
    quota: tuple[QuotaSeen, ...] = ()  # its usage windows, as its CLI told them


class CommandAgent:
    """Runs a preset's program (or any command) for one role invocation."""

    def __init__(self, preset: Preset, extra_args: list[str] | None = None):
        self.preset = preset
        self.extra_args = list(extra_args or [])

    def run(self, inv: Invocation, wakeup: threading.Event | None = None,
            should_stop=None) -> Outcome:
        """Run to the end, the timeout, or until `should_stop()` (asked whenever `wakeup`
        is set, by the mailbox watcher or by the process exiting) returns a reason."""
        work_dir = inv.env[containment.SESSION_MARK]
        setup = RunSetup(log_base=inv.log_base, work_dir=work_dir,
                         ask_timeout_seconds=inv.ask_timeout,
                         mcp=inv.mcp if self.preset.supports_mcp else None,
                         conversation=inv.conversation if self.preset.resumes else None,
                         tree=inv.cwd if inv.in_worktree else None,
                         approve=inv.approve)
        argv = self.preset.argv(self.extra_args, setup)
        stdin_data = None
        mode = self.preset.prompt_mode
        if mode is PromptMode.STDIN:
            stdin_data = inv.prompt.encode()
        elif mode is PromptMode.ARG and len(inv.prompt.encode()) <= ARG_LIMIT and \
                inv.env.get("RALPH_SESSION_ID", "\0") not in inv.prompt:
            argv.append(inv.prompt)
        elif mode is PromptMode.ARG:   # too long for one argument, or it names the session
            # (a path in an event): point to its file (any local user reads a command line)
            argv.append(f"Your instructions are in the file ${PROMPT_FILE} names (an "
                        f"environment variable): read all of it and follow it.")
        env = {**inv.env, **self.preset.env(setup), PROMPT_FILE: inv.log_base + ".prompt.md"}
        for name in self.preset.unset(setup):
            env.pop(name, None)
        confine = None
        if inv.sandbox is not None:
            sandbox = inv.sandbox

            def confine(command: list[str]) -> list[str]:
                return sandbox.wrap(command, env, tree=inv.cwd, work_dir=work_dir,
                                    cli=self.preset.name, read_only=inv.read_only,
                                    also_writable=inv.writable,
                                    chdir=supervisor.HOME)
        started = time.monotonic()
        wakeup = wakeup or threading.Event()
        # private (0600) and never through a link planted at these predictable names, or in
        # place of a directory above them (the work area is the agents'); readable: read
        # back bounded, from the very files the run wrote
        with open(open_beneath(work_dir, inv.log_base + ".stdout", True), "r+b") as out, \
                open(open_beneath(work_dir, inv.log_base + ".stderr", True), "r+b") as err:
            before = frozenset(containment.children())   # not the run's: kept out of it
            exited = threading.Event()

            def agent_exited():
                exited.set()
                wakeup.set()
            passed = None
            if mode is PromptMode.FILE:   # a file of its own, open at a number: the path of
                # the one the engine keeps holds the session's id, and any user reads argv
                passed = _prompt_file(inv.prompt)
                argv.append(f"/dev/fd/{passed}")
            try:
                held = _Supervised(argv, inv.cwd, env, out, err, agent_exited,
                                   stdin=subprocess.DEVNULL if stdin_data is None else
                                   subprocess.PIPE, passed=passed, confine=confine)
            except OSError as e:   # no process to be had (EAGAIN, ENOMEM)
                inv.ended()
                try:
                    err.write(f"ralph: cannot start a run: {e.strerror}\n".encode())
                except OSError:   # a full disk: the reason still reaches the pause reason
                    pass
                return Outcome(exit_code=127, stderr_tail=f"cannot start a run: {e.strerror}")
            proc = held.proc
            if stdin_data is not None:
                threading.Thread(target=_feed, args=(proc, stdin_data), daemon=True).start()
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
            finally:  # also on ^C / SIGTERM: nothing of the run lives on
                try:
                    inv.ended()
                finally:   # even when closing the run failed (a planted bus, a bad disk)
                    session_dir = inv.env.get(containment.SESSION_MARK, "")
                    run = inv.env.get(containment.RUN_MARK)
                    leader_ran = not exited.is_set()   # then it is among those stopped
                    # the supervisor apart: it stays, to stop the run should the engine die
                    left = containment.stop(lambda: containment.find(
                        session_dir, run, proc.pid, before) - held.wrappers())
                    outcome.left_behind = max(0, left - leader_ran)
                    containment.reap_orphans(proc.pid)
                    outcome.exit_code = held.release()
            outcome.duration = time.monotonic() - started
            outcome.stdout = _bounded(work_dir, inv.log_base + ".stdout", out)
            stderr = _bounded(work_dir, inv.log_base + ".stderr", err)
        outcome.stderr_tail = _last_line(stderr)
        outcome.report = self.preset.report(outcome.stdout)
        end = RunEnd(outcome.stdout, stderr, outcome.exit_code, inv.now())
        outcome.limit = None if outcome.stopped else self.preset.limit(end)
        outcome.quota = self.preset.quota(end)
        outcome.conversation = self.preset.conversation(end) if self.preset.resumes else None
        return outcome


class _Supervised:
    """The agent under its run's supervisor, as the engine holds it: the only write end
    of the supervisor's lifeline, and the agent's exit code it tells."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], out, err,
                 agent_exited: Callable[[], None], stdin, passed: int | None = None,
                 confine: Callable[[list[str]], list[str]] | None = None):
        lifeline, self._lifeline = os.pipe()
        self._status, told = os.pipe()
        command = supervisor.command(lifeline, told, passed, argv)
        try:
            self.proc = subprocess.Popen(
                confine(command) if confine else command, cwd=supervisor.HOME,
                env={**env, supervisor.CWD: cwd}, stdin=stdin, stdout=out, stderr=err,
                start_new_session=True,
                pass_fds=(lifeline, told, *(() if passed is None else (passed,))))
        except OSError:
            os.close(self._lifeline)
            os.close(self._status)
            raise
        finally:
            os.close(lifeline)
            os.close(told)
            if passed is not None:
                os.close(passed)
        self._code: int | None = None
        self._reader = threading.Thread(target=self._read_status, args=(agent_exited,),
                                        daemon=True)
        self._reader.start()

    def _read_status(self, agent_exited: Callable[[], None]) -> None:
        """The agent's exit code, when it exits; end of file first: the supervisor died
        (killed), and the agent with it (PR_SET_PDEATHSIG)."""
        with open(self._status, "rb") as status:
            line = status.readline().strip()
        if line.lstrip(b"-").isdigit():
            self._code = int(line)
        agent_exited()

    def wrappers(self) -> set[int]:
        """The supervisor, and the sandbox it runs in: stopped by `release`, the run's
        processes before them."""
        found, pid = set(), self.proc.pid
        while pid and procfs.comm(pid) in (containment.SANDBOX_NAME,
                                           containment.SUPERVISOR_NAME):
            found.add(pid)
            pid = next((child for child, parent in procfs.live_parents().items()
                        if parent == pid), 0)
        return found | {self.proc.pid}

    def release(self) -> int:
        """The run is stopped: let the supervisor go (stopped too if it does not: an agent
        may have SIGSTOPped it). The agent's exit code, or the supervisor's own if it
        could not tell (killed: -9)."""
        os.close(self._lifeline)
        try:
            self.proc.wait(timeout=containment.GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            containment.stop(lambda: {self.proc.pid})
            self.proc.wait()
        self._reader.join()
        return self.proc.returncode if self._code is None else self._code


def _bounded(work_dir: str, path: str, log) -> str:
    """A run's log as the presets read it: its head and its tail (MAX_LOG_BYTES at most),
    kept so on disk too."""
    log.flush()
    return keep_bounded(work_dir, path, log.fileno()).decode("utf-8", errors="replace")


def _prompt_file(prompt: str) -> int:
    """The prompt in an anonymous file (no path: nothing to plant a link at), read from
    its start."""
    fd = os.memfd_create("ralph-prompt.md", os.MFD_CLOEXEC)
    view = memoryview(prompt.encode())
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
