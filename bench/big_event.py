"""Bench 13: one huge line on the bus: does `ralph session status` pay for its size?

Two sessions with the same records (a session of 40 ordinary events); one has, last on its
bus, one 50 MB event (an agent's, written straight to the file: what `ralph emit` would
refuse). Each `ralph session status` (and `session tail -n 5`) runs as a fresh subprocess,
interleaved with the same command on the ordinary session, so the machine's drift hits
both alike: the figure is the median wall time and the peak RSS (from wait4). The reader
skips a line past its cap (2 MiB) without holding it, reading the bus back linearly:
the time grows with the bytes read, the memory does not. Before, the backward reader
re-joined a growing carry: 16 s and 163 MB for the same status.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _common import Row, bus_path, median, ms, now, ratio, say

BIG_MIB = 50   # the one event's payload, in MiB


def _append_big_event(session_dir: str) -> int:
    """Append one record whose payload is BIG_MIB MiB, written in pieces (the bench holds
    no copy of it); returns the line's size."""
    from ralph.session_store import read_events
    seq = max(r["seq"] for r in read_events(session_dir)[0]) + 1
    head = json.dumps({"seq": seq, "ts": now().isoformat(), "topic": "huge",
                       "source": "executor"})[:-1] + ', "payload": "'
    piece = b"y" * (1 << 20)
    with open(bus_path(session_dir), "ab") as bus:
        bus.write(head.encode())
        for _ in range(BIG_MIB):
            bus.write(piece)
        bus.write(b'"}\n')
    return len(head) + BIG_MIB * len(piece) + 3


def _measured(argv: list[str], cwd: str, env: dict) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one command. A small launcher runs it: a
    child's ru_maxrss counts the image it was forked from."""
    launcher = ("import os, subprocess, sys\n"
                "child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
                "_, status, usage = os.wait4(child.pid, 0)\n"
                "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", launcher, *argv], cwd=cwd, env=env,
                         check=True, capture_output=True, text=True, timeout=300).stdout
    elapsed = time.perf_counter() - started
    code, peak_kib = map(int, out.split())
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {code}")
    return elapsed, peak_kib * 1024


def run(base: str, runs: int = 10) -> list[Row]:
    from ralph import session_store
    workspace = tempfile.mkdtemp(prefix="ralph-bench-big-event-", dir=base)
    try:
        for sid in ("plain", "big"):
            session = session_store.create(workspace, "bench: one huge event", now=now(),
                                           session_id=sid)
            for i in range(40):
                session.append_event("human.progress", f"step {i}", source="executor")
        size = _append_big_event(session.dir)
        say(f"big event: status and tail x {runs} runs, with and without a "
            f"{size / 2**20:.0f} MiB line")
        env = dict(os.environ)
        commands = {name: [sys.executable, "-m", "ralph.engine", "session", *args]
                    for name, args in (("status", ("status", "{sid}")),
                                       ("tail", ("tail", "{sid}", "-n", "5")))}
        got: dict[tuple[str, str], list[tuple[float, int]]] = {}
        for _ in range(runs):
            for name, argv in commands.items():
                for sid in ("plain", "big"):
                    got.setdefault((name, sid), []).append(_measured(
                        [a.format(sid=sid) for a in argv], workspace, env))
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    rows = []
    for name in commands:
        wall = {sid: median([t for t, _ in got[(name, sid)]]) for sid in ("plain", "big")}
        peak = {sid: max(p for _, p in got[(name, sid)]) for sid in ("plain", "big")}
        rows.append(Row("13 big event", f"`ralph session {name}` with one {size / 2**20:.0f} MiB "
                        f"event last on the bus, median", ms(wall["big"], 1),
                        f"{ms(wall['plain'], 1)} (the same bus without it)",
                        ratio(wall["big"], wall["plain"]),
                        note=f"peak RSS {peak['big'] / 1e6:.0f} MB vs {peak['plain'] / 1e6:.0f} "
                             f"MB: the line is read, never held; {runs} runs each, "
                             f"interleaved"))
    return rows
