"""Blocker traces (seed 003): every `blocker` event is recorded on the bus (by `ralph
emit`, which validates it), counted by its normalised cause, and appended to the
context-graph file when one is configured. The same cause `repeat_limit` times in a
session pauses it with the trace as the reason, instead of looping on it.

The count is the bus's: a `blocker.counted` record {cause, seq, count} per blocker event,
appended through the store's `once` keyed by the event's seq (record-then-effect: a
crash after it never counts that event again; the trace it then loses is not written
twice). Only the engine sets a record's dedupe key, so an agent emitting
`blocker.counted` itself counts nothing.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
from collections import Counter

from ralph.session_store import PauseKind
from ralph.states import Next, Trigger

from ..config import inside
from ..event_schemas import validate_blocker

COUNTED = "blocker.counted"   # the engine's record of one blocker event counted

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


class BlockerLedger:
    """Observes each run's events; returns a pause when a cause came back too often."""

    def __init__(self, session, settings, observations, *, outside_allowed: bool = False):
        self.session = session
        self.settings = settings            # blockers config: trace_path, repeat_limit
        self.observations = observations    # the assessor's counters (blockers_in_iteration)
        self._outside_allowed = outside_allowed   # the human's own config said so
        self._counts: Counter[str] = Counter()   # cause -> blocker.counted records read
        self._read_to = 0                        # the seq they were read up to

    def _count(self, cause: str, seq: int) -> int | None:
        """Count one report of `cause` (bus record `seq`): the new count, or None when
        that record was counted already (before a crash)."""
        self._read_counts()
        count = self._counts[cause] + 1
        if not self.session.once(f"{COUNTED}:{seq}", COUNTED,
                                 {"cause": cause, "seq": seq, "count": count}):
            return None
        self._read_counts()
        return self._counts[cause]

    def _read_counts(self) -> None:
        for record in self.session.events_after(self._read_to):
            self._read_to = max(self._read_to, record["seq"])
            payload = record.get("payload")
            if record["topic"] == COUNTED and str(record.get("once")).startswith(COUNTED + ":") \
                    and isinstance(payload, dict) and isinstance(payload.get("cause"), str):
                self._counts[payload["cause"]] += 1

    def observe(self, emitted: list[dict]) -> Next | None:
        repeated = None
        for event in emitted:
            if event["topic"] != "blocker" or validate_blocker(event["payload"]) is not None:
                continue
            trace = event["payload"]
            count = self._count(normalise(trace["cause"]), event["seq"])
            if count is None:
                continue  # counted before a crash: never twice
            self.observations().blockers_in_iteration += 1
            self._append_trace(trace)
            if count >= self.settings.repeat_limit:
                repeated = (trace, count)
        if repeated:
            trace, count = repeated
            return Next(Trigger.PAUSE, f"the same blocker {count} times: {json.dumps(trace)}",
                        PauseKind.BLOCKER)
        return None

    def _append_trace(self, trace: dict) -> None:
        """The context graph: a JSONL file in the workspace (the user's, not the store's)."""
        target = self.settings.trace_path
        if not target:
            return
        target = os.path.join(self.session.workspace, os.path.expanduser(target))
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        if not self._outside_allowed and not inside(
                os.path.realpath(target), os.path.realpath(self.session.workspace)):
            return   # a link planted since the start leads out: the trace is not written
        line = json.dumps({**trace, "session": self.session.id}, ensure_ascii=False) + "\n"
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
