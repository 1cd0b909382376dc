"""The engine's side of the outbox: what agents' tools sent, read, checked and recorded.

Nothing in a line is trusted. The source of what it says is the run the engine opened
(its role), never the line's own claim; a line of another run, or of a run that is over,
is refused; a topic only the engine or a human may say (`session.*`, `human.response`,
...) is refused; a request past the size cap is refused unread. Each refusal is recorded
on the bus as `emit.refused` with the reason. Questions go to the human desk, polls to
the mailbox, tool calls to approve to the approvals, and their replies back to the work
area's inbox.
"""
from __future__ import annotations

import json
import os
import re
from typing import Callable, NamedTuple

from session_store import (REFUSED, Outbox, OutboxLine, hold_engine_lock, holds_engine_lock,
                           outbox)

from .tools.emit import EmitError, check

_REQUEST_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SHOWN_BYTES = 4096   # of a refused payload, what its record keeps


class RunInfo(NamedTuple):
    """The agent run the engine has open: who speaks through its outbox lines."""
    id: str
    role: str
    task: str | None


class Inlet:
    def __init__(self, session, *, max_bytes: int,
                 on_ask: Callable[[dict, RunInfo, list], dict | None],
                 on_ask_gone: Callable[[str], None],
                 on_poll: Callable[[str], dict],
                 on_approve: Callable[[dict, RunInfo, list], dict | None]):
        self.session = session
        self.max_bytes = max_bytes
        self._outbox = Outbox(session.work, max_bytes)
        self._on_ask = on_ask            # -> a reply now (refused), or None (the desk replies)
        self._on_ask_gone = on_ask_gone
        self._on_poll = on_poll
        self._on_approve = on_approve    # a CLI's hook: a tool call to approve
        self._runs: dict[str, RunInfo] = {}   # the open runs (several in a parallel batch)
        self._presence: int | None = None
        self._replied = True   # replies may be in the inbox (a dead engine's, say)

    def is_open(self, run_id: str) -> bool:
        return run_id in self._runs

    def start(self) -> None:
        """Hold the work area (agents' tools see an engine), refuse what a dead engine's
        runs sent and nobody read, and begin with no run open."""
        self._presence = hold_engine_lock(self.session.work)
        try:
            last = self.session.last_event(lambda r: isinstance(r.get("via"), list))
            for line in self._outbox.recover(last["via"] if last else None):
                request = line.request or {}
                self._refuse(line, request, line.problem or (
                    "its run ended with the engine that ran it" if request.get("run")
                    else "no engine was running the session to take it"))
            self._outbox.reset([], self._take)
        except BaseException:
            os.close(self._presence)
            self._presence = None
            raise

    def stop(self) -> None:
        if self._presence is not None:
            os.close(self._presence)
            self._presence = None
        self.session.work.close()

    def open_run(self, run: RunInfo) -> None:
        """From now on, lines of `run` are taken as its role's (each run's as its own)."""
        if self._presence is None:   # a runner driven without the engine's loop (a test's)
            self.start()
        self._reclaim()
        self._outbox.reset([*self._runs, run.id], self._take)
        if self._replied and not self._runs:   # replies of runs before: nobody waits now
            self.session.work.clear(outbox.INBOX)
            self._replied = False
        else:   # there for the run's tools to watch (made anew if removed or swapped)
            os.close(self.session.work.dir_fd(outbox.INBOX))
        self._runs[run.id] = run

    def _reclaim(self) -> None:
        """The work area as the last run left it: whatever it removed or swapped for a
        link (a `git clean` of the workspace, say) is reached anew, and the engine's
        presence there held again, so this run's tools find their engine."""
        work = self.session.work
        work.refresh(outbox.INBOX)
        if not holds_engine_lock(work, self._presence):
            os.close(self._presence)
            self._presence = hold_engine_lock(work)

    def close_run(self, run_id: str) -> None:
        """The run is over: what it sent until now is taken, nothing after."""
        others = [r for r in self._runs if r != run_id]
        try:
            try:
                self._outbox.reset(others, self._take)
            except FileNotFoundError:   # the run removed its work area: made again
                self._reclaim()
                self._outbox.reset(others, self._take)
        finally:
            self._runs.pop(run_id, None)

    def drain(self) -> None:
        """Take what arrived since the last look (on every wakeup while an agent runs)."""
        self._take(self._outbox.read_new())

    def reply(self, request_id: str, data: dict) -> None:
        if _REQUEST_ID.fullmatch(request_id):
            self.session.work.write(f"{outbox.INBOX}/{request_id}.json", json.dumps(data),
                                    "reply")

    # --- each line ---

    def _take(self, lines: list[OutboxLine]) -> None:
        for line in lines:
            self._handle(line)

    def _handle(self, line: OutboxLine) -> None:
        request = line.request
        if request is None:
            return self._refuse(line, {}, line.problem)
        claimed = request.get("run")
        run = self._runs.get(claimed) if isinstance(claimed, str) else None
        if request["kind"] == "ask.gone" and run is None:
            return   # a stopped run's asker giving up: its question was released already
        if claimed is not None and run is None:
            open_runs = list(self._runs)
            why = f"run {claimed} is over" + (
                f"; run {open_runs[0]} is running now" if len(open_runs) == 1 else
                f"; runs {', '.join(open_runs)} are running now" if open_runs else "")
            return self._refuse(line, request, why)
        kind = request["kind"]
        if claimed is None and kind != "refusal":
            # the outbox is the agents': a line naming no run vouches for nobody (a human's
            # `ralph emit` writes the bus itself)
            return self._refuse(line, request, f"{kind} names no run: it comes from agent "
                                "runs only (RALPH_RUN_ID)")
        source = run.role if claimed is not None else "unknown"
        if kind == "event":
            topic, payload = request.get("topic"), request.get("payload")
            try:
                check(topic, payload, "payload", self.max_bytes)
            except EmitError as e:
                return self._refuse(line, request, str(e))
            self.session.append_event(topic, payload, source=source, run=claimed, via=line.via)
        elif kind == "refusal":   # a human's verb called from inside this run
            self.session.append_event("cli.refused", {
                "command": _short(request.get("command")), "why": _short(request.get("why"))},
                source=source, run=claimed, via=line.via)
        elif kind == "poll":   # no record of its own: a crash before the next one, and it
            # is refused on the next start, as its run is then over
            role = request.get("role")
            if role not in (None, run.role):   # a run speaks as its own role only
                return self._refuse(line, request, f"a poll of the {run.role}'s run takes "
                                    f"the {run.role}'s signals, not the {_short(role)}'s")
            self.reply(str(request.get("id")), self._on_poll(run.role))
        elif kind == "ask":
            refused = self._on_ask(request, run, line.via)
            if refused is not None:
                self._refuse(line, request, refused["refused"])
        elif kind == "approve":
            refused = self._on_approve(request, run, line.via)
            if refused is not None:
                self._refuse(line, request, refused["refused"])
        elif kind == "ask.gone":
            self._on_ask_gone(str(request.get("id")))

    def _refuse(self, line: OutboxLine, request: dict, why: str) -> None:
        claimed = request.get("run")
        run = self._runs.get(claimed) if isinstance(claimed, str) else None
        source = run.role if run is not None else "unknown"
        payload = {"kind": request.get("kind"), "topic": _short(request.get("topic")),
                   "why": why}
        shown = request.get("payload")
        text = json.dumps(shown, ensure_ascii=False) if shown is not None else ""
        if shown is not None:
            payload["payload"] = shown if len(text) <= _SHOWN_BYTES else \
                f"({len(text)} bytes, not kept)"
        self.session.append_event(REFUSED, payload, source=source,
                                  run=claimed if isinstance(claimed, str) else None,
                                  via=line.via)
        rid = request.get("id")
        if request.get("kind") in ("ask", "poll", "approve") and isinstance(rid, str):
            self.reply(rid, {"refused": why})


def _short(value, limit: int = 200):
    """A field of a refused request as its record keeps it: short text."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)[:limit]
    return text[:limit]
