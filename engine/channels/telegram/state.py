"""The bot's memory, kept by the store as the channel's state (`ChannelFiles`), JSON
(which YAML readers read too), never the token. It holds the getUpdates offset, which
message asked which question (so a reply finds its question), and per session the seq
up to which the bus was read and handled, and the seq of the last record a notice went
out for.

It lives on the bot's event loop; saving it is a durable write (temp, fsync, rename,
fsync dir), done in a worker thread, one at a time, with the requests that come
meanwhile folded into one more write.
"""
from __future__ import annotations

import asyncio
import json

from ralph.session_store import BadInput, ChannelFiles, Sessions, parse_yaml

from .settings import Log

MAX_MESSAGES = 2000   # question messages remembered (replies to older ones are text)
LATER = 2.0           # seconds a save of bus cursors alone may wait (they change often)


class BotState:
    def __init__(self, files: ChannelFiles, sessions: Sessions, log: Log):
        self.files = files
        self.sessions = sessions
        self._log = log
        self.update_offset: int | None = None    # Telegram's getUpdates offset
        self.messages: dict[str, dict] = {}      # "chat:message_id" -> {session, question}
        self.read_seqs: dict[str, int] = {}      # session -> bus seq read and handled
        self.notified: dict[str, int] = {}       # session -> seq of the last record noticed
        self.existed = False
        self._lock: asyncio.Lock | None = None
        self._wanted = False
        self._later: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()

    # --- reading (synchronous: called in a worker thread) ---

    @classmethod
    def load(cls, files: ChannelFiles, sessions: Sessions, log: Log) -> "BotState":
        state = cls(files, sessions, log)
        path = files.state_path
        try:
            raw = files.read_state()
        except OSError as e:
            log(f"{path}: unreadable ({e.strerror}); starting from an empty state")
            return state
        if raw is None:
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
            state.read_seqs = {str(k): int(v) for k, v in (data.get("read_seqs") or {}).items()}
            # a bot before seqs kept byte offsets: its sessions go on from where their
            # buses end now (as a first run does), never replayed from the start
            for sid in (data.get("event_offsets") or {}):
                if str(sid) not in state.read_seqs and str(sid) in sessions.ids():
                    state.read_seqs[str(sid)] = sessions.last_seq(str(sid))
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
                        "read_seqs": dict(self.read_seqs),
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
        """A save within LATER seconds, for what may change again soon (bus cursors)."""
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
        alive = set(self.sessions.ids())
        named = {v["session"] for v in snapshot["messages"].values()} \
            | set(snapshot["read_seqs"]) | set(snapshot["notified"])
        gone = named - alive
        snapshot["messages"] = {k: v for k, v in snapshot["messages"].items()
                                if v["session"] not in gone}
        for key in ("read_seqs", "notified"):
            snapshot[key] = {k: v for k, v in snapshot[key].items() if k not in gone}
        self.files.write_state(json.dumps(snapshot, indent=1, sort_keys=True) + "\n",
                               "telegram-state")
        return gone

    def _forget(self, gone: set[str]) -> None:
        for key in [k for k, v in self.messages.items() if v["session"] in gone]:
            del self.messages[key]
        for table in (self.read_seqs, self.notified):
            for sid in gone & set(table):
                del table[sid]
