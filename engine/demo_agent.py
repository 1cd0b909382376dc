"""The bundled demo agent: plays a scripted session deterministically, no network, no model.

A scenario YAML lists steps; the first whose `role` (and, when given, `iteration`,
`task`, `attempt`) matches this invocation is played:

    steps:
      - role: executor          # planner | executor | reviewer | librarian | questioner
        iteration: 1            # optional filters
        task: t2
        attempt: 1
        sleep: 0.5              # seconds, before anything else
        write: {"src/{task}.py": "print('hi')\\n"}        # under <workspace>/.ralph-demo/
        write_iteration: {"knowledge/notes.md": "..."}    # relative to RALPH_ITERATION_DIR
        emit:                   # events, sent as `ralph emit` sends them
          - {topic: build.done, payload: "tests: pass, lint: pass"}
          - {topic: plan.ready, json: {tasks: [{id: t1, title: "...", batch: 1}]}}
        ask: {question: "Which DB?", timeout: 5, default: "sqlite", options: [a, b]}
                                # blocks like `ralph tools interact ask`; later strings may
                                # use {answer}; a timeout makes the step exit 3 after it
        stdout: "text to print"
        exit: 0
        limit: {until: "2026-11-26T05:00:00Z", reset: true, says: null, message: "..."}
                                # until that instant (ISO 8601 or epoch seconds), the run
                                # says its usage limit (a JSON line, with the reset unless
                                # reset: false; `says`: another reset than the real one)
                                # and exits 1 before anything else
      - role: executor
        resumed: true           # only a run that continues an earlier run's conversation

Every run first prints its conversation's id (a JSON line); `--resume ID` continues that
conversation, as the agent CLIs do. `{task}`, `{iteration}`, `{role}` and `{attempt}` are
replaced in strings. No matching
step: the agent does nothing and exits 0. This is how users rehearse a config and how
the tests drive every path. What it writes lands under `<workspace>/.ralph-demo/`, never
among the project's own files: no model wrote it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import datetime, timezone
from importlib import resources

import yaml

from ralph.session_store import RunOver, make_dirs, write_atomic

from .tools.emit import publish

BUILTIN = "builtin.yaml"
DEMO_DIR = ".ralph-demo"   # everything the demo writes into a workspace goes here


def load_scenario(path: str | None) -> dict:
    if path is None:
        text = resources.files("ralph.engine.scenarios").joinpath(BUILTIN).read_text()
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    return yaml.safe_load(text) or {}


def _fill(value, names: dict):
    if isinstance(value, str):
        for key, sub in names.items():
            value = value.replace("{" + key + "}", str(sub))
        return value
    if isinstance(value, list):
        return [_fill(v, names) for v in value]
    if isinstance(value, dict):
        return {_fill(k, names): _fill(v, names) for k, v in value.items()}
    return value


def find_step(scenario: dict, names: dict) -> dict | None:
    for step in scenario.get("steps", []):
        if step.get("role") != names["role"]:
            continue
        if all(str(step[k]) == str(names[k]) for k in ("iteration", "task", "attempt") if k in step) \
                and step.get("resumed", names.get("resumed")) == names.get("resumed"):
            return _fill(step, names)
    return None


def limited(limit: dict) -> bool:
    """Says the usage limit of `limit` (a step's) while it lasts; True if it did."""
    until = _epoch(limit["until"])
    if time.time() >= until:
        return False
    says = _epoch(limit["says"]) if limit.get("says") is not None else until
    print(json.dumps({"type": "usage_limit", "message": limit.get("message",
                                                               "demo agent: usage limit reached"),
                      "resets_at": says if limit.get("reset", True) else None}), flush=True)
    return True


def _epoch(value) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).timestamp()
    return float(value)


def play(step: dict, env: dict) -> int:
    if step.get("limit") and limited(step["limit"]):
        return 1
    time.sleep(float(step.get("sleep", 0)) * float(env.get("RALPH_DEMO_SLEEP_SCALE", 1)))
    answered = True
    if step.get("ask"):
        from ralph.engine.tools.interact import ask_and_wait  # only scenarios that ask pay for it
        ask = step["ask"]
        answer, answered = ask_and_wait(
            str(ask["question"]), timeout=ask.get("timeout"), default=ask.get("default"),
            options=[str(o) for o in ask.get("options") or []],
            work_dir=env["RALPH_SESSION_DIR"])
        step = _fill({k: v for k, v in step.items() if k != "ask"}, {"answer": answer or ""})
    demo_root = os.path.join(env["RALPH_WORKSPACE"], DEMO_DIR)
    for rel, content in (step.get("write") or {}).items():
        path = os.path.normpath(os.path.join(demo_root, rel))
        if os.path.commonpath([path, demo_root]) != demo_root:
            print(f"demo agent: write {rel!r}: expected a path under {DEMO_DIR}/",
                  file=sys.stderr)
            return 2
        _write(path, content)
    for rel, content in (step.get("write_iteration") or {}).items():
        _write(os.path.join(env["RALPH_ITERATION_DIR"], rel), content)
    for event in step.get("emit") or []:
        payload = event["json"] if "json" in event else event.get("payload")
        try:
            publish(env["RALPH_SESSION_DIR"], event["topic"], payload)
        except RunOver as e:
            print(f"demo agent: {e}", file=sys.stderr)
            return 2
    if step.get("stdout"):
        print(step["stdout"], flush=True)
    return int(step.get("exit", 0 if answered else 3))


def _write(path: str, content: str) -> None:
    make_dirs(os.path.dirname(path))
    write_atomic(path, content, "agent-file")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ralph-demo-agent")
    parser.add_argument("--script", help="scenario YAML (default: the built-in one)")
    parser.add_argument("--resume", help="continue this conversation (its id)")
    args = parser.parse_args(argv)
    env = os.environ
    sys.stdin.read()  # the prompt: read so the engine's pipe never blocks
    print(json.dumps({"type": "conversation", "id": args.resume or str(uuid.uuid4())}),
          flush=True)
    names = {"role": env["RALPH_ROLE"], "iteration": env.get("RALPH_ITERATION", ""),
             "task": env.get("RALPH_TASK_ID", ""), "attempt": env.get("RALPH_ATTEMPT", "1"),
             "resumed": args.resume is not None}
    step = find_step(load_scenario(args.script), names)
    if step is None:
        return 0
    print(f"demo agent: {names['role']} iteration {names['iteration']} "
          f"{names['task'] or ''} playing its step".rstrip(), flush=True)
    return play(step, env)


if __name__ == "__main__":
    sys.exit(main())
