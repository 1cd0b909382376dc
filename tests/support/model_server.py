"""A scripted model server that speaks the real wire protocols of the agent CLIs, so the
real Claude Code and Codex binaries can be driven in tests with no network and no model:

  POST /v1/messages    Anthropic Messages, streamed as server-sent events (Claude Code,
                       pointed here with ANTHROPIC_BASE_URL)
  POST /v1/responses   OpenAI Responses, streamed as server-sent events (codex, pointed here
                       by a model provider in its CODEX_HOME/config.toml)
  POST /v1beta/models/M:streamGenerateContent   Gemini, streamed as server-sent events
                       (Gemini CLI, pointed here with GOOGLE_GEMINI_BASE_URL)

It plays the model: it reads ralph's prompt from the conversation (the role, the path of
the `ralph` command the prompt gives) and the outputs of the tools it called so far, and
asks a `Brain` for the next step: a shell command for the CLI's own shell tool (Claude's
`Bash`, codex's `exec_command`, Gemini's `run_shell_command`), or the final text of the
turn. Every request body is
kept, so a test can see what the CLI sent (a human's answer reaching the next prompt).

`limit(reset)` makes it answer as each API does when the account hit its usage limit
(tests/agents/LIMITS.md), with the shape that makes each pinned CLI give up at once:
Anthropic's 429 with the subscriber's `anthropic-ratelimit-unified-*` headers (an OAuth
token) or `rate_limit_error` + `x-should-retry: false` (an API key); OpenAI's 429
`usage_limit_reached` with `resets_at`; Gemini's 429 RESOURCE_EXHAUSTED, whose only
terminal shapes say a delay over 300 s (RetryInfo) or a daily quota with no time at all.
"""
from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


ROLE = re.compile(r"^## ROLE: (\w+)", re.M)
RALPH_PATH = re.compile(r"The ralph command here is `([^`]+)`")
# codex's unified exec: a command still running after yield_time_ms comes back with its id
RUNNING = re.compile(r"Process running with session ID (\d+)")


@dataclass(slots=True)
class Shell:
    """Run `command` with the CLI's shell tool (timeout in ms where the tool takes one)."""
    command: str
    timeout_ms: int = 600_000


@dataclass(slots=True)
class Tool:
    """Call tool `name` of ralph's MCP server with `arguments`."""
    name: str
    arguments: dict


@dataclass(slots=True)
class Say:
    """End the turn with this text."""
    text: str


@dataclass(slots=True)
class Turn:
    """What the model sees of one conversation: ralph's prompt, its role, the `ralph` path
    the prompt names, and what each shell command so far printed."""
    prompt: str
    outputs: list[str]

    @property
    def role(self) -> str:
        found = ROLE.search(self.prompt)
        return found.group(1).lower() if found else ""

    @property
    def ralph(self) -> str:
        found = RALPH_PATH.search(self.prompt)
        return found.group(1) if found else "ralph"

    @property
    def step(self) -> int:
        return len(self.outputs)


class Brain:
    """The default model: plays one task through, every role by the book.

    planner: iteration 1 -> plan.ready with one task; later -> the final text LOOP_COMPLETE
    executor -> build.done with passing evidence; reviewer -> review.done; librarian -> nothing.
    Subclass and override `executor` (say) for a scenario."""

    EVIDENCE = ("tests: pass, lint: pass, typecheck: pass, audit: pass, coverage: 90, "
                "complexity: 3, duplication: pass")

    def next(self, turn: Turn) -> Shell | Tool | Say:
        return getattr(self, turn.role or "other")(turn)

    def planner(self, turn: Turn) -> Shell | Say:
        if turn.step == 0:
            return Shell('echo "iteration=$RALPH_ITERATION"')
        if "iteration=1" in turn.outputs[0]:
            if turn.step == 1:
                plan = {"tasks": [{"id": "t1", "title": "Write hello.txt",
                                   "description": "a file that says hello", "batch": 1}]}
                return Shell(f"{turn.ralph} emit plan.ready --json '{json.dumps(plan)}'")
            return Say("The plan is published.")
        return Say("Everything in the objective is done.\nLOOP_COMPLETE")

    def executor(self, turn: Turn) -> Shell | Say:
        if turn.step == 0:
            return Shell(f'echo hello > hello.txt && {turn.ralph} emit build.done '
                         f'"{self.EVIDENCE}"')
        return Say("Done: hello.txt written.")

    def reviewer(self, turn: Turn) -> Shell | Say:
        if turn.step == 0:
            return Shell(f'{turn.ralph} emit review.done "tests: pass, build: pass"')
        return Say("Reviewed.")

    def librarian(self, turn: Turn) -> Shell | Say:
        return Say("Nothing worth keeping.")

    def questioner(self, turn: Turn) -> Shell | Say:
        return Say("Nothing is ambiguous.")

    def other(self, turn: Turn) -> Shell | Say:
        # the CLIs' own side requests (titles, summaries): a short answer
        return Say("ok")


