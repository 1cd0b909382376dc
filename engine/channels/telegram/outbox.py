"""What the bot sends on its own: questions waiting for a human, and notices from the
buses (`human.progress`, pauses, ends, timeouts).

Woken by the store (`Sessions.watch`: inotify through watchdog on the files) when a
question is written or marked, a bus appended to, a session appears (then followed too).
Each change names its session (and question), and only that is looked at, so nothing is
polled and an idle workspace costs nothing however many sessions it holds. The looks
(questions, the bus after the seq read so far, metadata) run in a worker thread, never on
the event loop. Sessions are named by id and buses read by seq: nothing here knows where
or how the store keeps them.

A question goes to every allowed chat at once, as a ForceReply; one no chat could take
after the retries is marked undeliverable in the store (`questions.mark_undeliverable`),
so whoever waits on it applies its timeout policy at once. The outbox never writes a
question file.
"""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable


from ralph.session_store import BadInput, Status, open_sessions, questions

from .settings import Log
from .state import BotState
from .texts import notice_text, question_text
from .transport import Transport

FLUSH_SECONDS = 2.0   # on stop, how long the last notices may take
ALL = None            # a session's every question is looked at (it appeared, or at start)


@dataclass(slots=True)
class Look:
    """What a look at one session found (worker thread -> loop)."""
    session: str
    to_send: list = field(default_factory=list)       # questions.Question
    settled: list = field(default_factory=list)       # question ids nobody needs to send
    notices: list = field(default_factory=list)       # (seq, texts.Message)
    read: int | None = None                   # the bus read up to this seq


