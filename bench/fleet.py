"""Bench 12: a fleet. N sessions (50) in one workspace, each its own `ralph session start`
on the demo agent, one Telegram bot (against the test suite's loopback Bot API) serving
them all (the engines share the workspace's bot: one of them hosts it), with answers and
signals flowing:

- each session's executor asks a question after its first run (`human.interact`); the
  bench answers every question as it appears (`ralph session answer`'s store verb);
- each then stages knowledge and waits in KNOWLEDGE_APPROVAL (`approval: required`),
  where the engine handles signals as they land;
- in the measured window, INFO signals are dropped one at a time into random sessions
  and each is timed from the drop to its handling (the `processed/` file).

Figures: p50 / p99 signal latency under that load (aim: p99 <= 50 ms), RSS per engine
(VmRSS; aim <= 30 MB), and the CPU of every engine and the bot over the window. The
baseline is one session alone on the machine, measured the same way in the same run.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from _common import (Row, median, ms, now, percentile, ralph_script, say, session_dir,
                     session_env, stop_process)
from idle_cpu import cpu_seconds
from signal_latency import _wait_handled
from telegram_latency import CHAT, TOKEN

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from fake_telegram import FakeTelegram  # noqa: E402  (the test suite's Bot API)

EVIDENCE = ("tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 90, "
            "complexity: 3, duplication: pass")
PLANNED = """\
steps:
  - role: planner
    iteration: 1
    emit: [{topic: plan.ready, json: {tasks: [{id: t1, title: one task}]}}]
"""
ASKS = """\
  - role: executor
    attempt: 1
    emit: [{topic: human.interact, payload: "Tabs or spaces?"}]
"""
TO_APPROVAL = f"""\
  - role: executor
    emit: [{{topic: build.done, payload: "{EVIDENCE}"}}]
  - role: reviewer
    emit: [{{topic: review.done, payload: "tests: pass, build: pass"}}]
  - role: librarian
    write_iteration: {{knowledge/notes.md: "# notes\\n"}}
    emit: [{{topic: knowledge.staged, payload: notes.md}}]
"""
# one task built and reviewed, knowledge staged: the session then waits in
# KNOWLEDGE_APPROVAL, where its engine handles signals as they land
WAITS = PLANNED + TO_APPROVAL
SCENARIO = PLANNED + ASKS + TO_APPROVAL   # and a question answered on the way


def write_config(workspace: str, scenario: str, extra: str = "") -> str:
    """The demo agent playing `scenario`, knowledge waiting for approval, no fallback
    (plus `extra` lines of ralph.yml); returns the config's path."""
    script = os.path.join(workspace, "scenario.yaml")
    with open(script, "w", encoding="utf-8") as f:
        f.write(scenario)
    path = os.path.join(workspace, "ralph.yml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"agent: {{backend: demo, script: {script}}}\n"
                f"knowledge: {{approval: required, timeout_seconds: 3600}}\n"
                f"fallback: {{enabled: false}}\n{extra}")
    return path


def _config(workspace: str, url: str) -> str:
    return write_config(workspace, SCENARIO,
                        f"RObot:\n  enabled: true\n  timeout_seconds: 3600\n  telegram:\n"
                        f"    bot_token: '{TOKEN}'\n    api_url: '{url}'\n"
                        f"    allowed_chat_ids: [{CHAT}]\n")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fleet(base: str, sessions: int, signals_count: int) -> dict:
    workspace = tempfile.mkdtemp(prefix="ralph-bench-fleet-", dir=base)
    procs: dict[str, subprocess.Popen] = {}
    with FakeTelegram(TOKEN) as api:
        try:
            return _measure(workspace, api, procs, sessions, signals_count)
        finally:
            for proc in procs.values():
                stop_process(proc)
            shutil.rmtree(workspace, ignore_errors=True)


