"""The engine's side of the runs' outboxes: what agents' tools sent, read, checked and
recorded.

Each run has its own outbox and inbox (session_store's run channel), made when the run
opens: a line is the run's whose outbox it is in, never what it claims; a line naming
another run is refused, and so is every line in the outbox of a run that is over. Nothing
else in a line is trusted either: a topic only the engine or a human may say (`session.*`,
`human.response`, ...) is refused; a request past the size cap is refused unread. Each
refusal is recorded on the bus as `emit.refused` with the reason. Questions go to the
human desk, polls to the mailbox, tool calls to approve to the approvals, and their
replies back to the asking run's inbox. Anything found where a channel belongs that the
engine did not make there is set aside and recorded (`engine.set_aside`).
"""
from __future__ import annotations

import json
import os
import threading
from typing import Callable, NamedTuple

from ralph.session_store import (REFUSED, OutboxLine, RunChannel, SetAside, hold_engine_lock,
                           holds_engine_lock, runs)

from ..tools.emit import EmitError, check

_SHOWN_BYTES = 4096   # of a refused payload, what its record keeps
SET_ASIDE = "engine.set_aside"


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
                 on_approve: Callable[[dict, RunInfo, list], dict | None],
                 wakeup: threading.Event | None = None):
        self.session = session
        self.max_bytes = max_bytes
        self._on_ask = on_ask            # -> a reply now (refused), or None (the desk replies)
        self._on_ask_gone = on_ask_gone
        self._on_poll = on_poll
        self._on_approve = on_approve    # a CLI's hook: a tool call to approve
        self._wakeup = wakeup            # set when a line lands in an open run's outbox
        self._runs: dict[str, RunInfo] = {}   # the open runs (several in a parallel batch)
        self._channels: dict[str, RunChannel] = {}   # theirs, and those closed not retired
        self._watches: dict[str, Callable[[], None]] = {}
        self._asked: dict[str, str] = {}   # request id -> the run whose inbox gets the reply
        self._presence: int | None = None

    def is_open(self, run_id: str) -> bool:
        return run_id in self._runs

    def start(self) -> None:
        """Hold the work area (agents' tools see an engine), refuse what a dead engine's
        runs sent and nobody read, remove their channels, and begin with no run open.
        The bus is read back only as far as those runs' marks: never its history."""
        self._presence = hold_engine_lock(self.session.work)
        try:
            found, aside = runs.leftover_channels(self.session.work, self.max_bytes)
            self._record_aside(aside)
            for channel in found:
                self._recover(channel)
            for run in runs.marked(self.session):   # a dead engine's, whose channel is gone
                runs.unmark(self.session, run)
        except BaseException:
            os.close(self._presence)
            self._presence = None
            raise

    def _recover(self, channel: RunChannel) -> None:
        mark = runs.mark_of(self.session, channel.run)
        last = None
        if mark is not None:   # none: no record of the channel was ever made
            for record in self.session.events_backwards():
                if record.get("seq", 0) <= mark["seq"]:
                    break
                if isinstance(record.get("via"), list) and record.get("run") == channel.run:
                    last = record
                    break
        for line in channel.recover(mark, last["via"] if last else None):
            request = line.request or {}
            self._refuse(line, request, line.problem or
                         "its run ended with the engine that ran it", channel.run)
        channel.retire(lambda lines: self._take(lines, channel))
        self._record_aside(channel.set_aside)
        runs.unmark(self.session, channel.run)

    def stop(self) -> None:
        for stop_watch in self._watches.values():
            stop_watch()
        self._watches.clear()
        for channel in self._channels.values():
            channel.release()   # left for the next start, which retires them
        self._channels.clear()
        self._runs.clear()
        if self._presence is not None:
            os.close(self._presence)
            self._presence = None
        self.session.work.close()

    def open_run(self, run: RunInfo) -> None:
        """From now on, lines in `run`'s outbox are taken as its role's. Channels of runs
        over (of this lane, or of another that ended) are retired first."""
        if self._presence is None:   # a runner driven without the engine's loop (a test's)
            self.start()
        self._reclaim()
        for old in [c for r, c in self._channels.items() if r not in self._runs]:
            self._retire(old)
        channel = RunChannel(self.session.work, run.id, self.max_bytes)
        try:
            channel.make()
        finally:
            self._record_aside(channel.set_aside)
        self._mark(channel)
        self._channels[run.id] = channel
        self._runs[run.id] = run
        if self._wakeup is not None:
            self._watches[run.id] = runs.watch_outbox(channel.outbox_path, self._wakeup)

    def _reclaim(self) -> None:
        """The engine's presence in the work area held again where the last run removed
        or replaced it (a `git clean` of the workspace, say), so this run's tools find
        their engine."""
        work = self.session.work
        work.refresh()
        if not holds_engine_lock(work, self._presence):
            os.close(self._presence)
            self._presence = hold_engine_lock(work)

    def close_run(self, run_id: str) -> None:
        """The run is over: what it sent until now is taken, nothing after."""
        channel = self._channels.get(run_id)
        try:
            if channel is not None:
                channel.close(lambda lines: self._take(lines, channel))
                self._mark(channel)   # after: the writes keep one order, however it ran
        finally:
            self._runs.pop(run_id, None)
            stop_watch = self._watches.pop(run_id, None)
            if stop_watch is not None:
                stop_watch()
        self._reclaim()   # the run may have removed the work area (a `git clean`)

    def _mark(self, channel: RunChannel) -> None:
        """Where a recovery of the channel looks from (see session_store's `runs.mark`):
        made as the run opens and once it is closed; a crash before one finds the one
        before it."""
        runs.mark(self.session, channel.run, self.session.last_seq(), channel.place)

    def _retire(self, channel: RunChannel) -> None:
        try:
            channel.retire(lambda lines: self._take(lines, channel))
        finally:
            self._channels.pop(channel.run, None)
            self._asked = {rid: run for rid, run in self._asked.items() if run != channel.run}
            self._record_aside(channel.set_aside)
            runs.unmark(self.session, channel.run)

    def drain(self) -> None:
        """Take what arrived since the last look (on every wakeup while an agent runs)."""
        for channel in list(self._channels.values()):
            self._take(channel.read_new(), channel)

    def reply(self, request_id: str, data: dict) -> None:
        """Into the inbox of the run that asked (nowhere once its channel is retired)."""
        channel = self._channels.get(self._asked.get(request_id, ""))
        if channel is not None:
            channel.reply(request_id, data)
            self._record_aside(channel.set_aside)

    def _record_aside(self, aside: list[SetAside]) -> None:
        for item in aside:
            self.session.append_event(SET_ASIDE, {
                "path": item.path, "was": item.was, "moved_to": item.moved_to,
                "why": f"a {item.was} where the engine keeps a run's channel"})
        aside.clear()

    # --- each line ---

    def _take(self, lines: list[OutboxLine], channel: RunChannel) -> None:
        for line in lines:
            self._handle(line, channel)

    def _handle(self, line: OutboxLine, channel: RunChannel) -> None:
        request = line.request
        if request is None:
            return self._refuse(line, {}, line.problem, channel.run)
        claimed = request.get("run")
        run = self._runs.get(channel.run) if channel.open else None
        kind = request["kind"]
        if kind == "ask.gone" and run is None:
            return   # a stopped run's asker giving up: its question was released already
        if claimed not in (None, channel.run):
            return self._refuse(line, request, f"it names run {claimed}, but it is in the "
                                f"outbox of run {channel.run}: a run speaks for itself only",
                                channel.run)
        if run is None:
            open_runs = list(self._runs)
            why = f"run {channel.run} is over" + (
                f"; run {open_runs[0]} is running now" if len(open_runs) == 1 else
                f"; runs {', '.join(open_runs)} are running now" if open_runs else "")
            return self._refuse(line, request, why, channel.run)
        if isinstance(request.get("id"), str) and kind in ("ask", "poll", "approve"):
            self._asked[request["id"]] = run.id
        if kind == "event":
            topic, payload = request.get("topic"), request.get("payload")
            try:
                check(topic, payload, "payload", self.max_bytes)
            except EmitError as e:
                return self._refuse(line, request, str(e), run.id)
            self.session.append_event(topic, payload, source=run.role, run=run.id,
                                      via=line.via)
        elif kind == "refusal":   # a human's verb called from inside this run
            self.session.append_event("cli.refused", {
                "command": _short(request.get("command")), "why": _short(request.get("why"))},
                source=run.role, run=run.id, via=line.via)
        elif kind == "poll":   # no record of its own: a crash before the next one, and it
            # is refused on the next start, as its run is then over
            role = request.get("role")
            if role not in (None, run.role):   # a run speaks as its own role only
                return self._refuse(line, request, f"a poll of the {run.role}'s run takes "
                                    f"the {run.role}'s signals, not the {_short(role)}'s",
                                    run.id)
            self.reply(str(request.get("id")), self._on_poll(run.role))
        elif kind == "ask":
            refused = self._on_ask(request, run, line.via)
            if refused is not None:
                self._refuse(line, request, refused["refused"], run.id)
        elif kind == "approve":
            refused = self._on_approve(request, run, line.via)
            if refused is not None:
                self._refuse(line, request, refused["refused"], run.id)
        elif kind == "ask.gone":
            self._on_ask_gone(str(request.get("id")))

    def _refuse(self, line: OutboxLine, request: dict, why: str | None, run_id: str) -> None:
        """Recorded as the run's whose outbox the line is in (its role while it is open),
        with the reply a waiting tool reads, where it waits for one."""
        run = self._runs.get(run_id)
        payload = {"kind": request.get("kind"), "topic": _short(request.get("topic")),
                   "why": why}
        shown = request.get("payload")
        text = json.dumps(shown, ensure_ascii=False) if shown is not None else ""
        if shown is not None:
            payload["payload"] = shown if len(text) <= _SHOWN_BYTES else \
                f"({len(text)} bytes, not kept)"
        self.session.append_event(REFUSED, payload,
                                  source=run.role if run is not None else "unknown",
                                  run=run_id, via=line.via)
        rid = request.get("id")
        channel = self._channels.get(run_id)
        if request.get("kind") in ("ask", "poll", "approve") and isinstance(rid, str) \
                and channel is not None:
            channel.reply(rid, {"refused": why})


def _short(value, limit: int = 200):
    """A field of a refused request as its record keeps it: short text."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)[:limit]
    return text[:limit]
