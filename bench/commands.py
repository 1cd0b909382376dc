"""Bench 11: the commands agents and people run often, cold, against the bare interpreter.

Each command is a fresh subprocess, interleaved round by round with `python -c pass` so
that the machine's drift hits all alike; the figure is the median wall time. `ralph mcp`
is timed from its start to the answer of its first tool call (initialize, then `emit`),
spoken as raw JSON-RPC over its pipes, so the measuring side loads no MCP SDK. The agents'
tools run with the environment of an agent run that a real engine holds open (HeldRun):
they speak to that engine, through the work area's outbox, as that run.

Aims (issues 16, 14, 23): `tools signals poll` and `tools interact progress` <= 1.5x the
bare interpreter; the typed commands, which read the store's attrs classes through cattrs
(`signal`, `session answer`, `session status`, `session list`, with 100 sessions too and
flat in the count) <= 4x; `ralph mcp` measured (it starts for every run).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _common import HeldRun, Row, median, ms, now, ralph_script, ratio, say, timed_run

AIMS = {"poll": 1.5, "poll_taking": 1.5, "progress": 1.5, "signal": 4.0, "answer": 4.0,
        "status": 4.0, "list1": 4.0, "list100": 4.0}


def _mcp_first_call(argv: list[str], env: dict, cwd: str) -> float:
    """Seconds from start to the response of the first tools/call."""
    started = time.perf_counter()   # the emit needs its run open: the bench holds it
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        return _first_call(proc, started)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _first_call(proc: subprocess.Popen, started: float) -> float:
    def send(message: dict) -> None:
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def reply(wanted: int) -> dict:
        for line in proc.stdout:
            message = json.loads(line)
            if message.get("id") == wanted:
                return message
        raise RuntimeError("ralph mcp closed its output")

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"}}})
    reply(1)
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "emit", "arguments": {"topic": "bench.mcp", "payload": "x"}}})
    answer = reply(2)
    elapsed = time.perf_counter() - started
    proc.stdin.close()
    proc.wait(timeout=10)
    if answer.get("result", {}).get("isError") or "error" in answer:
        raise RuntimeError(f"ralph mcp: first call failed: {answer}")
    return elapsed


def run(base: str, runs: int = 20, warmup: int = 2) -> list[Row]:
    from ralph import session_store
    from ralph.session_store import questions

    py = sys.executable
    ralph = ralph_script()
    workspace = tempfile.mkdtemp(prefix="ralph-bench-commands-", dir=base)
    many = tempfile.mkdtemp(prefix="ralph-bench-list100-", dir=base)
    held = None
    try:
        # an agent run, opened by a live engine: the agents' tools speak as it
        held = HeldRun(workspace, "b1")
        quiet = session_store.create(workspace, "bench: no engine, questions to answer",
                                     now=now(), session_id="b2")
        for i in range(100):
            session_store.create(many, "bench: one of many", now=now(), session_id=f"m{i:03d}")
        human = {k: v for k, v in os.environ.items()   # where the sessions are, no more
                 if not k.startswith("RALPH_") or k == "RALPH_STATE_DIR"}
        human["PYTHONPYCACHEPREFIX"] = os.path.join(workspace, "pycache")
        env = dict(human, **held.env)   # the agent run's own environment
        commands = {
            "base": ([py, "-c", "pass"], env, workspace),
            # the INFO `signal` dropped into b1 last round waits for it: the engine takes
            # it for the run, and replies
            "poll_taking": ([ralph, "tools", "signals", "poll"], env, workspace),
            "poll": ([ralph, "tools", "signals", "poll"], env, workspace),   # nothing now
            "progress": ([ralph, "tools", "interact", "progress", "half way"], env, workspace),
            "signal": ([ralph, "signal", "info", "a note", "--session", "b1"], human, workspace),
            "answer": None,   # a fresh question each round (below)
            "status": ([ralph, "session", "status", "b1"], human, workspace),
            "list1": ([ralph, "session", "list"], human, workspace),
            "list100": ([ralph, "session", "list"], human, many),
        }
        say(f"commands: {len(commands) + 1} commands x {runs} runs (+{warmup} warm-up)")
        times: dict[str, list[float]] = {k: [] for k in [*commands, "mcp"]}
        for i in range(warmup + runs):
            qid = f"q-bench-{i:04d}"
            questions.ask(quiet.dir, questions.Question(
                id=qid, text="go on?", asked_at=now(), deadline=now(), on_timeout="continue",
                context=questions.QuestionContext(session="b2", state="PLANNING",
                                                  iteration=1)))
            commands["answer"] = ([ralph, "session", "answer", "b2", "yes", "--question", qid],
                                  human, workspace)
            for key, (argv, cmd_env, cwd) in commands.items():
                elapsed = timed_run(argv, cmd_env, cwd, "commands")
                if i >= warmup:
                    times[key].append(elapsed)
            elapsed = _mcp_first_call([ralph, "mcp"], env, workspace)
            if i >= warmup:
                times["mcp"].append(elapsed)
        held.stop()
    finally:
        if held is not None:
            held.stop()
        shutil.rmtree(workspace, ignore_errors=True)
        shutil.rmtree(many, ignore_errors=True)

    med = {k: median(v) for k, v in times.items()}
    base = med["base"]
    base_label = f"{ms(base, 1)} (python -c pass)"
    labels = {
        "poll": "`ralph tools signals poll` (in an agent run), nothing waiting",
        "poll_taking": "`ralph tools signals poll` (in an agent run), one signal to take",
        "progress": "`ralph tools interact progress` (in an agent run)",
        "signal": "`ralph signal info`",
        "answer": "`ralph session answer`",
        "status": "`ralph session status`",
        "list1": "`ralph session list`, 1 session",
        "list100": "`ralph session list`, 100 sessions",
    }
    rows = []
    for key, label in labels.items():
        aim = AIMS[key]
        if key == "poll_taking" and not times[key]:
            continue
        got = med[key] / base
        rows.append(Row("11 commands", f"{label}, median (aim <= {aim:g}x)", ms(med[key], 1),
                        base_label, ratio(med[key], base),
                        note=("meets the aim" if got <= aim else "misses the aim")
                        + f"; {runs} runs each, interleaved"))
    rows.append(Row("11 commands", "`ralph mcp`: start to the answer of its first tool call "
                    "(initialize + emit), median", ms(med["mcp"], 1), base_label,
                    ratio(med["mcp"], base),
                    note="most of it is importing the mcp SDK (pydantic, anyio); it starts "
                         "once per agent run, beside the agent CLI's own start"))
    rows.append(Row("11 commands", "`ralph session list`: 100 sessions vs 1", ms(med["list100"], 1),
                    ms(med["list1"], 1), ratio(med["list100"], med["list1"]),
                    note="flat in the count means ~1"))
    return rows
