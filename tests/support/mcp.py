"""A real `ralph mcp` driven by raw JSON-RPC lines on its stdin: what the SDK's client
would never send (garbage, deep nesting, NaN, lines of 17 MiB), one line at a time."""
from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
from pathlib import Path

import pytest

from .cli import RALPH, base_env

REPLY_WITHIN = 60   # seconds: a reply that has not come by then never comes (a hang guard)


class RawMcp:
    def __init__(self, workspace: Path, session_id: str, **env):
        self._stderr = tempfile.TemporaryFile()   # a pipe left unread could fill and block it
        self.proc = subprocess.Popen([*RALPH, "mcp", "--session", session_id], cwd=workspace,
                                     env=base_env(**env), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        self._buffer = b""
        self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
        assert "result" in self.reply(), "ralph mcp did not initialize"
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict | str | bytes) -> None:
        """A message as JSON, or a line as it is (its newline added)."""
        line = json.dumps(message) if isinstance(message, dict) else message
        self.proc.stdin.write((line.encode() if isinstance(line, str) else line) + b"\n")
        self.proc.stdin.flush()

    def reply(self) -> dict:
        """The next response (the server's own notifications and requests skipped)."""
        while True:
            message = json.loads(self._line())
            if "method" not in message:
                return message

    def call(self, call_id, tool: str, arguments) -> dict:
        self.send({"jsonrpc": "2.0", "id": call_id, "method": "tools/call",
                   "params": {"name": tool, "arguments": arguments}})
        return self.reply()

    def close(self) -> tuple[int, str]:
        """(exit code, stderr) once its input is closed."""
        self.proc.stdin.close()
        code = self.proc.wait(timeout=REPLY_WITHIN)
        self._stderr.seek(0)
        return code, self._stderr.read().decode(errors="replace")

    def _line(self) -> bytes:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if not select.select([fd], [], [], REPLY_WITHIN)[0]:
                self.proc.kill()
                pytest.fail(f"ralph mcp sent no reply within {REPLY_WITHIN}s")
            chunk = os.read(fd, 1 << 16)   # not through the file object: select sees it all
            if not chunk:
                pytest.fail("ralph mcp closed its output")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line
