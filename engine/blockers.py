"""Blocker traces (seed 003): every `blocker` event is recorded on the bus (by `ralph
emit`, which validates it), counted by its normalised cause, and appended to the
context-graph file when one is configured. The same cause `repeat_limit` times in a
session pauses it with the trace as the reason, instead of looping on it.
"""
from __future__ import annotations

import fcntl
import json
import os
import re

from session_store import PauseKind, dump_yaml, parse_yaml, write_atomic

from .driver_types import Next, Preempted
from .event_schemas import validate_blocker

COUNTS_FILE = "blockers.yaml"

LAST_RESORT = (
    "### Blockers (last resort)\n"
    "Before reporting a blocker: search the workspace and the scratchpad for what you need, "
    "try alternative approaches, consider a degraded scope (skip optional steps), and read "
    "the project's operational notes. A blocker IS: a missing credential, access denied, an "
    "explicit human decision required. It is NOT: uncertainty, a missing nice-to-have, an "
    "ambiguous requirement (decide, note it in the scratchpad, go on). Report one with\n"
    "  ralph emit blocker --json '{\"type\": \"blocker\", \"timestamp\": \"<ISO 8601>\", "
    "\"project\": \"...\", \"issue\": null, \"attempting\": \"...\", \"cause\": \"...\", "
    "\"attempted_resolution\": [\"...\"], \"interpretation\": \"...\"}'\n"
    "The same cause reported three times pauses the session for a human.\n")


def normalise(cause: str) -> str:
    """Case, spacing and punctuation do not make a new cause."""
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", " ", cause.lower())).strip()


def record(engine, emitted: list[dict]) -> None:
    """Count the run's blockers; pause on the one that came back `repeat_limit` times."""
    path = os.path.join(engine.session.dir, COUNTS_FILE)
    repeated = None
    for event in emitted:
        if event["topic"] != "blocker" or validate_blocker(event["payload"]) is not None:
            continue
        trace = event["payload"]
        counts = _counts(path)
        key = normalise(trace["cause"])
        seen = counts.setdefault(key, {"count": 0, "seqs": []})
        if event["seq"] in seen["seqs"]:
            continue  # counted before a crash: never twice
        seen["count"] += 1
        seen["seqs"] = (seen["seqs"] + [event["seq"]])[-engine.config.blockers.repeat_limit:]
        write_atomic(path, dump_yaml(counts), "blockers")
        engine.metadata.fallback.blockers_in_iteration += 1
        _append_trace(engine, trace)
        if seen["count"] >= engine.config.blockers.repeat_limit:
            repeated = (trace, seen["count"])
    if repeated:
        trace, count = repeated
        raise Preempted(Next("pause", f"the same blocker {count} times: {json.dumps(trace)}",
                             PauseKind.BLOCKER))


def _counts(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return parse_yaml(f.read(), path) or {}
    except FileNotFoundError:
        return {}


def _append_trace(engine, trace: dict) -> None:
    target = engine.config.blockers.trace_path
    if not target:
        return
    target = os.path.join(engine.session.workspace, os.path.expanduser(target))
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    line = json.dumps({**trace, "session": engine.session.id}, ensure_ascii=False) + "\n"
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
