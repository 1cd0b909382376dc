"""Bench 7: CPU used by an engine blocked on an unanswered question.

`ralph session start` (demo agent) whose executor emits `human.interact` at once; nobody
answers (RObot.timeout_seconds is far away), so the engine holds. Once its question file
exists and a second has passed (the agent has exited, the engine waits), the bench reads
the engine's utime + stime (/proc/<pid>/stat, every thread) and its threads' context
switches (/proc/<pid>/task/*/status: each is a wakeup), waits D seconds (60; --quick 10),
and reads them again. Before the window, `ralph session status` runs once for each
session, as a human checking on it would (it reads questions/, writes nothing).

Measured over the same window, side by side: the baseline, a `python -c "import time;
time.sleep(...)"` process (the floor: a process that does nothing), and for context the
same engine whose hold polls every 250 ms (_answer_poller.py), and a session whose
executor blocks inside its own run in `ralph tools interact ask` (the demo agent's `ask`
step: the agent process, which waits for the engine's reply in its work area's inbox, and
the engine, which asked the question and watches questions/ for its answer), and an
engine whose agent is at work (it sleeps) while an INFO signal waits in inputs/ for the
next prompt. An ABORT ends the sessions afterwards.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from _common import (Row, now, ralph_script, ratio, run_logs, say, session_dir, session_env,
                     stop_process)
from answer_latency import POLL_INTERVAL, next_question, start_session, write_config
from overhead import EVIDENCE

AGENT_AT_WORK = """\
steps:
  - role: planner
    emit:
      - topic: plan.ready
        json: {tasks: [{id: t1, title: "task 1", batch: 1}]}
  - role: executor
    sleep: %d
"""
IN_RUN_ASK = """\
steps:
  - role: planner
    emit:
      - topic: plan.ready
        json: {tasks: [{id: t1, title: "task 1", batch: 1}]}
  - role: executor
    ask: {question: "Which way?", timeout: %d, default: "left"}
    emit:
      - {topic: build.done, payload: "%s"}