class Outbox:
    def __init__(self, workspace: str, chats: list[int], transport: Transport, state: BotState,
                 log: Log, *, stopping: Callable[[], bool], primary: str | None = None):
        self.ws = workspace
        self.sessions = open_sessions(workspace)
        self.chats = chats
        self.transport = transport
        self.state = state
        self.log = log
        self.primary = primary
        self.stopping = stopping
        self.tasks: set[asyncio.Task] = set()   # deliveries, and sessions being adopted
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._questions: dict[str, set[str] | None] = {}   # session -> ids, or ALL
        self._buses: set[str] = set()
        self._settled: set[tuple[str, str]] = set()   # questions sent, failed or resolved
        self._sending: set[tuple[str, str]] = set()
        self._read: dict[str, int] = {}               # session -> bus seq read so far
        self._notices: collections.deque = collections.deque()   # (session, seq, Message)
        self._outstanding: collections.Counter = collections.Counter()
        self._notice_ready = asyncio.Event()
        self._notice_sending: asyncio.Future | None = None   # the notice being sent now
        self._watching = None
        self._watched: set[str] = set()

    # --- wakeups ---

    async def start(self) -> None:
        """Watch first, then look at every session once: a change during that first look
        is looked at again."""
        self._loop = asyncio.get_running_loop()
        sessions, seqs = await asyncio.to_thread(self._prepare, not self.state.existed)
        self._watched.update(sessions)
        for sid, seq in seqs.items():   # a first run does not replay old buses
            self.state.read_seqs[sid] = seq
        if seqs:
            await self.state.save()
        self.note_sessions(sessions)

    def _prepare(self, first_run: bool) -> tuple[list[str], dict[str, int]]:
        self._watching = self.sessions.watch(self._changed)
        sessions = self.sessions.ids()
        seqs = {sid: self.sessions.last_seq(sid)
                for sid in sessions if first_run and sid != self.primary}
        return sessions, seqs

    def _watch_session(self, sid: str) -> None:
        """A session that appeared: followed from now on (worker thread)."""
        try:
            self._watching.add(sid)
        except Exception as e:   # gone again, or no inotify watch left
            self.log.error(f"session {sid}: cannot follow it", e)

    async def _adopt(self, sid: str) -> None:
        await asyncio.to_thread(self._watch_session, sid)
        self.note_sessions([sid])   # whatever it wrote before its watch began

    async def stop_watching(self) -> None:
        if self._watching is not None:
            await asyncio.to_thread(self._watching)
            self._watching = None

    def _changed(self, change) -> None:
        """From the watcher's thread: what changed, handed to the loop."""
        try:
            self._loop.call_soon_threadsafe(self._note, change)
        except RuntimeError:   # the loop is closed: the bot has stopped
            pass

    def _note(self, change) -> None:
        if change.what == "session":
            if change.session not in self._watched:
                self._watched.add(change.session)
                self._spawn(self._adopt(change.session))
            return
        if change.what == "events":
            self._buses.add(change.session)
        elif self._questions.get(change.session, ()) is not ALL:
            self._questions.setdefault(change.session, set()).add(change.question)
        self._wake.set()

    def note_sessions(self, sessions) -> None:
        """Look at these sessions whole: every question, and the bus."""
        for sid in sessions:
            self._questions[sid] = ALL
            self._buses.add(sid)
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            wanted, self._questions = self._questions, {}
            buses, self._buses = self._buses, set()
            skip = self._settled | self._sending | self.state.sent()
            looks = await asyncio.to_thread(self._look, wanted, self._cursors(buses), skip,
                                            dict(self.state.notified))
            for look in looks:
                self._apply(look)

    def _cursors(self, sessions) -> dict[str, int]:
        return {sid: self._read.get(sid, self.state.read_seqs.get(sid, 0))
                for sid in sessions}

    # --- looking (worker thread) ---

    def _look(self, wanted: dict, cursors: dict[str, int], skip: set,
              notified: dict[str, int]) -> list[Look]:
        looks = []
        for sid in sorted(set(wanted) | set(cursors)):
            look = Look(sid)
            try:
                if sid in wanted:
                    self._look_at_questions(look, wanted[sid], skip)
                if sid in cursors:
                    self._look_at_bus(look, cursors[sid], notified.get(sid, 0))
            except Exception as e:
                self.log.error(f"session {sid}: look failed", e)
            looks.append(look)
        return looks

    def _look_at_questions(self, look: Look, ids, skip: set) -> None:
        sid = look.session
        if ids is ALL:
            ids = self.sessions.questions(sid).ids()
        found = []
        for qid in sorted(ids):
            if (sid, qid) in skip:   # settled or under way: not read again
                continue
            try:
                found.append(self.sessions.questions(sid).load(qid))
            except BadInput:
                continue
        now = datetime.now(timezone.utc)
        finished = None
        for q in sorted(found, key=lambda q: q.asked_at):
            if q.status is not questions.QuestionStatus.PENDING or q.delivery_failed \
                    or self.sessions.questions(sid).read_answer(q.id) is not None:
                look.settled.append(q.id)
                continue
            if now >= q.deadline and not q.timeout_paused:
                continue  # its asker is applying the timeout
            if finished is None:
                finished = self._finished(look.session)
            if finished:
                look.settled.append(q.id)
            else:
                look.to_send.append(q)

    def _finished(self, sid: str) -> bool:
        try:
            return self.sessions.load(sid).metadata.status in (Status.COMPLETED,
                                                               Status.ABORTED)
        except BadInput:
            return True

    def _look_at_bus(self, look: Look, after: int, done: int) -> None:
        """Notices for the records after seq `after` (and after seq `done`, those
        noticed)."""
        records = self.sessions.events_after(look.session, after)
        for record in records:
            text = notice_text(look.session, record)
            if text and record["seq"] > done:
                look.notices.append((record["seq"], text))
        look.read = records[-1]["seq"] if records else after

    # --- acting on what was found (loop) ---

    def _apply(self, look: Look) -> None:
        sid = look.session
        self._settled.update((sid, qid) for qid in look.settled)
        for q in look.to_send:
            key = (sid, q.id)
            if key not in self._settled and key not in self._sending:
                self._sending.add(key)
                self._spawn(self._deliver(sid, q))
        for seq, text in look.notices:
            self._notices.append((sid, seq, text))
            self._outstanding[sid] += 1
            self._notice_ready.set()
        if look.read is not None:
            self._read[sid] = look.read
            if not self._outstanding[sid] and self.state.read_seqs.get(sid) != look.read:
                self.state.read_seqs[sid] = look.read
                self.state.save_later()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _deliver(self, sid: str, q: questions.Question) -> None:
        key = (sid, q.id)

        async def still_wanted() -> bool:
            return await asyncio.to_thread(self._still_pending, sid, q.id)

        async def to(chat):
            message = await self.transport.send(chat, text, force_reply=True,
                                                still_wanted=still_wanted)
            if message is not None:   # remembered at once: a reply may come any moment
                self.state.remember(chat, message.message_id, sid, q.id)
                self.state.save_soon()
            return message
        try:
            text = question_text(q)
            delivered = [m for m in await asyncio.gather(*[to(chat) for chat in self.chats])
                         if m is not None]
            if delivered:
                self._settled.add(key)
                self.log(f"question {q.id} of session {sid} sent to {len(delivered)} chat(s)")
            elif self.stopping():
                pass  # whoever runs the bot next sends it
            else:
                if await asyncio.to_thread(self._mark_undeliverable, sid, q.id):
                    self.log(f"question {q.id} of session {sid} could not be delivered: "
                             f"it times out now (on_timeout: {q.on_timeout})")
                self._settled.add(key)
        finally:
            self._sending.discard(key)

    # --- notices ---

    async def notify_forever(self) -> None:
        while True:
            await self._notice_ready.wait()
            while self._notices:
                # a send under way finishes (and is marked done) even when the bot stops
                # meanwhile: its flush would otherwise send the same notice again
                self._notice_sending = asyncio.ensure_future(self._send_first())
                await asyncio.shield(self._notice_sending)
            self._notice_ready.clear()

    async def _send_first(self) -> None:
        _sid, _seq, text = self._notices[0]   # leaves the queue once sent
        await asyncio.gather(*[self.transport.send(chat, text) for chat in self.chats])
        self._notice_done()

    def _notice_done(self) -> None:
        sid, seq, _text = self._notices.popleft()
        self._outstanding[sid] -= 1
        self.state.notified[sid] = max(seq, self.state.notified.get(sid, 0))
        if not self._outstanding[sid] and sid in self._read:
            self.state.read_seqs[sid] = self._read[sid]
        self.state.save_soon()

    def _still_pending(self, sid: str, qid: str) -> bool:
        try:
            q = self.sessions.questions(sid).load(qid)
        except BadInput:
            return False
        return q.status is questions.QuestionStatus.PENDING and not q.delivery_failed \
            and self.sessions.questions(sid).read_answer(qid) is None

    def _mark_undeliverable(self, sid: str, qid: str) -> bool:
        """False when it waits for nothing any more (answered, resolved, gone)."""
        try:
            return self.sessions.questions(sid).mark_undeliverable(
                qid, datetime.now(timezone.utc), channel="telegram")
        except BadInput:
            return False

    async def flush(self) -> None:
        """The sessions' last words (paused, completed) go out before the bot stops: one
        try each, within FLUSH_SECONDS."""
        if self._notice_sending is not None and not self._notice_sending.done():
            await asyncio.wait([self._notice_sending], timeout=FLUSH_SECONDS)
        try:
            sessions = await asyncio.to_thread(self.sessions.ids)
            looks = await asyncio.to_thread(self._look, {}, self._cursors(sessions), set(),
                                            dict(self.state.notified))
            for look in looks:
                self._apply(look)
        except Exception as e:
            self.log.error("last look failed", e)

        async def drain():
            while self._notices:
                _sid, _seq, text = self._notices[0]
                await asyncio.gather(*[self.transport.send(chat, text, retries=False)
                                       for chat in self.chats])
                self._notice_done()
        try:
            await asyncio.wait_for(drain(), FLUSH_SECONDS)
        except asyncio.TimeoutError:
            pass
        except Exception as e:
            self.log.error("last notifications failed", e)