def _measure(workspace, api, procs, sessions: int, signals_count: int) -> dict:
    from ralph.session_store import questions, signals
    config = _config(workspace, api.url)
    env = session_env(RALPH_DEMO_SLEEP_SCALE="0", NO_PROXY="127.0.0.1")
    say(f"fleet: starting {sessions} session(s)")
    for i in range(sessions):
        sid = f"f{i:03d}"
        with open(os.path.join(workspace, f"{sid}.log"), "wb") as log:   # the child's now
            procs[sid] = subprocess.Popen(
                [ralph_script(), "session", "start", f"bench: fleet {i}", "-c", config,
                 "--id", sid], cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT)
    answered: set[str] = set()
    waiting: set[str] = set()
    deadline = time.monotonic() + 60 + 3 * sessions
    while len(waiting) < sessions:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fleet bench: only {len(waiting)} of {sessions} sessions "
                               f"reached KNOWLEDGE_APPROVAL")
        for sid, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"fleet bench: session {sid} exited {proc.returncode}")
            sd = session_dir(workspace, sid)
            for q in questions.pending(sd) if os.path.isdir(sd) else ():
                if q.id not in answered:
                    questions.answer(sd, q.id, "spaces", now=now(), channel="cli")
                    answered.add(q.id)
            if sid not in waiting:
                with open(os.path.join(workspace, f"{sid}.log"), "rb") as f:
                    if b"waiting for `ralph signal approve`" in f.read():
                        waiting.add(sid)
        time.sleep(0.05)
    say(f"fleet: {sessions} session(s) wait in KNOWLEDGE_APPROVAL; {signals_count} signals")
    pids = [p.pid for p in procs.values()]
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    started = time.perf_counter()
    rng = random.Random(7)
    latencies = []
    for i in range(signals_count):
        time.sleep(rng.uniform(0, 0.05))
        sid = rng.choice(list(procs))
        sd = session_dir(workspace, sid)
        t0 = time.perf_counter()
        name = signals.drop(sd, "INFO", f"fleet probe {i}", now=now())
        latencies.append(_wait_handled(os.path.join(sd, "signals", "processed", name),
                                       procs[sid]) - t0)
    window = time.perf_counter() - started
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
    rss = {pid: _rss_mb(pid) for pid in pids}
    host_rss = rss.pop(_bot_host(workspace), None)   # the bot's libraries are the host's
    for sid in procs:
        signals.drop(session_dir(workspace, sid), "ABORT", "fleet bench done", now=now())
    for sid, proc in procs.items():
        if proc.wait(timeout=60) != 4:
            raise RuntimeError(f"fleet bench: {sid} exited {proc.returncode} after ABORT")
    return {"lat": latencies, "rss": list(rss.values()), "host_rss": host_rss, "cpu": cpu,
            "window": window, "answered": len(answered)}


def _bot_host(workspace: str) -> int | None:
    """The pid of the engine hosting the workspace's Telegram bot (it holds the lock)."""
    from ralph.engine.channels.telegram.host import CHANNEL
    from ralph.session_store import open_channel
    holder = open_channel(workspace, CHANNEL).lock_holder().split()
    return int(holder[0]) if holder and holder[0].isdigit() else None


def run(base: str, sessions: int = 50, signals_count: int = 200) -> list[Row]:
    alone = fleet(base, 1, max(20, signals_count // 5))
    many = fleet(base, sessions, signals_count)
    p99, p50 = percentile(many["lat"], 99), median(many["lat"])
    a99, a50 = percentile(alone["lat"], 99), median(alone["lat"])
    host_rss, others = many["host_rss"], many["rss"]   # others: the engines without the bot
    worst = max(others)
    return [
        Row("12 fleet", f"signal drop -> handled with {sessions} sessions and their bot running, "
                        f"p50 / p99 (aim p99 <= 50 ms)", f"{ms(p50, 1)} / {ms(p99, 1)}",
            f"one session alone: {ms(a50, 1)} / {ms(a99, 1)}",
            f"{p99 / a99:.2f} (p99)" if a99 else "n/a",
            note=("meets the aim" if p99 <= 0.050 else "misses the aim")
                 + f"; {len(many['lat'])} signals into random sessions; "
                   f"{many['answered']} questions answered on the way"),
        Row("12 fleet", "RSS per engine, median / max of the engines not hosting the bot "
                        "(aim <= 30 MB)",
            f"{median(others):.1f} / {worst:.1f} MB",
            f"one engine alone (hosting the bot): {alone['host_rss']:.1f} MB",
            f"{worst / alone['host_rss']:.2f}",
            note=("meets the aim" if worst <= 30 else "misses the aim")
                 + (f"; the engine hosting the bot: {host_rss:.1f} MB (python-telegram-bot "
                    f"and its HTTP stack)" if host_rss is not None else "")),
        Row("12 fleet", f"CPU of {sessions} engines (one hosting the bot) over the signal window",
            f"{many['cpu']:.2f} s in {many['window']:.1f} s "
            f"({100 * many['cpu'] / many['window']:.1f} % of a core)",
            f"one engine: {alone['cpu']:.2f} s in {alone['window']:.1f} s", "",
            note="waiting engines cost only the signals they handle"),
    ]
