"""`ralph mcp` through the official MCP SDK's own client, over stdio, against real
sessions: every tool, the resources, errors as tool errors, a blocking `ask` answered by
`ralph session answer` while the call waits (with progress notifications), and the run
gate (an event of a run that is over is refused).

What the tools send goes through the work area's outbox to the engine running the
session: the tests that send give the server the environment of a run a real engine
holds open (support.engines.held_run), and read what the engine recorded in the
session's control plane (support.disk.session_dir)."""
from __future__ import annotations

import json
import os
import threading
from contextlib import asynccontextmanager

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from ralph.engine.clock import SystemClock
from ralph.session_store import acquire_lock, create, load
from support import EVIDENCE, RALPH, base_env, events, question_files, ralph, wait_for
from support.disk import session_dir
from support.engines import held_run
from support.mcp import RawMcp


@pytest.fixture
def session(workspace):
    s = create(str(workspace), "serve the tools", now=SystemClock().now(), session_id="m1")
    return s


@asynccontextmanager
async def client(workspace, **env):
    params = StdioServerParameters(command=RALPH[0], args=[*RALPH[1:], "mcp", "--session", "m1"],
                                   cwd=str(workspace), env=base_env(**env))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            yield s


def run(coro_fn):
    return anyio.run(coro_fn)


def of_run(env: dict) -> dict:
    """The RALPH_* variables of a run's environment: what the engine gives its agent's
    tools (the server is started by the agent's CLI with them)."""
    return {k: v for k, v in env.items() if k.startswith("RALPH_")}


def recorded(workspace, *topics: str, timeout: float = 30) -> list[dict]:
    """The session's events once each of `topics` is among them (the engine takes what
    the run sent on its next wakeup, within milliseconds)."""
    sd = session_dir(workspace, "m1")

    def all_there():
        evs = events(sd)
        return evs if set(topics) <= {e["topic"] for e in evs} else None
    return wait_for(all_there, timeout=timeout)


def test_tools_and_resources_are_listed_with_descriptions(workspace, session):
    async def go():
        async with client(workspace) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            resources = [str(r.uri) for r in (await s.list_resources()).resources]
            return tools, resources
    tools, resources = run(go)
    assert set(tools) == {"emit", "ask", "progress", "signals_poll", "blocker", "status"}
    assert all(len(t.description) > 30 for t in tools.values())
    assert tools["ask"].input_schema["required"] == ["question"]
    assert set(tools["emit"].input_schema["properties"]) == {"topic", "payload"}
    assert resources == ["ralph://plan", "ralph://progress", "ralph://scratchpad"]


def test_initialize_names_the_server_with_ralphs_version(workspace, session):
    """The client learns which ralph it talks to: the version `ralph --version` prints."""
    async def go():
        params = StdioServerParameters(command=RALPH[0],
                                       args=[*RALPH[1:], "mcp", "--session", "m1"],
                                       cwd=str(workspace), env=base_env())
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                return (await s.initialize()).server_info
    info = run(go)
    printed = ralph(workspace, "--version")
    assert printed.returncode == 0, printed.stderr
    assert info.name == "ralph" and info.version
    assert printed.stdout.strip() == f"ralph {info.version}"


def test_emit_lands_once_and_errors_are_tool_errors(workspace, session):
    async def go(env):
        async with client(workspace, **of_run(env)) as s:
            done = await s.call_tool("emit", {"topic": "build.done", "payload": EVIDENCE})
            blocked = await s.call_tool("emit", {"topic": "review.done",
                                                 "payload": {"tests": "pass"}})
            bad = await s.call_tool("emit", {"topic": "not a topic"})
            trace = await s.call_tool("blocker", {"trace": {"type": "blocker"}})
            note = await s.call_tool("progress", {"message": "half way"})
            return done, blocked, bad, trace, note
    with held_run(session, "executor") as env:
        done, blocked, bad, trace, note = anyio.run(go, env)
        # what the run sent, as the engine recorded it while the run is still open (on
        # release, the held run sends its own outcome); the outbox is taken in order, so
        # once the last call's event is there, every earlier one is
        evs = [e for e in recorded(workspace, "human.progress")
               if e.get("run") == env["RALPH_RUN_ID"]]
    assert not done.is_error and "emitted build.done" in done.content[0].text
    assert not blocked.is_error        # gates judge a run's events when the engine collects
    # them (tests/test_gates.py), the same whichever way they were emitted
    assert bad.is_error and "expected dotted words like build.done" in bad.content[0].text
    assert trace.is_error and "$." in trace.content[0].text    # the seed 003 schema, by path
    assert not note.is_error and "progress noted" in note.content[0].text
    topics = [e["topic"] for e in evs]
    assert topics.count("build.done") == 1 and "human.progress" in topics
    assert next(e for e in evs if e["topic"] == "build.done")["source"] == "executor"
    assert "blocker" not in topics
    # the refused ones are recorded as the run's refusals (by the engine), never as events
    refusals = [e["payload"]["command"] for e in evs if e["topic"] == "cli.refused"]
    assert refusals == ["mcp emit not a topic", "mcp emit blocker"], refusals
    assert {e["source"] for e in evs} == {"executor"}


