"""What agents call constantly (`ralph emit`, `tools interact progress`, `tools signals
poll` with nothing waiting, `tools approve` as a CLI's hook, `ralph mcp`'s start and its
first call) stays as cheap to
start as the bare interpreter: none of it imports the typed store (attrs, cattrs), PyYAML
or the machine (transitions). Each command runs as the real `ralph`, in a run a real
engine holds open, and says at exit which of those it loaded."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ralph.engine.clock import SystemClock
from ralph.session_store import create
from support import base_env
from support.engines import held_run

HEAVY = ("attr", "attrs", "cattrs", "yaml", "transitions", "psycopg")
# `ralph ARGS`, printing at exit the top-level packages of HEAVY it imported
PROBE = ("import atexit, sys\n"
         f"atexit.register(lambda: print('LOADED', sorted({{m.split('.')[0] for m in "
         f"sys.modules}} & {set(HEAVY)!r}), file=sys.stderr))\n"
         "sys.argv = ['ralph', *sys.argv[1:]]\n"
         "from ralph.engine.entry import main\nmain()\n")
MCP_CALLS = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
     "params": {"name": "emit", "arguments": {"topic": "hot.mcp", "payload": "x"}}}]


def loaded(r: subprocess.CompletedProcess) -> list[str]:
    line = [x for x in r.stderr.splitlines() if x.startswith("LOADED ")]
    assert line, r.stderr
    return json.loads(line[-1][len("LOADED "):].replace("'", '"'))


def test_agents_hot_paths_import_no_heavy_module(workspace):
    session = create(str(workspace), "hot paths", now=SystemClock().now(), session_id="h1")
    with held_run(session, "executor") as run:
        env = base_env(**{k: v for k, v in run.items() if k.startswith("RALPH_")})

        def probe(*args, stdin=None):
            r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=workspace, env=env,
                               capture_output=True, text=True, timeout=120, input=stdin)
            assert r.returncode == 0, (args, r.stdout, r.stderr)
            return r

        for args in (["emit", "hot.emit", "x"], ["tools", "interact", "progress", "half way"],
                     ["tools", "signals", "poll"]):
            assert loaded(probe(*args)) == [], args
        # a CLI's pre-tool hook, before every tool call a rule may name: no rule, it passes
        hook = probe("tools", "approve", "--cli", "claude",
                     stdin='{"tool_name": "Bash", "tool_input": {"command": "ls"}}')
        assert hook.stdout == "" and loaded(hook) == [], hook.stderr
        mcp = subprocess.Popen([sys.executable, "-c", PROBE, "mcp"], cwd=workspace, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        try:
            for message in MCP_CALLS:
                mcp.stdin.write(json.dumps(message) + "\n")
                mcp.stdin.flush()
            reply = {}
            while reply.get("id") != 2:   # the first tool call answered, then input closed
                reply = json.loads(mcp.stdout.readline() or '{"id": 2}')
            out, err = mcp.communicate(timeout=60)
        finally:
            mcp.kill()
        assert "result" in reply, (reply, err)
        assert loaded(subprocess.CompletedProcess([], mcp.returncode, out, err)) == []


@pytest.mark.parametrize("args", [["session", "status", "h1"], ["session", "list"]])
def test_the_probe_sees_what_a_typed_command_imports(workspace, args):
    """A typed command reads the store's classes (attrs, cattrs): that is its cost, and
    the probe above would see it."""
    create(str(workspace), "typed", now=SystemClock().now(), session_id="h1")
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=workspace, env=base_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "h1" in r.stdout, r.stderr
    assert {"attrs", "cattrs"} <= set(loaded(r)), r.stderr
