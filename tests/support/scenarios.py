"""Demo scenarios (engine/scenarios: per role and task, what the demo agent emits, writes,
asks), the outcomes that pass the gates, and a session started on a scenario."""
from __future__ import annotations

from pathlib import Path

import yaml

from .cli import ralph, spawn

# what passes seed 002's gates (engine/policy/gates.py)
EVIDENCE = ("tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 91, "
            "complexity: 3, duplication: pass")
REVIEW_OK = "tests: pass, build: pass"
QUALITY = ("quality.tests: pass, quality.lint: pass, quality.audit: pass, quality.coverage: 95, "
           "quality.mutation: 85, quality.complexity: 4")


def plan(*tasks: str, iteration: int = 1) -> dict:
    """A planner step defining `tasks` (one batch) in `iteration`."""
    return {"role": "planner", "iteration": iteration, "emit": [{"topic": "plan.ready", "json": {
        "tasks": [{"id": t, "title": t.upper()} for t in tasks]}}]}


# the steps that take any plan to the end: every task built and reviewed, then nothing left
DONE = [{"role": "planner", "emit": [{"topic": "LOOP_COMPLETE"}]},
        {"role": "executor", "emit": [{"topic": "build.done", "payload": EVIDENCE}]},
        {"role": "reviewer", "emit": [{"topic": "review.done", "payload": REVIEW_OK}]}]


def write_scenario(ws: Path, steps: list[dict], name: str = "scenario.yaml") -> Path:
    path = ws / name
    path.write_text(yaml.safe_dump({"steps": steps}, sort_keys=False))
    return path


def write_config(ws: Path, config: dict, name: str = "ralph.yml") -> Path:
    path = ws / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def demo_config(ws: Path, steps: list[dict], config: dict | None = None) -> Path:
    """scenario.yaml with `steps` and a ralph.yml whose demo agent plays it (plus
    `config`, its `agent:` keys over the demo's); returns the ralph.yml."""
    scenario = write_scenario(ws, steps)
    config = dict(config or {})
    agent = {"backend": "demo", "script": str(scenario), **config.pop("agent", {})}
    return write_config(ws, {"agent": agent, **config})


def start(ws: Path, steps: list[dict], *, objective: str = "objective", sid: str = "s",
          config: dict | None = None, env: dict | None = None, args=(), wait: bool = False):
    """`ralph session start OBJECTIVE --id SID` on a demo scenario (demo_config): spawned
    (a Popen), or with `wait` run to its end (a CompletedProcess)."""
    demo_config(ws, steps, config)
    argv = ("session", "start", objective, "--id", sid, *args)
    return ralph(ws, *argv, env=env) if wait else spawn(ws, *argv, env=env)