"""

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK   # fields 14 and 15 of stat(5)


def switches(pid: int) -> tuple[int, int]:
    """(context switches summed over the process's threads, thread count)."""
    total = threads = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
            threads += 1
        except FileNotFoundError:   # a thread that ended meanwhile
            continue
    return total, threads


class Pid:
    """A process we did not start ourselves (the engine's agent): only its pid is used."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self):
        return None if os.path.exists(f"/proc/{self.pid}") else 0


def child_of(pid: int, timeout: float = 10.0) -> Pid:
    """The (one) child process of `pid`, from /proc/*/stat."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                return Pid(int(entry))
        time.sleep(0.05)
    raise RuntimeError(f"idle bench: no child of {pid} found")


def _wait_agent_running(workspace: str, session_id: str, proc: subprocess.Popen, log: str,
                        timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ((logs := run_logs(workspace, session_id, 1)) and os.path.isdir(logs) and any(
            n.endswith("-executor-t1.stdout") for n in os.listdir(logs))):
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(log, encoding="utf-8", errors="replace") as f:
                output = f.read()[-2000:]
            raise RuntimeError(f"idle bench: the executor never started (exit {proc.poll()}); "
                               f"the session's output:\n{output}")
        time.sleep(0.02)


def run(base: str, seconds: float = 60.0, settle: float = 1.0) -> list[Row]:
    from ralph.session_store import signals
    workspace = tempfile.mkdtemp(prefix="ralph-bench-idle-", dir=base)
    procs: dict[str, subprocess.Popen | Pid] = {}
    far = seconds + 3600
    try:
        sessions = {   # label: (config, poll interval of the hold, or None for the engine's)
            "engine": (write_config(workspace, tasks=1, asks=1, timeout=far), None),
            "poller": (write_config(workspace, tasks=1, asks=1, timeout=far), POLL_INTERVAL),
            "in_run": (write_config(workspace, 0, 0, timeout=far, name="in-run",
                                    steps=IN_RUN_ASK % (far, EVIDENCE)), None),
            "running": (write_config(workspace, 0, 0, timeout=far, name="running",
                                     steps=AGENT_AT_WORK % far), None),
        }
        dirs = {label: session_dir(workspace, label) for label in sessions}
        logs = {label: os.path.join(workspace, f"{label}.log") for label in sessions}
        for label, (config, poll) in sessions.items():
            procs[label] = start_session(workspace, config, label, poll, logs[label])
        for label in ("engine", "poller", "in_run"):
            next_question(dirs[label], set(), procs[label], logs[label], timeout=120)
        _wait_agent_running(workspace, "running", procs["running"], logs["running"])
        signals.drop(dirs["running"], "INFO", "a note for the next prompt", now=now())
        # the engine's child is the run's supervisor; the agent is the supervisor's child
        procs["agent"] = child_of(child_of(procs["in_run"].pid).pid)
        procs["sleep"] = subprocess.Popen(
            [sys.executable, "-c", f"import time; time.sleep({seconds + 30})"],
            stdin=subprocess.DEVNULL)
        time.sleep(settle)
        for label in sessions:   # a human checking on it: reads questions/ (no write)
            subprocess.run([ralph_script(), "session", "status", label], cwd=workspace,
                           env=session_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=60,
                           check=True)
        time.sleep(settle)
        say(f"idle: measuring engines blocked on questions for {seconds:g} s")
        before = {k: (cpu_seconds(p.pid), switches(p.pid)) for k, p in procs.items()}
        start = time.perf_counter()
        time.sleep(seconds)
        window = time.perf_counter() - start
        after = {k: (cpu_seconds(p.pid), switches(p.pid)) for k, p in procs.items()}
        for label in sessions:
            if procs[label].poll() is not None:
                raise RuntimeError(f"idle bench: the {label} session exited "
                                   f"{procs[label].returncode} while it should wait")
            signals.drop(dirs[label], "ABORT", "idle bench done", now=now())
        for label in sessions:
            code = procs[label].wait(timeout=30)
            if code != 4:
                raise RuntimeError(f"idle bench: the {label} session exited {code} after "
                                   f"ABORT, expected 4")
    finally:
        for p in procs.values():
            if isinstance(p, subprocess.Popen):
                stop_process(p)
        shutil.rmtree(workspace, ignore_errors=True)

    def figures(label):
        cpu = after[label][0] - before[label][0]
        wakeups = after[label][1][0] - before[label][1][0]
        return cpu, wakeups / window, after[label][1][1]

    e_cpu, e_wake, e_threads = figures("engine")
    s_cpu, s_wake, _ = figures("sleep")
    p_cpu, p_wake, _ = figures("poller")
    a_cpu, a_wake, _ = figures("agent")
    i_cpu, i_wake, _ = figures("in_run")
    r_cpu, r_wake, _ = figures("running")

    def cell(cpu, wake):
        return f"{cpu:.2f} s CPU ({cpu / window * 100:.2f} % of a core), {wake:.1f} wakeups/s"

    resolution = 1 / TICK
    floor = cell(s_cpu, s_wake) + " (`python -c time.sleep`)"

    def vs_floor(cpu):
        return ratio(cpu, s_cpu, 1) if s_cpu else \
            f"n/a (baseline 0 at {resolution * 1000:.0f} ms resolution)"

    return [
        Row("7 idle CPU", f"engine blocked {window:.0f} s on a question (`human.interact`)",
            cell(e_cpu, e_wake), floor, vs_floor(e_cpu),
            note=f"should be near zero; {e_threads} threads; CPU from /proc/<pid>/stat "
                 f"(resolution {resolution * 1000:.0f} ms), wakeups = context switches of "
                 f"all threads; stdout is a file, so no live status line (on a terminal it "
                 f"redraws every 0.5 s); the sessions below ran side by side, over the same "
                 f"window"),
        Row("7 idle CPU", "context: the same engine holding with a 250 ms poll",
            cell(p_cpu, p_wake), floor, vs_floor(p_cpu),
            note="what a poll loop costs: 4 wakeups/s plus the reads"),
        Row("7 idle CPU", "context: an agent blocked in `ralph tools interact ask`",
            "agent " + cell(a_cpu, a_wake) + "; its engine " + cell(i_cpu, i_wake),
            floor, vs_floor(a_cpu + i_cpu),
            note="the in-run question (seed 003): the agent's process waits for the "
                 "engine's reply (its inbox), the engine on the answer and its agent"),
        Row("7 idle CPU", "context: an engine whose agent works (sleeps) while an INFO "
                          "signal waits for the next prompt",
            cell(r_cpu, r_wake), floor, vs_floor(r_cpu),
            note="while an agent runs the engine takes only PAUSE/ABORT: the INFO stays in "
                 "inputs/ until the next boundary"),
    ]
