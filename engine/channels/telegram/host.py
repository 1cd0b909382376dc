"""Where the bot runs: a thread with its own asyncio loop, inside an engine or in the
foreground (`ralph bot run`).

One bot per workspace. An engine runs it when Telegram is on and it wins the workspace
lock (the store's `ChannelFiles.try_lock`; its session is then the primary one; an engine that
loses stands by and takes over when the lock frees); `ralph bot run` runs it instead
(primary: the newest open session). Either way it serves every session of the workspace.
Nothing the bot meets can crash the engine: it logs one line, backs off and goes on.
"""
from __future__ import annotations

import asyncio
import os
import threading
from typing import Callable

from ralph.session_store import BadInput, Held, open_channel, open_sessions

from .commands import Commands
from .inbox import Inbox
from .outbox import FLUSH_SECONDS, Outbox
from .settings import Log, Settings, quiet_libraries, settings, stderr_log
from .state import BotState
from .transport import Transport

CHANNEL = "telegram"   # its files' name in the store (ChannelFiles)
STANDBY_INTERVAL = 2.0   # how often an engine that lost the lock tries it again


class Channel:
    """The bot of one workspace, run in a background thread (start/stop)."""

    def __init__(self, workspace: str, settings: Settings, *, primary: str | None = None,
                 log: Callable[[str], None] = stderr_log):
        self.ws = os.path.abspath(workspace)
        self.settings = settings
        self.primary = primary
        self.log = Log(settings.token, log)
        self.files = open_channel(self.ws, CHANNEL)
        self._stop = threading.Event()
        self._done = threading.Event()   # not Thread.join: a ^C inside join() can leave the
        self._thread: threading.Thread | None = None   # Thread marked stopped (CPython 3.11)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._astop: asyncio.Event | None = None

    # --- lifecycle ---

    def start(self) -> None:
        self._thread = threading.Thread(target=self._thread_main, name="telegram-bot",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = FLUSH_SECONDS + 3) -> None:
        self._stop.set()
        loop, astop = self._loop, self._astop
        if loop is not None and astop is not None:
            try:
                loop.call_soon_threadsafe(astop.set)
            except RuntimeError:  # the loop is closed already
                pass
        if self._thread is not None:
            self._done.wait(timeout)

    def wait(self, timeout: float) -> bool:
        """True once the bot's thread has ended."""
        return self._done.wait(timeout)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # never let the thread print a traceback
            self.log.error("the bot stopped", e)
        finally:
            self._done.set()

    async def _sleep(self, seconds: float) -> bool:
        """Sleep; True when the bot is stopping."""
        try:
            await asyncio.wait_for(self._astop.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    # --- the loop ---

    async def _main(self) -> None:
        quiet_libraries()
        self._astop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stop.is_set():
            return
        state = await asyncio.to_thread(BotState.load, self.files, open_sessions(self.ws), self.log)
        transport = Transport(self.settings.token, self.settings.api_url, self.log, self._sleep)
        chats = self.settings.chats
        outbox = Outbox(self.ws, chats, transport, state, self.log, primary=self.primary,
                        stopping=self._stop.is_set)
        commands = Commands(self.ws, self.log, primary=self.primary, files=self.files)
        inbox = Inbox(self.ws, chats, transport, state, commands, self.log, self._sleep)
        try:
            if not await transport.connect(self._astop):
                return
            self.log(f"serving {self.ws}")
            await outbox.start()
            loops = [asyncio.create_task(self._guard(name, fn)) for name, fn in
                     (("getUpdates", inbox.poll_forever), ("outbox", outbox.run),
                      ("notify", outbox.notify_forever))]
            await self._astop.wait()
            for task in loops + list(outbox.tasks):
                task.cancel()
            await asyncio.gather(*loops, *outbox.tasks, return_exceptions=True)
            await outbox.stop_watching()
            if inbox.replies:   # what a human asked for last still gets its reply
                _done, late = await asyncio.wait(set(inbox.replies), timeout=FLUSH_SECONDS)
                for task in late:
                    task.cancel()
            await outbox.flush()
        finally:
            await outbox.stop_watching()
            await state.close()
            await transport.close()

    async def _guard(self, name: str, loop_fn) -> None:
        """Run a loop forever: an exception is logged (one line) and the loop restarts
        after a back-off."""
        backoff = 1.0
        while True:
            try:
                await loop_fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.log.error(f"{name} failed; again in {backoff:g}s", e)
                if await self._sleep(backoff):
                    return
                backoff = min(backoff * 2, 30.0)


# --- hosts: inside an engine, or in the foreground ---

class EngineHost:
    """The bot as an engine runs it: only with the workspace lock; an engine that does not
    get it stands by and takes over when the holder stops."""

    def __init__(self, workspace: str, settings: Settings, primary: str,
                 log: Callable[[str], None] = stderr_log):
        self.ws, self.settings, self.primary, self._log = workspace, settings, primary, log
        self._stop = threading.Event()
        self._lock: Held | None = None
        self.channel: Channel | None = None
        self._standby: threading.Thread | None = None

    def start(self) -> None:
        if not self._take():
            self._standby = threading.Thread(target=self._wait_for_lock, daemon=True,
                                             name="telegram-standby")
            self._standby.start()

    def _take(self) -> bool:
        try:
            lock = open_channel(self.ws, CHANNEL).try_lock()
        except OSError as e:
            self._log(f"cannot take the bot lock ({e.strerror})")
            return True  # do not retry
        if lock is None:
            return False
        self._lock = lock
        self.channel = Channel(self.ws, self.settings, primary=self.primary, log=self._log)
        self.channel.start()
        return True

    def _wait_for_lock(self) -> None:
        while not self._stop.wait(STANDBY_INTERVAL):
            try:
                if self._take():
                    return
            except Exception as e:  # never take the engine down
                self._log(f"bot standby failed: {type(e).__name__}")
                return

    def stop(self) -> None:
        self._stop.set()
        if self._standby is not None:
            self._standby.join(timeout=STANDBY_INTERVAL + 1)
        if self.channel is not None:
            self.channel.stop()
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def start_for_session(workspace: str, session_id: str, config,
                      log: Callable[[str], None] = stderr_log) -> Callable[[], None]:
    """For an engine running `session_id`: start the workspace's bot when Telegram is on
    (a no-op otherwise). Returns the function that stops it; neither ever raises."""
    try:
        found = settings(config)
    except BadInput as e:   # `ralph session start/resume` refused this already
        log(f"off: {e}")
        return lambda: None
    if found is None:
        return lambda: None
    try:
        host = EngineHost(workspace, found, session_id, log)
        host.start()
    except Exception as e:
        log(f"could not start the bot: {type(e).__name__}")
        return lambda: None

    def stop():
        try:
            host.stop()
        except Exception as e:
            log(f"could not stop the bot cleanly: {type(e).__name__}")
    return stop


def run_foreground(workspace: str, found: Settings) -> int:
    """`ralph bot run`: serve every session of the workspace until ^C / SIGTERM."""
    files = open_channel(workspace, CHANNEL)
    lock = files.try_lock()
    if lock is None:
        raise BadInput(f"the Telegram bot of {workspace} runs already "
                       f"(pid {files.lock_holder()})")
    channel = Channel(workspace, found)
    try:
        channel.start()
        stderr_log(f"bot running for {os.path.abspath(workspace)} (^C stops it)")
        while not channel.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        channel.stop()
        lock.release()
    stderr_log("bot stopped")
    return 0
