"""Bench 15: the format of the store's own files, chosen here (issue 23).

The store rewrites a session's metadata at every transition and reads it in every command
people type (`status`, `list`, `signal`, ...). Three candidates, on the metadata of a
session that has run (its file as the store writes it, read back to plain data):

- JSON (`json`, a valid YAML subset: any YAML reader reads the file),
- PyYAML's C loader and dumper (`CSafeLoader`, `CSafeDumper`),
- the store's own dialect from before this round (`load_plain`/`dump_plain`), when the
  checkout still has it.

Two figures each: in-process, one read plus one write (median of many); and cold, the
import a command pays before its first read (`python -c "import <module>"`, interleaved
with `python -c pass`). The baseline is JSON, measured in the same run: the store uses
the fastest candidate unless a library misses an aim (the typed commands' 3x the bare
interpreter, bench 11).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time

from _common import Row, ms, now, ratio, say


def _metadata(base: str) -> dict:
    """The plain data of a session's metadata after a few transitions."""
    from ralph import session_store
    from ralph.session_store import State
    workspace = tempfile.mkdtemp(prefix="ralph-bench-formats-", dir=base)
    session = session_store.create(workspace, "bench: formats of the store's files",
                                   now=now())
    o = session.metadata.orchestrator
    for dest in (State.EXECUTING_BATCH, State.REVIEWING_BATCH, State.PLANNING):
        o.previous_state, o.state = o.state, dest
        o.transitions += 1
        session.save(now())
    with open(session.metadata_path, encoding="utf-8") as f:
        return session_store.parse_yaml(f.read(), session.metadata_path)


def _candidates():
    import yaml
    found = {
        "JSON": (lambda text: json.loads(text),
                 lambda data: json.dumps(data, indent=1, ensure_ascii=False) + "\n", "json"),
        "PyYAML C": (lambda text: yaml.load(text, Loader=yaml.CSafeLoader),
                     lambda data: yaml.dump(data, Dumper=yaml.CSafeDumper, sort_keys=False,
                                            allow_unicode=True), "yaml"),
    }
    try:
        from ralph.session_store._schema import dump_plain, load_plain
        found["own dialect"] = (load_plain, dump_plain, "ralph.session_store._schema")
    except ImportError:
        pass
    return found


def _per_op(load, dump, data, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(50):
            load(dump(data))
        times.append((time.perf_counter() - start) / 50)
    return statistics.median(times)


def _cold_import(module: str, runs: int) -> tuple[float, float]:
    """(median seconds of `import module` in a fresh interpreter, of `pass`)."""
    took: dict[str, list[float]] = {"pass": [], module: []}
    for _ in range(runs):
        for code, key in (("pass", "pass"), (f"import {module}", module)):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            took[key].append(time.perf_counter() - start)
    return statistics.median(took[module]), statistics.median(took["pass"])


def run(base: str, rounds: int = 30, runs: int = 15) -> list[Row]:
    data = _metadata(base)
    candidates = _candidates()
    say(f"formats: {', '.join(candidates)} on {len(json.dumps(data))} bytes of metadata")
    per_op = {name: _per_op(load, dump, data, rounds)
              for name, (load, dump, _module) in candidates.items()}
    rows = []
    for name, (load, dump, module) in candidates.items():
        assert load(dump(data)) == data, f"{name} does not round-trip the metadata"
        cold, bare = _cold_import(module, runs)
        rows.append(Row("formats", f"{name}: one read + one write of session metadata",
                        f"{per_op[name] * 1e6:.0f} µs", f"{per_op['JSON'] * 1e6:.0f} µs (JSON)",
                        ratio(per_op[name], per_op["JSON"]),
                        f"cold `import {module}`: {ms(cold, 1)} vs {ms(bare, 1)} bare "
                        f"(+{ms(max(0.0, cold - bare), 1)})"))
    return rows
