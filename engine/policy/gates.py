"""The quality gates of seed 002, on exact topics, with no bypass.

Every event a run produced, and every event the engine injects itself, is judged
here. A failing event is rewritten to its blocked/failed variant with the reason,
which goes back to the same role in its next prompt.
"""
from __future__ import annotations

import json
import re

from ralph.states import COMPLETION

BUILD_EVIDENCE = ("tests", "lint", "typecheck", "audit", "coverage", "complexity", "duplication")
COVERAGE_MIN, MUTATION_MIN, COMPLEXITY_MAX = 80.0, 70.0, 10.0

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_PAIR = re.compile(r"([A-Za-z_][\w.]*)\s*[:=]\s*([^,;\n]+)")


def payload_text(payload) -> str:
    """A payload as the text the gates read: strings as they are, JSON as `key: value`."""
    if payload is None:
        return ""
    if isinstance(payload, str):
        return _ANSI.sub("", payload)
    if isinstance(payload, dict):
        return ", ".join(f"{k}: {v}" for k, v in _flatten(payload))
    return json.dumps(payload)


def _flatten(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _fields(payload) -> dict[str, str]:
    return {k.lower(): v.strip().lower() for k, v in _PAIR.findall(payload_text(payload))}


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    match = re.match(r"-?\d+(\.\d+)?", value)
    return float(match.group()) if match else None


def _passes(value: str | None) -> bool:
    return value is not None and value.split()[0] in ("pass", "passed", "ok", "true")


def check_build_done(payload) -> str | None:
    """None when the evidence is there and passing, else the reason."""
    fields = _fields(payload)
    problems = []
    for key in BUILD_EVIDENCE:
        value = fields.get(key)
        if value is None:
            problems.append(f"{key}: missing")
        elif key == "coverage" and not _passes(value):
            n = _number(value)
            if n is None or n < COVERAGE_MIN:
                problems.append(f"coverage: {value} (needs pass or >= {COVERAGE_MIN:g})")
        elif key == "complexity" and not _passes(value):
            n = _number(value)
            if n is None or n > COMPLEXITY_MAX:
                problems.append(f"complexity: {value} (needs pass or <= {COMPLEXITY_MAX:g})")
        elif key not in ("coverage", "complexity") and not _passes(value):
            problems.append(f"{key}: {value}")
    if problems:
        return ("build.done needs passing evidence for " + ", ".join(BUILD_EVIDENCE)
                + "; got " + "; ".join(problems))
    return None


def check_review_done(payload) -> str | None:
    text = payload_text(payload)
    missing = [s for s in ("tests: pass", "build: pass") if s not in text]
    if missing:
        return f"review.done needs the literal {' and '.join(repr(m) for m in missing)}"
    return None


def check_verify_passed(payload) -> str | None:
    fields = _fields(payload)
    problems = []
    for key in ("quality.tests", "quality.lint", "quality.audit"):
        if not _passes(fields.get(key)):
            problems.append(f"{key}: {fields.get(key, 'missing')}")
    for key, bound, ok in (("quality.coverage", COVERAGE_MIN, lambda n: n >= COVERAGE_MIN),
                           ("quality.mutation", MUTATION_MIN, lambda n: n >= MUTATION_MIN),
                           ("quality.complexity", COMPLEXITY_MAX, lambda n: n <= COMPLEXITY_MAX)):
        n = _number(fields.get(key))
        if n is None or not ok(n):
            sign = "<=" if key == "quality.complexity" else ">="
            problems.append(f"{key}: {fields.get(key, 'missing')} (needs {sign} {bound:g})")
    if "quality.specs" in fields and not _passes(fields["quality.specs"]):
        problems.append(f"quality.specs: {fields['quality.specs']}")
    if problems:
        return "verify.passed needs the quality report; got " + "; ".join(problems)
    return None


GATES = {
    "build.done": ("build.blocked", check_build_done),
    "review.done": ("review.blocked", check_review_done),
    "verify.passed": ("verify.failed", check_verify_passed),
}


def judge(topic: str, payload) -> tuple[str, str | None, str | None]:
    """(topic after the gate, the reason when rewritten, a warning when passed with one)."""
    if topic in GATES:
        blocked, check = GATES[topic]
        reason = check(payload)
        if reason:
            return blocked, reason, None
    if topic == "verify.failed" and not any(k.startswith("quality.") for k in _fields(payload)):
        return topic, None, "verify.failed without a quality report"
    return topic, None, None


def judge_run(events: list[dict]) -> list[dict]:
    """A run's events as the engine takes them: gated, and a completion event that is not
    the last of its run ignored. Each is a copy with `gate` set when the gate acted."""
    judged = []
    for i, event in enumerate(events):
        e = dict(event)
        if e["topic"] == COMPLETION and i != len(events) - 1:
            e["gate"] = {"ignored": f"{COMPLETION} must be the last event of its run"}
        else:
            topic, reason, warning = judge(e["topic"], e.get("payload"))
            if reason:
                e["gate"] = {"rewritten_from": e["topic"], "reason": reason}
                e["topic"] = topic
            elif warning:
                e["gate"] = {"warning": warning}
        judged.append(e)
    return judged
