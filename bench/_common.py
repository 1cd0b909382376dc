"""Shared helpers for the benchmarks: where to work, statistics, the result rows."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone


@dataclass(slots=True)
class Row:
    """One line of the final table. `ratio` is always value / baseline."""
    bench: str
    figure: str
    value: str
    baseline: str = ""
    ratio: str = ""
    note: str = ""


def now() -> datetime:
    return datetime.now(timezone.utc)


def percentile(values: list[float], p: float) -> float:
    """Linear-interpolated percentile, p in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return percentile(values, 50)


def ms(seconds: float, digits: int = 2) -> str:
    return f"{seconds * 1000:.{digits}f} ms"


def ratio(value: float, baseline: float, digits: int = 2) -> str:
    if not baseline:
        return "n/a"
    return f"{value / baseline:.{digits}f}"


def timed_run(argv: list[str], env: dict, cwd: str, what: str,
              stdin: bytes | None = None) -> float:
    """Wall seconds of one command run to its end; a failing one stops the bench."""
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, input=stdin)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{what} bench: {' '.join(argv)} exited {proc.returncode}: "
                           f"{proc.stderr.decode()[-500:]}")
    return elapsed


def ralph_script() -> str:
    """The `ralph` console script of the interpreter running the bench."""
    for d in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        path = os.path.join(d, "ralph")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which("ralph")
    if found:
        return found
    raise SystemExit("bench: cannot find the `ralph` console script next to "
                     f"{sys.executable}; run `pip install -e .` in this interpreter")


def default_base_dir() -> str:
    """A tmpfs when there is one (/dev/shm): the benches measure the engine, not the disk."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and fs_type(shm) == "tmpfs":
        return shm
    return tempfile.gettempdir()


def fs_type(path: str) -> str:
    """The file-system type of the mount holding `path` (Linux /proc/mounts), or '?'."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) \
                        and len(mount) > len(best):
                    best, kind = mount, parts[2]
    except OSError:
        pass
    return kind


def git_revision(repo: str) -> str:
    try:
        rev = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return (rev or "?") + ("+dirty" if dirty else "")


def durable_write_cost(base: str, n: int = 200) -> float:
    """Seconds for one session_store write_atomic (write, fsync, rename, fsync dir) here."""
    import time

    from ralph.session_store import write_atomic
    d = tempfile.mkdtemp(prefix="ralph-bench-fsync-", dir=base)
    try:
        start = time.perf_counter()
        for i in range(n):
            write_atomic(os.path.join(d, f"f{i % 10}"), b"x" * 512, "bench")
        return (time.perf_counter() - start) / n
    finally:
        shutil.rmtree(d, ignore_errors=True)


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


# --- engines run as subprocesses ---

def session_env(**extra: str) -> dict:
    """The environment for a `ralph` subprocess: no test hooks, no session of the caller's."""
    env = dict(os.environ, **extra)
    for k in [k for k in env if k.startswith(("RALPH_TEST_", "RALPH_SESSION"))]:
        del env[k]
    return env


def wait_for_text(log: str, text: str, proc: subprocess.Popen, timeout: float,
                  what: str = "bench") -> None:
    """Wait until `text` is in the file `log` (a subprocess's output)."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        with open(log, encoding="utf-8", errors="replace") as f:
            content = f.read()
        if text in content:
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what}: the session never reached {text!r} (exit "
                               f"{proc.poll()}); its output:\n{content[-2000:]}")
        time.sleep(0.02)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM a subprocess we started (SIGKILL after 5 s), and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def config_snapshot() -> dict[str, str]:
    """The `files` for session_store.create that `ralph session resume` needs: the
    snapshot of the config the session started with (here the defaults)."""
    from ralph.engine import config as cfg
    from ralph.session_store import dump_yaml
    return dump_yaml(cfg.to_data(cfg.without_secrets(cfg.Config())))


# --- where the store keeps a session (see session_store/_places.py) ---

def session_dir(workspace: str, session_id: str) -> str:
    """A session's control plane (metadata, bus, signals, questions), known before a
    `ralph session start` subprocess has made it."""
    from ralph.session_store import sessions_root
    return os.path.join(sessions_root(workspace), session_id)


def bus_path(session_dir_: str) -> str:
    """The session's bus (events.jsonl), for the benches that fill or size it whole."""
    from ralph.session_store._events import EVENTS_FILE
    return os.path.join(session_dir_, EVENTS_FILE)


def run_logs(workspace: str, session_id: str, iteration: int) -> str | None:
    """The folder of an iteration's agent-run logs (in the session's work area), None
    while the session is not made yet."""
    from ralph.session_store import BadInput, load
    try:
        return load(workspace, session_id).iteration(iteration).logs
    except BadInput:
        return None


HELD_AGENT = """\
import json, os, sys, time
sys.stdin.read()
path = os.path.join(os.environ["RALPH_WORKSPACE"], f"held-{os.environ['RALPH_SESSION_ID']}.json")
with open(path + ".tmp", "w") as f:
    json.dump({k: v for k, v in os.environ.items() if k.startswith("RALPH_")}, f)
os.replace(path + ".tmp", path)
time.sleep(86400)
"""


class HeldRun:
    """A real engine (`ralph session start`, a subprocess) holding an agent run open: its
    agent writes the run's RALPH_* environment down and sleeps. A command run with `env`
    speaks as that run (an agent's tool) to a live engine, as the agents' tools only can;
    `stop()` ends the session with an ABORT (exit 4). `config`: more of its ralph.yml."""

    def __init__(self, workspace: str, session_id: str, config: str = "",
                 timeout: float = 120.0):
        import json
        agent = os.path.join(workspace, "held-agent.py")
        with open(agent, "w", encoding="utf-8") as f:
            f.write(HELD_AGENT)
        path = os.path.join(workspace, f"{session_id}.yml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"agent: {{backend: command, command: {json.dumps([sys.executable, agent])}, "
                    f"timeout_seconds: 86400}}\nfallback: {{enabled: false}}\n{config}")
        self.dir = session_dir(workspace, session_id)
        self.log = os.path.join(workspace, f"{session_id}.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [ralph_script(), "session", "start", f"bench: {session_id}", "-c", path,
                 "--id", session_id], cwd=workspace, env=session_env(), stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        held = os.path.join(workspace, f"held-{session_id}.json")
        deadline = time.monotonic() + timeout
        while not os.path.exists(held):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.log, encoding="utf-8", errors="replace") as f:
                    output = f.read()[-2000:]
                stop_process(self.proc)
                raise RuntimeError(f"bench: no agent run held in {session_id} (exit "
                                   f"{self.proc.poll()}); its output:\n{output}")
            time.sleep(0.01)
        with open(held, encoding="utf-8") as f:
            self.env: dict[str, str] = json.load(f)

    def stop(self) -> None:
        """ABORT the session (its agent is stopped) and check that it ended so (exit 4)."""
        from ralph.session_store import signals
        if self.proc.poll() is None and os.path.isdir(self.dir):
            signals.drop(self.dir, "ABORT", "bench done", now=now())
            try:
                code = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
            stop_process(self.proc)
            if code != 4:
                raise RuntimeError(f"bench: the held session exited {code} after ABORT, "
                                   f"expected 4")
        stop_process(self.proc)
