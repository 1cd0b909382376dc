"""The supervisor of one agent run: between the engine and the agent's CLI, so that no
process of the run outlives its engine.

    RALPH_RUN_CWD=CWD python -m engine.running.supervisor LIFELINE_FD STATUS_FD PASS_FD \
        -- AGENT_ARGV...

It names itself `ralph-run` (what `containment.agent_run_of` looks for among a process's
ancestors), becomes the child subreaper of the run (a command started with `setsid` or
double-forked is reparented to it, not to init), and starts the agent in CWD with its own
stdin, stdout, stderr and environment (the run's marks), and PASS_FD open at its number
(the prompt, in `prompt_mode: file`; `-`: none). CWD comes in the environment, not the
command line (a lane's worktree path holds the session's id, and any local user reads a
command line), and leaves it before the agent starts. It writes the agent's exit code
(a subprocess returncode: -N for signal N) on STATUS_FD as one line when the agent exits,
and keeps reaping what the run leaves until the engine lets it go: the engine holds the
only write end of LIFELINE_FD, so end of file there means the engine is gone, at once,
whether it closed it after stopping the run itself or died (`kill -9`, the OOM killer).
Then, or on SIGTERM/SIGINT/SIGHUP, it stops every process of the run with the grace
period (containment.stop) and exits with the agent's code (128+N for signal N).

Stdlib only, and nothing of the engine but containment: it starts with every run.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

from . import containment

USAGE = "usage: RALPH_RUN_CWD=CWD python -m engine.running.supervisor LIFELINE_FD STATUS_FD " \
        "PASS_FD -- AGENT_ARGV..."
CWD = "RALPH_RUN_CWD"
_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1
_STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def command(lifeline: int, status: int, passed: int | None, argv: list[str]) -> list[str]:
    """The supervisor's command line for an agent run (start it in `HOME`, with the
    agent's directory as CWD in its environment)."""
    return [sys.executable, "-E", "-S", "-m", "engine.running.supervisor", str(lifeline),
            str(status), "-" if passed is None else str(passed), "--", *argv]


# where the supervisor starts: `-m` puts the current directory first on sys.path (this
# engine's own, not the workspace, where an agent may plant an `engine/` package); no
# site-packages (-S) nor PYTHON* variables (-E) are needed there
HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _die_with_supervisor() -> None:
    """In the agent, between fork and exec: SIGKILL when the supervisor dies (killed
    itself, it cannot stop the run; what the agent started is then the engine's)."""
    containment.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Run:
    """One run, supervised: the agent started, its exit told, the run stopped at the end."""

    def __init__(self, lifeline: int, status: int, cwd: str, argv: list[str],
                 passed: int | None = None):
        self.lifeline, self.status, self.cwd, self.argv = lifeline, status, cwd, argv
        self.passed = passed
        self.agent: subprocess.Popen | None = None   # kept: a Popen collected reaps
        self.code: int | None = None       # the agent's returncode, once it exited
        self.stop_why: str | None = None

    def supervise(self) -> int:
        containment.prctl(_PR_SET_NAME, containment.SUPERVISOR_NAME.encode())
        containment.adopt_orphans()
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, *_STOPPING):
            signal.signal(sig, self._signalled)
        self._start()
        while self.stop_why is None:
            ready, _, _ = select.select([self.lifeline, wake_r], [], [])
            if wake_r in ready:
                _drain(wake_r)   # the signals themselves were handled by _signalled
            self._reap()
            if self.lifeline in ready and not os.read(self.lifeline, 512):
                self.stop_why = "its engine is gone"
        self._stop_the_run()
        if self.code is None:
            return 127
        return self.code if self.code >= 0 else 128 - self.code

    def _signalled(self, signum, _frame) -> None:
        if signum != signal.SIGCHLD and self.stop_why is None:
            self.stop_why = f"told to stop ({signal.Signals(signum).name})"

    def _start(self) -> None:
        try:
            self.agent = subprocess.Popen(self.argv, cwd=self.cwd, start_new_session=True,
                                          preexec_fn=_die_with_supervisor,
                                          pass_fds=() if self.passed is None else (self.passed,))
        except OSError as e:
            missing = " (not installed?)" if isinstance(e, FileNotFoundError) else ""
            _say(f"ralph: cannot start {self.argv[0]}: {e.strerror}{missing}")
            self._report(127)
        finally:   # the prompt on stdin is the agent's: the engine sees it go unread
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            if self.passed is not None:   # the agent's alone, as its stdin
                os.close(self.passed)

    def _reap(self) -> None:
        """Collect every child that ended: the agent, and orphans of the run adopted."""
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.agent is not None and pid == self.agent.pid:
                self.agent.returncode = os.waitstatus_to_exitcode(wait_status)
                self._report(self.agent.returncode)

    def _report(self, code: int) -> None:
        self.code = code
        try:
            os.write(self.status, f"{code}\n".encode())
            os.close(self.status)
        except OSError:   # the engine is gone: nobody asks
            pass

    def _stop_the_run(self) -> None:
        session_dir = os.environ.get(containment.SESSION_MARK, "")
        run = os.environ.get(containment.RUN_MARK)
        # the run's tree is this process's (the agent itself may be gone, its pid reused)
        # not its parent: in a sandbox that is bubblewrap, the PID namespace's init, which
        # nothing inside may signal (it ends, the namespace with it, once this exits)
        stopped = containment.stop(lambda: containment.find(session_dir, run, os.getpid())
                                   - {os.getppid()})
        if stopped:
            _say(f"ralph: stopped {stopped} process(es) of run {run}: {self.stop_why}")
        self._reap()


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _say(line: str) -> None:
    """One line to the run's stderr log."""
    try:
        os.write(2, (line + "\n").encode(errors="replace"))
    except OSError:
        pass


def main(argv: list[str]) -> int:
    try:
        lifeline, status, passed, dashes, *agent = argv
        cwd = os.environ.pop(CWD)
        if dashes != "--" or not agent:
            raise ValueError
        run = Run(int(lifeline), int(status), cwd, agent, None if passed == "-" else int(passed))
        for fd in (run.lifeline, run.status, *(() if run.passed is None else (run.passed,))):
            os.fstat(fd)
    except (ValueError, KeyError):
        print(USAGE, file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{USAGE} (file descriptor: {e.strerror})", file=sys.stderr)
        return 2
    return run.supervise()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
