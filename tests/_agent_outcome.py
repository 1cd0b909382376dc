"""What each role emits to end its run well, for the tests' stand-in `command` agents
(tests/_hostile_agent.py, tests/_loud_agent.py): `ralph emit` arguments, or None for a
role that emits nothing (the librarian)."""
from __future__ import annotations

import json

EVIDENCE = ("tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 91, "
            "complexity: 3, duplication: pass")


def outcome(role: str, plans: bool) -> list[str] | None:
    """`plans`: the planner plans one task (else it says nothing is left)."""
    if role == "planner" and plans:
        return ["plan.ready", "--json", json.dumps({"tasks": [{"id": "t1", "title": "T"}]})]
    if role == "planner":
        return ["LOOP_COMPLETE", "nothing left"]
    if role == "executor":
        return ["build.done", EVIDENCE]
    if role == "reviewer":
        return ["review.done", "tests: pass, build: pass"]
    return None
