"""Payload schemas for the topics the engine reads structurally: `blocker` (seed 003)
and `confidence` (seed 004). Stdlib only: `ralph emit` validates with it."""
from __future__ import annotations

import math
from datetime import datetime

BLOCKER_FIELDS = {
    "type": str, "timestamp": str, "project": (str, type(None)), "issue": (int, str, type(None)),
    "attempting": str, "cause": str, "attempted_resolution": list, "interpretation": str,
}
BLOCKER_REQUIRED = ("type", "timestamp", "attempting", "cause", "attempted_resolution",
                    "interpretation")
FACTORS = ("task_clarity", "solution_certainty", "verification_success", "precedent_match",
           "resource_availability")
UNIT_FIELDS = FACTORS + ("risk", "ambiguity")


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", list: "a list", type(None): "null",
             float: "a number"}
    return " or ".join(names[k] for k in kinds)


def validate_blocker(payload) -> str | None:
    """None when valid, else `$.field: what was expected`."""
    if not isinstance(payload, dict):
        return "$: expected a JSON object with " + ", ".join(BLOCKER_FIELDS)
    for key in payload:
        if key not in BLOCKER_FIELDS:
            return f"$.{key}: unknown field (expected {', '.join(BLOCKER_FIELDS)})"
    for key in BLOCKER_REQUIRED:
        if key not in payload:
            return f"$.{key}: required"
    for key, kind in BLOCKER_FIELDS.items():
        if key in payload and (not isinstance(payload[key], kind) or isinstance(payload[key], bool)):
            return f"$.{key}: expected {_type_name(kind)}"
    for key in ("type", "cause", "attempting"):
        if not payload[key].strip():
            return f"$.{key}: expected a non-empty string"
    for i, item in enumerate(payload["attempted_resolution"]):
        if not isinstance(item, str):
            return f"$.attempted_resolution[{i}]: expected a string"
    try:
        datetime.fromisoformat(payload["timestamp"].replace("Z", "+00:00"))
    except ValueError:
        return "$.timestamp: expected an ISO 8601 time"
    return None


def validate_confidence(payload) -> str | None:
    """Factor scores and observations an agent reports: each optional, each checked."""
    if not isinstance(payload, dict):
        return "$: expected a JSON object of factor scores (" + ", ".join(FACTORS) + ")"
    allowed = set(UNIT_FIELDS) | {"complexity", "approaches", "missing"}
    for key, value in payload.items():
        if key not in allowed:
            return f"$.{key}: unknown field (expected {', '.join(sorted(allowed))})"
        if key in UNIT_FIELDS or key == "complexity":
            if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                    (isinstance(value, float) and not math.isfinite(value)):
                return f"$.{key}: expected a number"
            if key in UNIT_FIELDS and not 0 <= value <= 1:
                return f"$.{key}: expected a number in [0, 1]"
            if key == "complexity" and value < 0:
                return f"$.{key}: expected a non-negative number"
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return f"$.{key}: expected a list of strings"
    return None


VALIDATORS = {"blocker": validate_blocker, "confidence": validate_confidence}
