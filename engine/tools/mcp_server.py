"""`ralph mcp`: the agent's tools as an MCP server over stdio, bound to one session.

The same verbs as `ralph emit` and `ralph tools ...`, with the same checks (a dotted
topic, the blocker and confidence schemas, the run's own lease: an event of a run that
is over is refused; the quality gates judge the run's events when the engine collects
them, however they came) and the same one-line errors, returned as MCP tool errors (an
argument of the wrong type too, naming it); a line that is no message gets its JSON-RPC
error from mcp_wire. `ask` blocks until a human answers, and reports progress to the client meanwhile so that
it does not give up. Built on the official `mcp` SDK; started for every agent run, so it
imports the SDK and, until a tool needs more (a question, a poll, the status), little
else.
"""
from __future__ import annotations

import json
import os
import signal
import time
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Strict, ValidationError

from ralph.session_store import BadInput, DiskFault, shown

from ..version import version
from .emit import EmitError, check, max_event_bytes, publish, report_refusal
from .mcp_wire import serve_stdio

# seconds between progress notifications while `ask` waits (tests shorten it)
PROGRESS_EVERY = float(os.environ.get("RALPH_TEST_MCP_PROGRESS_EVERY") or 10.0)

INSTRUCTIONS = (
    "ralph runs you as one role (planner, executor, reviewer, librarian, questioner) of a "
    "durable, human-steered session. Report your outcome with `emit` (the last event of "
    "your run), ask a human with `ask` when only a human can decide, tell them how it goes "
    "with `progress`, and take the guidance sent to you with `signals_poll` at your step "
    "boundaries.")


class ToolServer(MCPServer):
    """The SDK's server, with a tool's argument errors in one line naming the argument
    (pydantic's own take four lines and a URL)."""

    async def call_tool(self, name, arguments, context=None):
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as e:
            if not isinstance(e.__cause__, ValidationError):
                raise
            raise ToolError(f"Error executing tool {name}: "
                            f"{argument_error(e.__cause__)}") from e.__cause__


