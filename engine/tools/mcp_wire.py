"""`ralph mcp`'s stdin: every line the client sends gets an answer.

The SDK's stdio transport parses each line with the protocol's model, and a line that
fails (not JSON, not a JSON-RPC message, nested past its parser's recursion limit of
about 200 levels, a number out of range, a lone surrogate) goes to the server as an
exception, which logs it and answers nothing: the client waits forever for the reply to
its id. Here each line is parsed the same way first, and one that fails is answered at
once as JSON-RPC says (-32700 for what is no JSON the parser takes, -32600 for JSON that
is no message), with the request's id when one is found; a line past MAX_LINE is refused
as it streams, never held whole. The lines that parse go to the SDK's own transport as
they came, which parses them again: 4 us for a tool call, 0.2 ms for a 1 MiB string,
23 ms for 850 KB of 20,000 small objects (bypassing its reader means copying its stdout
handling too).
"""
from __future__ import annotations

import json
import re
import sys
from typing import BinaryIO

import anyio
import mcp_types
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

# The longest line read: past any event the bus takes (1 MiB by default) however it is
# escaped in JSON, and a bound on what one message can make the server hold.
MAX_LINE = 16 << 20
_ID_WINDOW = 1 << 16   # how far into a refused line its id is looked for
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')
_INT_ID = re.compile(r"-?[0-9]{1,18}")


class CheckedLines:
    """The client's lines as the SDK's stdio transport iterates them (text), only those
    that parse as JSON-RPC messages; each other one is answered on `answer_with`'s stream."""

    def __init__(self, source: BinaryIO):
        self._source = source
        self._write = None
        self._ready = anyio.Event()

    def answer_with(self, write_stream) -> None:
        self._write = write_stream
        self._ready.set()

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        while True:
            line, whole = await anyio.to_thread.run_sync(self._read_line,
                                                         abandon_on_cancel=True)
            if not line:
                raise StopAsyncIteration
            refusal = (-32600, f"Invalid Request: a message longer than {MAX_LINE} bytes") \
                if not whole else None
            if whole:
                text, refusal = _checked(line)
                if text is not None:
                    return text
            if refusal is not None:
                await self._refuse(line, *refusal)

    def _read_line(self) -> tuple[bytes, bool]:
        """(the next line, True), or (its first MAX_LINE bytes, False) with the rest read
        and dropped; b'' at the end of the input."""
        line = self._source.readline(MAX_LINE + 1)
        if len(line) <= MAX_LINE or line.endswith(b"\n"):
            return line, True
        rest = line
        while rest and not rest.endswith(b"\n"):
            rest = self._source.readline(_ID_WINDOW)
        return line[:MAX_LINE], False

    async def _refuse(self, line: bytes, code: int, message: str) -> None:
        await self._ready.wait()
        reply = mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id(line),
                                       error=mcp_types.ErrorData(code=code, message=message))
        try:
            await self._write.send(SessionMessage(reply))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass   # the server is closing: nobody is left to answer


def _checked(line: bytes) -> tuple[str | None, tuple[int, str] | None]:
    """(the line as text, None) when it is a JSON-RPC message as the SDK reads it;
    (None, (code, message)) when it is not; (None, None) for a blank line."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, (-32700, f"Parse error: not UTF-8 (byte {e.start})")
    if not text.strip(" \t\r\n"):   # JSON's own whitespace: nothing was sent
        return None, None
    try:
        mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValidationError as e:
        errors = e.errors(include_url=False, include_input=False)
        invalid = next((x["msg"] for x in errors if x["type"] == "json_invalid"), None)
        if invalid is None:
            return None, (-32600, "Invalid Request: expected a JSON-RPC 2.0 request, "
                                  "notification or response object")
        why = invalid.removeprefix("Invalid JSON: ")
        if why.startswith("recursion limit exceeded"):
            why = "nested too deeply" + why[len("recursion limit exceeded"):]
        return None, (-32700, f"Parse error: {why}")
    return text, None


def request_id(line: bytes) -> int | str | None:
    """The top-level `id` of a refused line, found in its first bytes by a scan that
    needs no whole parse (the line may be nested past any parser, or cut); None when
    there is none to find."""
    text = line[:_ID_WINDOW].decode("utf-8", errors="replace")
    tokens = _TOKENS.findall(text)
    if tokens[:1] != ["{"]:
        return None
    depth = 0
    for i, token in enumerate(tokens):
        if token in ("{", "["):
            depth += 1
        elif token in ("}", "]"):
            depth -= 1
        elif depth == 1 and token == '"id"' and tokens[i + 1:i + 2] == [":"]:
            value = tokens[i + 2] if i + 2 < len(tokens) else ""
            if _INT_ID.fullmatch(value):
                return int(value)
            if value.startswith('"'):
                try:   # a lone surrogate ("\ud800") is no text the reply could carry
                    found = json.loads(value)
                    found.encode("utf-8")
                except ValueError:
                    return None
                return found
            return None
    return None


async def serve_stdio(server: MCPServer) -> None:
    """What MCPServer.run("stdio") runs, with stdin read by CheckedLines. The SDK keeps
    stdout (its claim of fd 1: stray prints of a handler miss the wire)."""
    lines = CheckedLines(sys.stdin.buffer)
    async with stdio_server(stdin=lines) as (read_stream, write_stream):
        lines.answer_with(write_stream)
        lowlevel = server._lowlevel_server   # MCPServer has no public handle to it
        await lowlevel.run(read_stream, write_stream,
                           lowlevel.create_initialization_options())