def engine_inlet(workspace):
    """What an engine holds of session m1 to hear agents: its lock and its inlet (the run
    gate: the work area's outbox, no run open in it yet), with no desk or mailbox."""
    from ralph.engine.running.inlet import Inlet
    session = load(str(workspace), "m1")
    lease = acquire_lock(session.dir, "m1")
    inlet = Inlet(session, max_bytes=1 << 20, on_ask=lambda *_: {"refused": "no desk here"},
                  on_ask_gone=lambda rid: None, on_poll=lambda role: {"signals": []},
                  on_approve=lambda *_: {"refused": "no rules here"})
    inlet.start()
    return lease, inlet


def test_an_event_of_a_run_that_is_over_is_refused(workspace, session):
    from ralph.engine.running.inlet import RunInfo
    lease, inlet = engine_inlet(workspace)
    inlet.open_run(RunInfo("0007-executor-t1", "executor", "t1"))
    try:
        async def go(run_id):
            async with client(workspace, RALPH_RUN_ID=run_id,
                              RALPH_SESSION_DIR=session.work_dir,
                              RALPH_ROLE="executor") as s:
                return await s.call_tool("emit", {"topic": "build.done", "payload": EVIDENCE})
        live = anyio.run(go, "0007-executor-t1")
        inlet.drain()
        inlet.close_run("0007-executor-t1")
        late = anyio.run(go, "0007-executor-t1")
        inlet.drain()
    finally:
        inlet.stop()
        lease.release()
    assert not live.is_error, live.content[0].text
    assert late.is_error and "refused" in late.content[0].text and "is over" in \
        late.content[0].text
    evs = events(session_dir(workspace, "m1"))
    [taken] = [e for e in evs if e["topic"] == "build.done"]
    assert taken["run"] == "0007-executor-t1" and taken["source"] == "executor"
    refused = [e for e in evs if e["topic"] == "emit.refused"]
    assert len(refused) == 1 and refused[0]["run"] == "0007-executor-t1"
    assert refused[0]["payload"]["topic"] == "build.done"
    assert refused[0]["payload"]["why"].startswith("run 0007-executor-t1 is over")


def test_ask_blocks_until_answered_from_the_cli_with_progress(workspace, session):
    answered, progress = {}, []

    def answer_when_asked():
        qdir = session_dir(workspace, "m1") / "questions"   # the engine's, asked by the run
        wait_for(lambda: list(qdir.glob("*.yaml")), timeout=30)
        wait_for(lambda: progress, timeout=30)   # the client heard it is still waiting
        r = ralph(workspace, "session", "answer", "m1", "2")   # option 2
        answered["cli"] = r

    async def go(env):
        async with client(workspace, RALPH_TEST_MCP_PROGRESS_EVERY="0.2", **of_run(env)) as s:
            threading.Thread(target=answer_when_asked, daemon=True).start()

            async def on_progress(p, total, message):
                progress.append(p)
            return await s.call_tool("ask", {"question": "Which database?",
                                             "options": ["sqlite", "postgres"],
                                             "timeout_seconds": 60},
                                     progress_callback=on_progress)
    with held_run(session, "executor") as env:
        result = anyio.run(go, env)
    assert answered["cli"].returncode == 0, answered["cli"].stderr
    assert not result.is_error and result.content[0].text == "postgres"
    assert progress, "no progress notification while it waited"
    evs = events(session_dir(workspace, "m1"))
    assert [e["topic"] for e in evs].count("human.question") == 1
    [asked] = [e for e in evs if e["topic"] == "human.question"]
    assert asked["source"] == "executor" and asked["run"] == env["RALPH_RUN_ID"]


