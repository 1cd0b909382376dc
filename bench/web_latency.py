"""Bench 10: signal file to an open page's live update, against a 250 ms poller.

A real `ralph web` subprocess serves a workspace with one session (made through the store,
no engine, so nothing else touches it). A client reads the session's server-sent-event
stream (/api/sessions/<id>/stream) the way the page does. The bench drops INFO signals one
at a time (session_store.signals.drop: written aside, linked into signals/inputs/) and
times from just before the drop until the stream delivers a snapshot whose
`waiting_signals` lists it; then it takes the signal (as an engine would) and waits for
the snapshot without it. A random pause of 0-250 ms before each drop puts the drops at
random phases of the poller's cycle.

The baseline is the same server (engine.channels.web.serve, in _web_poller.py) whose feed
is woken every 250 ms by a timer instead of by the file-system watcher.

Also measured, for context: the CPU the watcher-driven server spends over 5 s with the
stream open and nothing changing (an idle server should do no work).
"""
from __future__ import annotations

import http.client
import json
import os
import queue
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from _common import Row, ms, now, percentile, ralph_script, ratio, say, session_env, \
    stop_process

HERE = os.path.dirname(os.path.abspath(__file__))
POLL_INTERVAL = 0.25
SESSION = "web-latency"


class Feed:
    """An SSE client in a thread: (arrival time, event, data) of every message, in order."""

    def __init__(self, port: int, token: str, path: str):
        self.messages: queue.Queue = queue.Queue()
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.conn.request("GET", path, headers={"Accept": "text/event-stream",
                                                "X-Ralph-Token": token})
        self.response = self.conn.getresponse()
        if self.response.status != 200:
            raise RuntimeError(f"web bench: the stream answered {self.response.status}")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        event = data = ""
        try:
            for raw in self.response.fp:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = line[6:]
                elif not line and data:
                    self.messages.put((time.perf_counter(), event, json.loads(data)))
                    event = data = ""
        except (OSError, ValueError):
            return

    def until(self, predicate, timeout: float = 15.0) -> float:
        """The arrival time of the first message for which predicate(event, data) holds."""
        deadline = time.perf_counter() + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise RuntimeError("web bench: the stream never sent the expected update")
            at, event, data = self.messages.get(timeout=left)
            if predicate(event, data):
                return at

    def close(self) -> None:
        # shut the socket first: closing the response under the reader thread would wait
        # for that thread's read to return (the next keepalive, 15 s away)
        self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def _waiting(name: str, present: bool):
    def check(event, data):
        return event == "snapshot" and (name in data["view"]["waiting_signals"]) == present
    return check


def measure(session_dir: str, feed: Feed, count: int, warmup: int,
            seed: int = 2026) -> list[float]:
    from ralph.session_store import signals
    rng = random.Random(seed)
    latencies = []
    for i in range(warmup + count):
        time.sleep(rng.uniform(0, POLL_INTERVAL))
        t0 = time.perf_counter()
        name = signals.drop(session_dir, "INFO", f"web latency probe {i}", now=now())
        t1 = feed.until(_waiting(name, True))
        if i >= warmup:
            latencies.append(t1 - t0)
        signal, _reason, _raw = signals.read(session_dir, name)
        signals.take(session_dir, name)
        signals.mark_handled(session_dir, signal, handled_by="bench", action="measured",
                             now=now())
        feed.until(_waiting(name, False))
    return latencies


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(argv: list[str], workspace: str) -> tuple[subprocess.Popen, int, str]:
    env = {k: v for k, v in session_env().items() if k != "RALPH_WEB_TOKEN"}   # it makes one
    proc = subprocess.Popen(argv, cwd=workspace, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/#token=(\S+)", line)
    if not found:
        stop_process(proc)
        raise RuntimeError(f"web bench: the server did not start: {line!r} {proc.stderr.read()}")
    return proc, int(found.group(1)), found.group(2)


def bench(base: str, server_argv, count: int, warmup: int, idle: float = 0) -> dict:
    """`server_argv(workspace)` is the command that serves it."""
    from ralph import session_store
    workspace = tempfile.mkdtemp(prefix="ralph-bench-web-", dir=base)
    try:
        session = session_store.create(workspace, "bench: web latency", now=now(),
                                       session_id=SESSION)
        proc, port, token = _serve(server_argv(workspace), workspace)
        try:
            feed = Feed(port, token, f"/api/sessions/{SESSION}/stream")
            feed.until(lambda e, d: e == "snapshot")
            latencies = measure(session.dir, feed, count, warmup)
            idle_cpu = None
            if idle:
                before = _cpu_seconds(proc.pid)
                time.sleep(idle)
                idle_cpu = _cpu_seconds(proc.pid) - before
            feed.close()
        finally:
            stop_process(proc)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return {"lat": latencies, "idle_cpu": idle_cpu}


def run(base: str, count: int = 100, warmup: int = 3) -> list[Row]:
    say(f"web: {count} signals to a session followed by an SSE client of `ralph web`")
    web = bench(base, lambda _ws: [ralph_script(), "web", "--port", "0"], count, warmup,
                idle=5.0)
    say(f"web: the same {count} signals, the same server woken by a "
        f"{POLL_INTERVAL * 1000:.0f} ms poller")
    pol = bench(base, lambda ws: [sys.executable, os.path.join(HERE, "_web_poller.py"), ws,
                                  str(POLL_INTERVAL)], count, warmup)
    e, p = web["lat"], pol["lat"]
    e50, e99, p50, p99 = percentile(e, 50), percentile(e, 99), percentile(p, 50), percentile(p, 99)
    aim = "met" if e99 < 0.1 else "NOT met"
    return [
        Row("10 web latency", "signal file -> SSE update of an open page, p50", ms(e50),
            ms(p50) + " (250 ms poller)", ratio(e50, p50, 3),
            note=f"{p50 / e50:.1f}x lower; {count} signals; mean {ms(sum(e) / len(e))} vs "
                 f"{ms(sum(p) / len(p))}"),
        Row("10 web latency", "signal file -> SSE update of an open page, p99", ms(e99),
            ms(p99) + " (250 ms poller)", ratio(e99, p99, 3),
            note=f"aim p99 < 100 ms: {aim}; max {ms(max(e))}; idle server with the stream "
                 f"open: {web['idle_cpu']:.3f} s CPU in 5 s"),
    ]
