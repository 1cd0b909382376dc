"""A real agent program, written in Python by the test, for what must happen inside an
agent run (`ralph emit`, `ralph tools ...` as an agent calls them, in a run the engine
opened) while the test plays the human from outside it (`ralph session answer`, `ralph
signal`: refused inside a run).

    script_agent(ws, '''
        record("cost", ralph("emit", "cost", "--json", '{"usd": 0.5}'))
        hold("terminal")              # the test acts now, then lets it go on
    ''')
    proc = spawn(ws, "session", "start", "obj", "--id", "s")
    with held(ws, "terminal", "s"):
        ralph(ws, "emit", "note", "from a terminal")
    finish(proc)
    recorded(ws, "cost", "s")         # {"args", "code", "out", "err"}

The agent plans one task, t1; its executor runs the test's code, then builds t1 with
evidence; the reviewer approves it; the next planner completes. The code sees `ralph(*args,
**env)` (a `ralph` command as this agent runs it; `env` overrides variables, None drops
one), `record(name, value)` and `hold(name)` (wait for the test's `held`), `WS` and `SID`.
"""
from __future__ import annotations

import json
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

from .cli import wait_for
from .scenarios import EVIDENCE, REVIEW_OK, write_config

_AGENT = '''\
import json, os, subprocess, sys, time

WS, SID = os.environ["RALPH_WORKSPACE"], os.environ["RALPH_SESSION_ID"]


def ralph(*args, **env):
    """`ralph ARGS` run by this agent: its exit code and output."""
    full = {{**os.environ, **{{k: v for k, v in env.items() if v is not None}}}}
    for name in (k for k, v in env.items() if v is None):
        full.pop(name, None)
    r = subprocess.run([sys.executable, "-m", "ralph.engine", *map(str, args)], env=full,
                       capture_output=True, text=True, timeout=120)
    return {{"args": list(map(str, args)), "code": r.returncode, "out": r.stdout,
            "err": r.stderr}}


def record(name, value):
    path = os.path.join(WS, f"{{name}}.{{SID}}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def hold(name):
    """Say so, and wait until the test lets this run go on."""
    open(os.path.join(WS, f"{{name}}.{{SID}}.held"), "w").close()
    go = os.path.join(WS, f"{{name}}.{{SID}}.go")
    deadline = time.monotonic() + 120
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit(f"hold {{name}}: the test never let it go on")
        time.sleep(0.02)   # poll: until the test lets it go on


role = os.environ["RALPH_ROLE"]
if role == "planner":
    if os.environ["RALPH_ITERATION"] == "1":
        ralph("emit", "plan.ready", "--json", '{{"tasks": [{{"id": "t1", "title": "T1"}}]}}')
    else:
        print("LOOP_COMPLETE")
elif role == "executor":
{executor}
    ralph("emit", "build.done", {evidence!r})
elif role == "reviewer":
    ralph("emit", "review.done", {review!r})
'''


def script_agent(ws: Path, executor: str, config: dict | None = None) -> Path:
    """The agent (agent.py in `ws`) and a ralph.yml whose command backend runs it (plus
    `config`, whose `agent:` keys go over the command's); `executor` is Python source run by
    the executor first. Returns ralph.yml."""
    code = textwrap.indent(textwrap.dedent(executor).strip() or "pass", "    ")
    agent = ws / "agent.py"
    agent.write_text(_AGENT.format(executor=code, evidence=EVIDENCE, review=REVIEW_OK))
    config = dict(config or {})
    return write_config(ws, {"agent": {"backend": "command",
                                       "command": [sys.executable, str(agent)],
                                       **config.pop("agent", {})}, **config})


def recorded(ws: Path, name: str, sid: str, timeout: float = 60):
    """What the agent of session `sid` recorded as `name` (waited for)."""
    path = ws / f"{name}.{sid}.json"
    wait_for(path.exists, timeout)
    return json.loads(path.read_text())


@contextmanager
def held(ws: Path, name: str, sid: str, timeout: float = 60):
    """Wait until the agent of session `sid` holds at `name`; let it go on at the end
    (on a failure too, so that its engine ends)."""
    wait_for((ws / f"{name}.{sid}.held").exists, timeout)
    try:
        yield
    finally:
        (ws / f"{name}.{sid}.go").touch()


# `approve(cli, tool_name, tool_input)` for an executor's code: the real `ralph tools
# approve` as an agent's CLI runs its pre-tool hook (the call on stdin, the decision out)
HOOK = '''
def approve(cli, tool_name, tool_input):
    """`ralph tools approve` as the CLI runs it: the call on stdin, the decision out."""
    r = subprocess.run([sys.executable, "-m", "ralph.engine", "tools", "approve", "--cli", cli],
                       input=json.dumps({"hook_event_name": "PreToolUse", "tool_name": tool_name,
                                         "tool_input": tool_input}),
                       capture_output=True, text=True, timeout=120)
    return {"code": r.returncode, "out": r.stdout, "err": r.stderr}
'''


def said(result: dict) -> dict:
    """Claude Code's reading of the hook's stdout: its permission decision."""
    assert result["code"] == 0, result
    return json.loads(result["out"])["hookSpecificOutput"] if result["out"].strip() else {}
