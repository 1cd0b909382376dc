"""The bot's memory: `.ralph-sessions/.telegram/state.yaml`, JSON (which YAML readers
read too), never the token. It holds the getUpdates offset, which message asked which
question (so a reply finds its question), and per session how far the bus was read and
the last record a notice went out for.

It lives on the bot's event loop; saving it is a durable write (session_store's
write_atomic: temp, fsync, rename, fsync dir), done in a worker thread, one at a time,
with the requests that come meanwhile folded into one more write.
"""
from __future__ import annotations

import asyncio
import json
import os

from session_store import BadInput, list_ids, make_dirs, parse_yaml, write_atomic

from .settings import Log

MAX_MESSAGES = 2000   # question messages remembered (replies to older ones are text)
LATER = 2.0           # seconds a save of bus offsets alone may wait (they change often)


class BotState:
    def __init__(self, path: str, workspace: str, log: Log):
        self.path = path
        self.ws = workspace
        self._log = log
        self.update_offset: int | None = None
        self.messages: dict[str, dict] = {}      # "chat:message_id" -> {session, question}
        self.event_offsets: dict[str, int] = {}  # session -> bus offset read and handled
        self.notified: dict[str, int] = {}       # session -> seq of the last record noticed
        self.existed = False
        self._lock: asyncio.Lock | None = None
        self._wanted = False
        self._later: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()

    # --- reading (synchronous: called in a worker thread) ---

    @classmethod
    def load(cls, path: str, workspace: str, log: Log) -> "BotState":
        state = cls(path, workspace, log)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return state
        state.existed = True
        try:
            try:
                data = json.loads(raw)
            except ValueError:   # edited by hand into YAML
                data = parse_yaml(raw, path)
            offset = data.get("update_offset")
            state.update_offset = offset if isinstance(offset, int) else None
            state.messages = {str(k): {"session": str(v["session"]),
                                       "question": str(v["question"])}
                              for k, v in (data.get("messages") or {}).items()}
            state.event_offsets = {str(k): int(v)
                                   for k, v in (data.get("event_offsets") or {}).items()}
            state.notified = {str(k): int(v) for k, v in (data.get("notified") or {}).items()}
        except (BadInput, ValueError, TypeError, KeyError, AttributeError):
            log(f"{path}: unreadable; starting from an empty state")
        return state

    # --- the message map ---

    def question_for(self, chat: int, message_id: int) -> tuple[str, str] | None:
        entry = self.messages.get(f"{chat}:{message_id}")
        return (entry["session"], entry["question"]) if entry else None

    def remember(self, chat: int, message_id: int, sid: str, qid: str) -> None:
        self.messages[f"{chat}:{message_id}"] = {"session": sid, "question": qid}

    def sent(self) -> set[tuple[str, str]]:
        return {(v["session"], v["question"]) for v in self.messages.values()}

    # --- saving ---

    async def save(self) -> None:
        """Write the state now (off the loop); a failure is logged."""
        self._wanted = True
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._wanted:
                return   # a write that began after our request has saved it
            self._wanted = False
            if len(self.messages) > MAX_MESSAGES:   # oldest first: dicts keep insertion order
                for key in list(self.messages)[:len(self.messages) - MAX_MESSAGES]:
                    del self.messages[key]
            snapshot = {"update_offset": self.update_offset, "messages": dict(self.messages),
                        "event_offsets": dict(self.event_offsets),
                        "notified": dict(self.notified)}
            try:
                gone = await asyncio.to_thread(self._write, snapshot)
            except Exception as e:
                self._log.error("could not save the bot state", e)
                return
            self._forget(gone)

    def save_soon(self) -> None:
        """A save that nobody waits for (it still runs off the loop)."""
        task = asyncio.get_running_loop().create_task(self.save())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def save_later(self) -> None:
        """A save within LATER seconds, for what may change again soon (bus offsets)."""
        if self._later is None:
            def due():
                self._later = None
                self.save_soon()
            self._later = asyncio.get_running_loop().call_later(LATER, due)

    async def close(self) -> None:
        """The last save, after every save under way."""
        if self._later is not None:
            self._later.cancel()
            self._later = None
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.save()

    def _write(self, snapshot: dict) -> set[str]:
        """The worker thread's part: written without the sessions that are gone; returns
        those."""
        alive = set(list_ids(self.ws))
        named = {v["session"] for v in snapshot["messages"].values()} \
            | set(snapshot["event_offsets"]) | set(snapshot["notified"])
        gone = named - alive
        snapshot["messages"] = {k: v for k, v in snapshot["messages"].items()
                                if v["session"] not in gone}
        for key in ("event_offsets", "notified"):
            snapshot[key] = {k: v for k, v in snapshot[key].items() if k not in gone}
        make_dirs(os.path.dirname(self.path))
        write_atomic(self.path, json.dumps(snapshot, indent=1, sort_keys=True) + "\n",
                     "telegram-state")
        return gone

    def _forget(self, gone: set[str]) -> None:
        for key in [k for k, v in self.messages.items() if v["session"] in gone]:
            del self.messages[key]
        for table in (self.event_offsets, self.notified):
            for sid in gone & set(table):
                del table[sid]