@dataclass(slots=True)
class Limit:
    """Model requests are refused at a usage limit that resets at `reset` (epoch seconds):
    until then, or only the next `requests` of them."""
    reset: int
    requests: int | None


# Gemini CLI retries a 429 that asks for at most this long (a test would wait 5 minutes)
GEMINI_MAX_RETRYABLE_SECONDS = 300


class ModelServer:
    """Serve on a free loopback port until `stop()`; `requests` keeps every request body."""

    INPUT_TOKENS, OUTPUT_TOKENS = 1200, 80   # per response: tests check tokens add up

    def __init__(self, brain: Brain | None = None):
        self.brain = brain or Brain()
        self.requests: list[dict] = []
        self.calls: list[str] = []     # every tool call it made: "shell" or "mcp:<tool>"
        self.refused = 0               # model requests answered with a usage limit
        self._limit: Limit | None = None
        self._window: tuple[float, int] | None = None   # (utilization, reset): window()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0)))
                                  or b"{}")
                path = self.path.split("?")[0]
                with server._lock:
                    server.requests.append({"path": path, "body": body})
                if path.endswith("/messages/count_tokens"):
                    return self._json({"input_tokens": server.INPUT_TOKENS})
                reset = server._limited() if path.endswith(
                    ("/messages", "/responses", ":generateContent", ":streamGenerateContent")) \
                    else None
                if reset is not None:
                    return self._json(*server._limit_answer(
                        path, reset, self.headers.get("authorization", "")))
                if path.endswith("/messages"):
                    return self._sse(server._anthropic(body), server._window_headers())
                if path.endswith("/responses"):
                    return self._sse(server._openai(body), server._codex_window_headers())
                if path.endswith(":streamGenerateContent"):
                    return self._sse([(None, server._gemini(body))])
                if path.endswith(":generateContent"):
                    # Gemini CLI's own side calls (its model router): a plain answer
                    return self._json(server._gemini_text(
                        '{"complexity_reasoning": "scripted", "complexity_score": 10}'))
                self._json({"error": {"message": f"no such endpoint {path}"}}, 404)

            def do_GET(self):
                self._json({"data": []})

            def _json(self, data, status=200, headers=()):
                raw = json.dumps(data).encode()
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _sse(self, events, headers=()):
                raw = b"".join((f"event: {name}\n" if name else "").encode()
                               + f"data: {json.dumps(data)}\n\n".encode()
                               for name, data in events)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def start(self) -> "ModelServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def bodies(self) -> list[str]:
        """Every request body as text (to look for what a CLI sent)."""
        with self._lock:
            return [json.dumps(r["body"]) for r in self.requests]

    def limit(self, reset: int, requests: int | None = None) -> None:
        """Refuse model requests as a usage limit resetting at `reset` (epoch seconds) does:
        until then, or only the next `requests` of them (a Gemini CLI run makes 2: its
        router's and its chat's). A Gemini limit less than 5 minutes away is said as a
        daily quota, with no time: the CLI would retry a shorter delay itself."""
        with self._lock:
            self._limit = Limit(reset, requests)

    def window(self, utilization: float, reset: int) -> None:
        """Answer as a subscriber's account whose 5-hour window is `utilization` (0..1) used,
        resetting at `reset` (epoch seconds): the `anthropic-ratelimit-unified-*` headers of
        every answer, a warning past 0.9 (Claude Code then streams a rate_limit_event)."""
        with self._lock:
            self._window = (utilization, reset)

    def _window_headers(self) -> list[tuple[str, str]]:
        with self._lock:
            if self._window is None:
                return []
            used, reset = self._window
        status = "allowed_warning" if used >= 0.9 else "allowed"
        return [("anthropic-ratelimit-unified-status", status),
                ("anthropic-ratelimit-unified-reset", str(reset)),
                ("anthropic-ratelimit-unified-representative-claim", "five_hour"),
                ("anthropic-ratelimit-unified-5h-status", status),
                ("anthropic-ratelimit-unified-5h-reset", str(reset)),
                ("anthropic-ratelimit-unified-5h-utilization", str(used))] + (
            [("anthropic-ratelimit-unified-5h-surpassed-threshold", "0.9")]
            if used >= 0.9 else [])

    def _codex_window_headers(self) -> list[tuple[str, str]]:
        """The same window as OpenAI's answers say it to Codex (`x-codex-primary-*`: used
        percent, window minutes, reset in epoch seconds)."""
        with self._lock:
            if self._window is None:
                return []
            used, reset = self._window
        return [("x-codex-primary-used-percent", f"{used * 100:g}"),
                ("x-codex-primary-window-minutes", "300"),
                ("x-codex-primary-reset-at", str(reset)),
                ("x-codex-primary-reset-after-seconds", str(max(0, reset - int(time.time()))))]

    def lift(self) -> None:
        """The limit is over: answer as the model again."""
        with self._lock:
            self._limit = None

    def _limited(self) -> int | None:
        """The reset of the limit this request meets (and counts it), or None."""
        with self._lock:
            limit = self._limit
            if limit is None or limit.requests is None and time.time() >= limit.reset:
                self._limit = None
                return None
            if limit.requests is not None:
                limit.requests -= 1
                if limit.requests <= 0:
                    self._limit = None
            self.refused += 1
            return limit.reset

    def _limit_answer(self, path: str, reset: int, authorization: str):
        """(body, status, headers) of each API's usage-limit error."""
        if path.endswith("/messages"):
            error = {"type": "error", "error": {"type": "rate_limit_error", "message":
                     "This request would exceed your account's rate limit. "
                     "Please try again later."}}
            if authorization.startswith("Bearer "):   # a claude.ai subscriber's OAuth token
                headers = [("anthropic-ratelimit-unified-status", "rejected"),
                           ("anthropic-ratelimit-unified-reset", str(reset)),
                           ("anthropic-ratelimit-unified-representative-claim", "five_hour"),
                           ("anthropic-ratelimit-unified-5h-status", "rejected"),
                           ("anthropic-ratelimit-unified-5h-reset", str(reset)),
                           ("anthropic-ratelimit-unified-5h-utilization", "1.0")]
            else:   # an API key: no reset is said; this one is not to be retried
                headers = [("x-should-retry", "false")]
            return error, 429, headers
        if path.endswith("/responses"):
            return {"error": {"type": "usage_limit_reached", "message":
                              "The usage limit has been reached", "plan_type": "plus",
                              "resets_at": reset,
                              "resets_in_seconds": max(0, reset - int(time.time()))}}, 429, [
                ("x-codex-primary-used-percent", "100"),
                ("x-codex-primary-window-minutes", "300"),
                ("x-codex-primary-reset-at", str(reset))]
        delay = reset - int(time.time())
        if delay > GEMINI_MAX_RETRYABLE_SECONDS:
            message, detail = "Resource has been exhausted (e.g. check quota).", {
                "@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{delay}s"}
        else:
            message, detail = (
                "You exceeded your current quota, please check your plan and billing details. "
                "* Quota exceeded for metric: generativelanguage.googleapis.com/"
                "generate_content_free_tier_requests, limit: 250, model: scripted"), {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                    "quotaMetric": "generativelanguage.googleapis.com/"
                                   "generate_content_free_tier_requests",
                    "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}
        return {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED",
                          "details": [detail]}}, 429, []

    def _decide(self, prompt: str, outputs: list[str]) -> Shell | Tool | Say:
        step = self.brain.next(Turn(prompt, outputs)) if prompt else Say("ok")
        if not isinstance(step, Say):
            with self._lock:
                self.calls.append("shell" if isinstance(step, Shell) else f"mcp:{step.name}")
        return step

    # --- Anthropic Messages ---

    def _anthropic(self, body: dict) -> list[tuple[str, dict]]:
        prompt, outputs = "", []
        for message in body.get("messages", []):
            content = message.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for block in blocks or []:
                if block.get("type") == "text" and message["role"] == "user" and not prompt \
                        and "## OBJECTIVE" in block.get("text", ""):
                    prompt = block["text"]
                elif block.get("type") == "tool_result":
                    outputs.append(_text_of(block.get("content")))
        step = self._decide(prompt, outputs)
        n = next(self._ids)
        usage = {"input_tokens": self.INPUT_TOKENS, "output_tokens": self.OUTPUT_TOKENS,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        events = [("message_start", {"type": "message_start", "message": {
            "id": f"msg_{n}", "type": "message", "role": "assistant",
            "model": body.get("model", "scripted"), "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}})]
        if isinstance(step, (Shell, Tool)):
            name, arguments = ("Bash", {"command": step.command, "description": "run a command",
                                        "timeout": step.timeout_ms}) \
                if isinstance(step, Shell) else (f"mcp__ralph__{step.name}", step.arguments)
            block = {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(arguments)}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": step.text}
            stop = "end_turn"
        events += [
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": self.OUTPUT_TOKENS}}),
            ("message_stop", {"type": "message_stop"})]
        return events

    # --- OpenAI Responses ---

    def _openai(self, body: dict) -> list[tuple[str, dict]]:
        prompt, outputs, running = "", [], None
        for item in body.get("input", []):
            if item.get("type") == "message" and item.get("role") == "user" and not prompt:
                text = _text_of(item.get("content"))
                if "## OBJECTIVE" in text:
                    prompt = text
            elif item.get("type") == "function_call_output":
                output = _tool_text(_text_of(item.get("output")))
                found = RUNNING.search(output)
                if running is not None:   # the polled command's output continues
                    outputs[-1] += output
                else:
                    outputs.append(output)
                running = found.group(1) if found else None
        n = next(self._ids)
        if running is not None:
            # the command is still running (a blocking ask, a long build): wait for it
            item = _call(n, "write_stdin", {"session_id": int(running), "chars": "",
                                            "yield_time_ms": 30000})
        else:
            step = self._decide(prompt, outputs)
            if isinstance(step, Shell):
                item = _call(n, "exec_command", {"cmd": step.command,
                                                 "yield_time_ms": 30000})
            elif isinstance(step, Tool):   # MCP tools come as a namespace of functions
                item = {**_call(n, step.name, step.arguments), "namespace": "mcp__ralph"}
            else:
                item = {"type": "message", "role": "assistant", "id": f"msg_{n}",
                        "content": [{"type": "output_text", "text": step.text,
                                     "annotations": []}]}
        response = {"id": f"resp_{n}", "object": "response", "status": "completed",
                    "model": body.get("model", "scripted"), "output": [item],
                    "usage": {"input_tokens": self.INPUT_TOKENS,
                              "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens": self.OUTPUT_TOKENS,
                              "output_tokens_details": {"reasoning_tokens": 0},
                              "total_tokens": self.INPUT_TOKENS + self.OUTPUT_TOKENS}}
        return [
            ("response.created", {"type": "response.created",
                                  "response": {**response, "status": "in_progress",
                                               "output": []}}),
            ("response.output_item.added", {"type": "response.output_item.added",
                                            "output_index": 0, "item": item}),
            ("response.output_item.done", {"type": "response.output_item.done",
                                           "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": response})]


    # --- Gemini ---

    def _gemini(self, body: dict) -> dict:
        prompt, outputs = "", []
        for content in body.get("contents", []):
            for part in content.get("parts") or []:
                if "text" in part and content.get("role") == "user" and not prompt \
                        and "## OBJECTIVE" in part["text"]:
                    prompt = part["text"]
                elif "functionResponse" in part:
                    response = part["functionResponse"].get("response") or {}
                    outputs.append(_text_of(response.get("output") or response))
        step = self._decide(prompt, outputs)
        if isinstance(step, Shell):
            return self._gemini_reply([{"functionCall": {
                "name": "run_shell_command",
                "args": {"command": step.command, "description": "run a command"}}}])
        return self._gemini_text(step.text)

    def _gemini_text(self, text: str) -> dict:
        return self._gemini_reply([{"text": text}])

    def _gemini_reply(self, parts: list[dict]) -> dict:
        return {"candidates": [{"content": {"role": "model", "parts": parts},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": self.INPUT_TOKENS,
                                  "candidatesTokenCount": self.OUTPUT_TOKENS,
                                  "totalTokenCount": self.INPUT_TOKENS + self.OUTPUT_TOKENS},
                "modelVersion": "scripted"}


def _call(n: int, name: str, arguments: dict) -> dict:
    return {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}


def _tool_text(output: str) -> str:
    """codex heads an MCP tool's result with its own lines ("Wall time: ...", "Output:"):
    the model reads the tool's text after them."""
    if output.startswith("Wall time:") and "\nOutput:" in output:
        return output.split("\nOutput:", 1)[1].lstrip("\n")
    return output


def _text_of(content) -> str:
    """The text of a message's or a tool result's content, in either API's shapes."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return content.get("text") or content.get("output") or ""
    return "".join(_text_of(c) for c in content)