def test_ask_times_out_to_its_default(workspace, session):
    async def go(env):
        async with client(workspace, **of_run(env)) as s:
            return await s.call_tool("ask", {"question": "Go on?", "default": "yes",
                                             "timeout_seconds": 0.5})
    with held_run(session, "executor") as env:
        result = anyio.run(go, env)
    assert not result.is_error and "no answer in time; the default: yes" in \
        result.content[0].text


def test_status_signals_and_resources_read_the_session(workspace, session):
    async def read(env):
        async with client(workspace, **env) as s:
            status = await s.call_tool("status", {})
            wrong = await s.call_tool("signals_poll", {"role": "janitor"})
            scratch = await s.read_resource("ralph://scratchpad")
            plan = await s.read_resource("ralph://plan")
            return status, wrong, scratch, plan

    async def poll(env):
        async with client(workspace, **env) as s:
            return await s.call_tool("signals_poll", {}), await s.call_tool("status", {})

    # before any engine ran it: the store's view, read without an engine
    status, wrong, scratch, plan = anyio.run(read, {"RALPH_ROLE": "executor"})
    view = json.loads(status.content[0].text)
    assert view["session_id"] == "m1" and view["state"] == "PLANNING"
    assert wrong.is_error and "expected one of" in wrong.content[0].text
    assert scratch.contents[0].text.startswith("# Scratchpad")
    assert plan.contents[0].text == "(no plan yet)"
    # the executor's run open: a human steers it, and the run takes it through the engine
    with held_run(session, "executor") as env:
        r = ralph(workspace, "signal", "steer", "use sqlite", "--session", "m1",
                  "--target", "Executor")
        assert r.returncode == 0, r.stderr
        polled, during = anyio.run(poll, of_run(env))
        _, wrong, _, plan = anyio.run(read, of_run(env))
    taken = json.loads(polled.content[0].text)["signals"]
    assert [s["message"] for s in taken] == ["use sqlite"]
    assert json.loads(during.content[0].text)["state"] == "EXECUTING_BATCH"
    assert wrong.is_error and "expected one of" in wrong.content[0].text
    assert "t1" in plan.contents[0].text   # the plan the planner's run made