def argument_error(error: ValidationError) -> str:
    """'timeout_seconds: input should be a valid number, got 'soon'' for the first of
    `error`'s mistakes (and how many more there are)."""
    errors = error.errors(include_url=False)
    first = errors[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
    if first["type"] == "missing":
        what = "required argument missing"
    else:
        what = f"{first['msg'][:1].lower()}{first['msg'][1:]}, got {shown(first.get('input'))}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where.lstrip('.')}: {what}{more}"


def build(work_dir: str) -> MCPServer:
    """The server of the session whose work area is `work_dir` (RALPH_SESSION_DIR): what
    it sends goes through the outbox there, as the run's; what it reads, the store."""
    workspace = os.path.dirname(os.path.dirname(work_dir))
    session_id = os.path.basename(work_dir)
    server = ToolServer("ralph", version=version(), instructions=INSTRUCTIONS,
                        log_level="WARNING")
    waits: set = set()   # the Waiting of each `ask` that waits now

    def publish_checked(topic: str, payload, argument: str = "payload") -> str:
        try:
            # the SDK's parser reads NaN and 1e400 (infinity): not JSON, and the bus is JSON
            json.dumps(payload, allow_nan=False)
        except ValueError:
            raise ToolError(f"{argument}: NaN and infinities are not JSON numbers") from None
        try:
            check(topic, payload, argument, max_event_bytes(work_dir))
            publish(work_dir, topic, payload)
        except EmitError as e:
            report_refusal(work_dir, f"mcp emit {str(topic)[:80]}", str(e))
            raise ToolError(str(e)) from None
        except (BadInput, DiskFault) as e:
            raise ToolError(str(e)) from None
        return f"emitted {topic}"

    @server.tool(structured_output=False, description=(
        "Publish an event on the session's bus: your role's outcome, e.g. plan.ready with "
        "{\"tasks\": [{\"id\", \"title\", \"description\", \"batch\"}]}, build.done with "
        "the evidence \"tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 85, "
        "complexity: 4, duplication: pass\", build.blocked / task.failed with why, review.done "
        "with \"tests: pass, build: pass\", review.rejected with what is wrong, "
        "knowledge.staged, LOOP_COMPLETE when nothing is left, human.interact with a question "
        "to be answered after this run. The outcome must be the last event of your run. "
        "payload: a string or a JSON value."))
    def emit(topic: str, payload: str | dict | list | int | float | bool | None = None) -> str:
        return publish_checked(topic, payload)

    @server.tool(structured_output=False, description=(
        "Ask a human and wait for the answer (it may take minutes: keep waiting). Give "
        "options and a default when you can. Returns the answer; when nobody answers in "
        "time, returns the default (or says there is none), and you go on with it."))
    async def ask(question: str, ctx: Context, options: list[str] | None = None,
                  default: str | None = None,
                  # a JSON number (not "60", not true); its range is ask_seconds'
                  timeout_seconds: Annotated[float, Strict()] | None = None) -> str:
        from .interact import Waiting, ask_and_wait
        waiting = Waiting()
        waits.add(waiting)
        result: list = []
        started = time.monotonic()

        def wait() -> None:
            try:
                result.append(ask_and_wait(question, timeout=timeout_seconds, default=default,
                                           options=options or [], work_dir=work_dir,
                                           waiting=waiting, timeout_name="timeout_seconds"))
            except BaseException as e:   # noqa: BLE001 - handed to the async side
                result.append(e)
            finally:
                waits.discard(waiting)   # only now: a stopping server waits for this

        try:
            async with anyio.create_task_group() as group:
                async def report() -> None:
                    while True:
                        await anyio.sleep(PROGRESS_EVERY)
                        await ctx.report_progress(time.monotonic() - started, None,
                                                  "waiting for a human's answer")

                group.start_soon(report)
                await anyio.to_thread.run_sync(wait, abandon_on_cancel=True)
                group.cancel_scope.cancel()
        finally:
            if not result:          # the call was cancelled: the answer goes to a next run
                waiting.cancel()
        outcome = result[0]
        if isinstance(outcome, (BadInput, DiskFault)):
            raise ToolError(str(outcome))
        if isinstance(outcome, BaseException):
            raise outcome
        answer, answered = outcome
        if answered:
            return answer
        return f"no answer in time; the default: {answer}" if answer is not None else \
            "no answer in time, and no default: decide yourself and note it"

    @server.tool(structured_output=False, description="Tell the human how it goes (non-blocking, one line).")
    def progress(message: str) -> str:
        return publish_checked("human.progress", message, "message").replace(
            "emitted human.progress", "progress noted")

    @server.tool(structured_output=False, description=(
        "Take the guidance (STEER / INFO) humans sent to your role while you run; call it "
        "at your step boundaries. Also lists a PAUSE or ABORT the engine will act on."))
    def signals_poll(role: str | None = None) -> str:
        from .signals import poll
        try:
            return json.dumps(poll(work_dir, role or os.environ.get("RALPH_ROLE") or ""))
        except (BadInput, DiskFault) as e:
            raise ToolError(str(e)) from None

    @server.tool(structured_output=False, description=(
        "Report a blocker (last resort: a missing credential, access denied, a decision "
        "only a human can make) with the seed 003 trace: {\"type\": \"blocker\", "
        "\"timestamp\", \"project\", \"issue\", \"attempting\", \"cause\", "
        "\"attempted_resolution\": [...], \"interpretation\"}. The same cause three times "
        "pauses the session for a human."))
    def blocker(trace: dict) -> str:
        return publish_checked("blocker", trace, "trace")

    @server.tool(structured_output=False, description="The session now: state, iteration, tasks, pending question.")
    def status() -> str:
        from ..views import session_view
        try:
            view = session_view(workspace, session_id, last_events=5)
        except BadInput as e:
            raise ToolError(str(e)) from None
        return json.dumps(view, default=str)

    def iteration():
        from ralph.session_store import load
        return load(workspace, session_id).iteration()

    @server.resource("ralph://plan", mime_type="text/markdown",
                     description="The current iteration's plan.")
    def plan() -> str:
        return iteration().plan_text() or "(no plan yet)"

    @server.resource("ralph://progress", mime_type="text/markdown",
                     description="The current iteration's task markers (progress.md).")
    def progress_md() -> str:
        return iteration().progress_text() or "(no tasks yet)"

    @server.resource("ralph://scratchpad", mime_type="text/markdown",
                     description="The session's scratchpad: notes and human guidance.")
    def scratchpad() -> str:
        from ralph.session_store import load
        return load(workspace, session_id).scratchpad() or ""

    def stop(_signum, _frame) -> None:
        # the run is being stopped: a question waited on stays answerable, and its answer
        # goes to the next run of this unit of work; a signal being taken is marked first
        for waiting in list(waits):
            waiting.cancel()
        deadline = time.monotonic() + 2
        while waits and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(143)

    signal.signal(signal.SIGTERM, stop)
    return server


def serve(work_dir: str) -> None:
    if not os.path.isdir(work_dir):
        raise BadInput(f"{work_dir}: no such session directory")
    anyio.run(serve_stdio, build(work_dir))

