"""The live feed: one file-system watcher (the store's `watch`) over the sessions'
control planes and their work areas (the scratchpad agents write is there) serves every
open page. The watcher's thread hops onto the event loop and sets each page stream's own
asyncio.Event; the stream then reads what changed (in a worker thread) and sends it as
server-sent events. Nothing polls: a page hears of a file change within milliseconds,
and an idle server does no work.

Bounded, whoever reads. At most `max_streams` streams are open at once: one more is
refused (503, one line). Each stream holds one message at a time: uvicorn's flow control
holds its `send` while the connection's buffer is full, so a slow reader holds back its
own stream and no queue grows. The changes made meanwhile coalesce into one wakeup, after
which the stream reads what is there now: the snapshot as it stands, and of the events
only the newest batch (reads.events_since: each event cut to a few kB, a batch at most
256 kB; the skipped ones are said, in a `problem` message). A message of more than
MAX_MESSAGE characters is not sent (a `problem` says so). A stream keeps only a digest of
the last snapshot it sent.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat

from ralph.session_store import Session, open_sessions, sessions_root, work_root

from . import reads
from .reads import Problem, dumps

# a stream that heard nothing for this long re-reads and sends a comment: it keeps the
# connection alive through proxies and finds a page that has gone away
KEEPALIVE = 15.0
# after a change, one more look this much later: a file written into a directory made a
# moment before can land before the watcher watches that directory (a new session asked
# at once), and was then seen only at the next keepalive
SETTLE = 0.5
MAX_STREAMS = 32            # open at once, by default (`ralph web --max-streams`)
MAX_MESSAGE = 2 << 20       # characters of one message (a snapshot, the session list)


class _Wakeup:
    """What `watch` sets (it calls a threading.Event's `set`): a hop onto the loop."""

    def __init__(self, feed: "Feed"):
        self._feed = feed

    def set(self) -> None:
        try:
            self._feed.loop.call_soon_threadsafe(self._feed.changed)
        except RuntimeError:   # the loop is closed: the server is stopping
            pass


class Feed:
    def __init__(self, workspace: str, watch, max_streams: int = MAX_STREAMS):
        self.workspace = os.path.abspath(workspace)
        self.max_streams = max_streams
        self.streams = 0
        # the state directory's, and the workspace's
        self.roots = (sessions_root(self.workspace), work_root(self.workspace))
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._watch = watch
        self._stop_watching = None
        self._watched: tuple[list[str], list[str]] | None = None
        self._rewatching: asyncio.Task | None = None
        self._settling: asyncio.TimerHandle | None = None
        self._waiters: set[asyncio.Event] = set()
        self._stop_listening = None   # a fleet's database: its changes are its NOTIFYs

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self._rewatch()
        sessions = open_sessions(self.workspace)
        if sessions.shared:
            wakeup = _Wakeup(self)
            self._stop_listening = await asyncio.to_thread(
                sessions.watch, lambda _change: wakeup.set())

    async def close(self) -> None:
        self.closed = True
        self._wake_all()
        if self._settling is not None:
            self._settling.cancel()
        if self._rewatching is not None:   # it may be starting a watcher: stopped below
            await self._rewatching
        if self._stop_watching is not None:
            await asyncio.to_thread(self._stop_watching)
            self._stop_watching = None
        if self._stop_listening is not None:
            await asyncio.to_thread(self._stop_listening)
            self._stop_listening = None

    def take_stream(self):
        """Count one more open stream and return what ends it; Problem 503 when
        `max_streams` are open."""
        if self.streams >= self.max_streams:
            raise Problem(503, f"refused: {self.max_streams} live streams are open, the most "
                               f"this server keeps (ralph web --max-streams)")
        self.streams += 1
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended, self.streams = True, self.streams - 1
        return end

    def stop_streams(self) -> None:
        """From any thread (a signal handler): every stream ends, so shutdown is quick."""
        self.closed = True
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._wake_all)

    def _what_to_watch(self) -> tuple[list[str], list[str]]:
        """(folders, trees): each root that exists as a tree; for one that does not yet,
        the nearest folder above it that does, to see it (or the next folder on the way)
        made."""
        trees = [root for root in self.roots if _is_folder(root)]
        folders = [_nearest_folder(root) for root in self.roots if root not in trees]
        return sorted(set(folders)), trees

    async def _rewatch(self) -> None:
        try:   # until what is watched is what there is (a root made meanwhile is seen)
            while not self.closed and (wanted := self._what_to_watch()) != self._watched:
                folders, trees = wanted
                new = await asyncio.to_thread(self._watch, folders, _Wakeup(self), trees)
                old, self._stop_watching, self._watched = self._stop_watching, new, wanted
                if old is not None:
                    await asyncio.to_thread(old)
        finally:
            self._rewatching = None
        self._wake_all()   # whatever changed while no watch covered it

    def changed(self) -> None:
        if self._watched is not None and self._watched[0] and self._rewatching is None \
                and self._what_to_watch() != self._watched:   # a root, or a step to it, made
            self._rewatching = self.loop.create_task(self._rewatch())
        self._wake_all()
        if self._settling is None:
            self._settling = self.loop.call_later(SETTLE, self._settled)

    def _settled(self) -> None:
        self._settling = None
        self._wake_all()

    def _wake_all(self) -> None:
        for event in self._waiters:
            event.set()

    @contextlib.asynccontextmanager
    async def _subscription(self):
        event = asyncio.Event()
        event.set()   # the first round at once
        self._waiters.add(event)
        try:
            yield event
        finally:
            self._waiters.discard(event)

    async def _rounds(self):
        """Yields once per change (True), or after KEEPALIVE seconds of quiet (False)."""
        async with self._subscription() as event:
            while not self.closed:
                try:
                    await asyncio.wait_for(event.wait(), KEEPALIVE)
                except asyncio.TimeoutError:
                    yield False
                    continue
                event.clear()
                if not self.closed:
                    yield True

    # --- the streams a page reads ---

    async def sessions(self):
        """The session list, whenever it changes."""
        last = None
        async for woke in self._rounds():
            text = dumps(await asyncio.to_thread(reads.sessions, self.workspace))
            last, message = _if_changed(last, "sessions", text, "the session list")
            if message:
                yield message
            elif not woke:
                yield b": keepalive\n\n"

    async def session(self, session: Session, first_events: list[dict]):
        """One session: its last events, then the new ones, and its snapshot (status,
        questions, scratchpad, guidance) whenever that changes."""
        yield sse("events", dumps(first_events))
        after = first_events[-1]["seq"] if first_events else 0
        last = None
        async for woke in self._rounds():
            try:
                snapshot, (new, skipped) = await asyncio.to_thread(
                    _read_changes, self.workspace, session, after)
            except Problem as p:   # gone, or unreadable for now: said, and followed on
                yield sse("problem", dumps({"error": p.message}))
                continue
            if skipped:
                yield sse("problem", dumps({"error": (
                    f"events came faster than this page is sent them: the newest {len(new)} "
                    f"are shown; `ralph session tail {session.id}` shows them all")}))
            if new:
                after = new[-1]["seq"]
                yield sse("events", dumps(new))
            last, message = _if_changed(last, "snapshot", dumps(snapshot), "the snapshot")
            if message:
                yield message
            elif not woke and not new:
                yield b": keepalive\n\n"


def _is_folder(path: str) -> bool:
    """A directory, not a link to one: an agent may put a link in the place of the work
    root, and the watcher is not led where it points."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _nearest_folder(path: str) -> str:
    while not _is_folder(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _read_changes(workspace: str, session: Session, after: int):
    return reads.snapshot(workspace, session.id), reads.events_since(session, after)


def _if_changed(last: bytes | None, event: str, text: str,
                what: str) -> tuple[bytes, bytes | None]:
    """(the text's digest, the message to send, or None when the last one said it)."""
    digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
    if digest == last:
        return digest, None
    if len(text) > MAX_MESSAGE:
        return digest, sse("problem", dumps({"error": (
            f"{what} is {len(text)} characters, more than a page is sent at once "
            f"({MAX_MESSAGE}): `ralph session status` shows it")}))
    return digest, sse(event, text)


def sse(event: str, data: str) -> bytes:
    """One server-sent event (the JSON is one line: it escapes its newlines)."""
    return f"event: {event}\ndata: {data}\n\n".encode()