def test_an_unknown_session_is_one_line_and_exit_2(workspace):
    r = ralph(workspace, "mcp", "--session", "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nope" in r.stderr, r.stderr
    assert os.path.exists(workspace) and not (workspace / ".ralph-sessions" / "nope").exists()
    assert not session_dir(workspace, "nope").exists()


# --- bounded, typed input (issue 21): every malformed request gets an answer ---

def test_ask_refuses_a_timeout_that_is_no_wait_in_one_line_naming_it(workspace, session):
    """`"nan"` and 1e300 were a bare "Error executing tool ask" (timedelta overflowed);
    `ralph tools interact ask --timeout` takes the same check."""
    bad = ["nan", 1e300, -1, 0, 86401, True, "60", [5]]

    async def go(env):
        results = []
        async with client(workspace, **of_run(env)) as s:
            for value in bad:   # each checked at once: a valid one would wait
                result = await s.call_tool("ask", {"question": "Go on?",
                                                   "timeout_seconds": value})
                text = result.content[0].text
                assert result.is_error and "\n" not in text, (value, text)
                assert text.startswith("Error executing tool ask: timeout_seconds: "), \
                    (value, text)
                results.append(result)
        return results
    # in a run an engine holds open: a valid timeout would have asked (and waited)
    with held_run(session, "executor") as env:
        results = anyio.run(go, env)
        cli = ralph(workspace, "tools", "interact", "ask", "Go on?", "--timeout", "1e300",
                    "--session", "m1", env=base_env(**of_run(env)))
        # had any of them reached the engine, it is recorded once this mark, sent after
        # them, is (the outbox is taken in order)
        assert ralph(workspace, "emit", "after.asks", env=base_env(**of_run(env))
                     ).returncode == 0
        recorded(workspace, "after.asks")
    ranged = "expected a number of seconds above 0 and at most 86400 (a day)"
    assert [ranged in r.content[0].text for r in results] == \
        [False, True, True, True, True, False, False, False]   # the others are no numbers
    assert "got 1e+300" in results[1].content[0].text
    assert cli.returncode == 2 and ranged in cli.stderr and len(cli.stderr.splitlines()) == 1
    assert not question_files(session_dir(workspace, "m1"))
    assert "human.question" not in [e["topic"] for e in events(session_dir(workspace, "m1"))]


def test_every_malformed_line_gets_a_json_rpc_error_and_the_server_lives_on(workspace, session):
    """Raw lines the SDK's client would not send. Before, each of the protocol-level ones
    (nesting ~200 deep and deeper, garbage, no message, a number out of range, a lone
    surrogate, 17 MiB) got no reply at all: the client waited forever."""
    def call(call_id, arguments, tool="emit") -> str:
        return json.dumps({"jsonrpc": "2.0", "id": call_id, "method": "tools/call",
                           "params": {"name": tool, "arguments": arguments}})

    deep = call(1, {"topic": "a.b", "payload": "<>"}).replace('"<>"', "[" * 200 + "]" * 200)
    deeper = call("d", {"topic": "a.b", "payload": "<>"}).replace(
        '"<>"', "[" * 100_000 + "]" * 100_000)
    id_last = json.dumps({"jsonrpc": "2.0", "method": "tools/call", "params": "<>", "id": 3}
                         ).replace('"<>"', "{\"a\":" * 300 + "1" + "}" * 300)
    huge = call(9, {"topic": "a.b", "payload": "x" * (17 << 20)})
    lines = [  # (line, the reply's id, its code, what its message says)
        (deep, 1, -32700, "Parse error: nested too deeply"),
        (deeper, "d", -32700, "Parse error: nested too deeply"),
        (id_last, 3, -32700, "Parse error: nested too deeply"),
        ("garbage", None, -32700, "Parse error: expected value"),
        (b"\xff\xfe{}", None, -32700, "Parse error: not UTF-8"),
        ('{"jsonrpc": "2.0", "id": 5}', 5, -32600, "Invalid Request: expected a JSON-RPC"),
        ("[]", None, -32600, "Invalid Request"),
        ('{"jsonrpc": "1.0", "id": 6, "method": "ping"}', 6, -32600, "Invalid Request"),
        (call(7, {"topic": "a.b", "payload": "<>"}).replace('"<>"', "9" * 5000), 7, -32700,
         "Parse error: number out of range"),
        (call(8, {"topic": "a.b", "payload": "\ud800"}), 8, -32700,   # a lone surrogate
         "Parse error: unexpected end of hex escape"),
        (huge, 9, -32600, f"Invalid Request: a message longer than {16 << 20} bytes"),
    ]
    with held_run(session, "executor") as env:
        code, stderr = raw_lines(workspace, env, lines, call)
        # what the engine took of the run, while it is open (on release, the held run
        # sends its own outcome); the outbox is taken in order
        evs = recorded(workspace, "after.garbage")
    assert code == 0 and "Traceback" not in stderr, stderr
    assert [e["topic"] for e in evs if e.get("run") == env["RALPH_RUN_ID"]] == \
        ["after.garbage"], evs
    assert not [e for e in evs if e["topic"] in ("emit.refused", "cli.refused")], evs


def raw_lines(workspace, env, lines, call) -> tuple[int, str]:
    mcp = RawMcp(workspace, "m1", **of_run(env))
    for line, call_id, code, said in lines:
        mcp.send(line)
        reply = mcp.reply()
        assert reply["id"] == call_id and reply["error"]["code"] == code, (line[:80], reply)
        assert reply["error"]["message"].startswith(said), reply
    # numbers the SDK's parser reads but JSON has not: tool errors naming the argument
    for call_id, tool, arguments, said in [
            (10, "emit", '{"topic": "a.b", "payload": NaN}', "payload: NaN and infinities"),
            (11, "blocker", '{"trace": {"cause": 1e400}}', "trace: NaN and infinities"),
            (12, "ask", '{"question": "q", "timeout_seconds": NaN}', "timeout_seconds: expected"),
            (13, "ask", '{"question": "q", "timeout_seconds": -Infinity}', "timeout_seconds: "),
            (14, "ask", '{"question": "q", "timeout_seconds": 1e400}', "timeout_seconds: ")]:
        mcp.send(call(call_id, {}, tool).replace("{}", arguments))
        reply = mcp.reply()
        text = reply["result"]["content"][0]["text"]
        assert reply["id"] == call_id and reply["result"]["isError"], reply
        assert text.startswith(f"Error executing tool {tool}: {said}") and "\n" not in text
    assert mcp.call(15, "emit", {"topic": "after.garbage", "payload": "still here"})[
        "result"]["content"][0]["text"].startswith("emitted after.garbage")
    return mcp.close()
