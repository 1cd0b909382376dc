"""The Telegram channel (seed 000, DESIGN §7), on python-telegram-bot's `Bot`.

One bot per workspace. An engine runs it when Telegram is on and it wins the workspace
lock `.ralph-sessions/.telegram.lock` (its session is then the primary one; an engine that
loses stands by and takes over when the lock frees); `ralph bot run` runs it in the
foreground instead (primary: the newest open session). Either way it serves every
session of the workspace.

Like every channel it only reads the store and writes store files: answers
(`questions.answer(channel="telegram")`), signal files (guidance is an INFO signal for
ALL; /pause PAUSE, /stop ABORT, /approve APPROVE, /skip SKIP), and, for a question no
chat could be sent after the retries, the question itself with its deadline moved to now
(`delivery_failed`), so whoever waits on it applies its timeout policy at once. /resume
starts `ralph session resume ID` as a detached process.

It runs in a thread with its own asyncio loop: getUpdates long-polls (short, so stopping
is quick) in one task; another scans the sessions for questions to send and for
notifications (`human.progress`, pauses, ends, timeouts) on the bus. Its state
(`.ralph-sessions/.telegram/state.yaml`: the getUpdates offset, which message asked
which question, per-session bus offsets) is rewritten atomically and never holds the
token. The token never reaches a log line, an event, a file or an error message: the
libraries' loggers (httpx logs request URLs, which carry it) are kept quiet and every
error text is scrubbed. Nothing the bot meets can crash the engine: it logs one line,
backs off and goes on.
"""
from __future__ import annotations

import asyncio
import collections
import fcntl
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Callable

from session_store import BadInput, Status, list_ids, load, make_dirs, parse_yaml, \
    questions, sessions_root, signals, write_atomic

TOKEN_ENV = "RALPH_TELEGRAM_BOT_TOKEN"
API_URL_ENV = "RALPH_TELEGRAM_API_URL"
DEFAULT_API_URL = "https://api.telegram.org"
STATE_DIR = ".telegram"
STATE_FILE = "state.yaml"
LOCK_FILE = ".telegram.lock"

BACKOFF = (1.0, 2.0, 4.0)   # a failed send is retried after 1 s, 2 s and 4 s
POLL_TIMEOUT = 1            # getUpdates long-poll, seconds: short, so stopping is quick
SCAN_INTERVAL = 0.2         # how often the sessions are looked at for questions and events
STANDBY_INTERVAL = 2.0      # how often an engine that lost the lock tries it again
FLUSH_SECONDS = 2.0         # on stop, how long the last notifications may take
MAX_MESSAGES = 2000         # question messages remembered (replies to older ones are text)
MAX_TEXT = 3900             # Telegram takes 4096 characters a message

QUESTION_HEADER = re.compile(r"Question ([A-Za-z0-9][A-Za-z0-9._-]{0,63}) from session "
                             r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\n")
AT_SESSION = re.compile(r"@([A-Za-z0-9][A-Za-z0-9._-]{0,63})[:,]?(?:\s+(.*))?", re.DOTALL)
HELP = """Commands (SESSION is optional: the primary session by default):
/status [SESSION] - state, iteration, tasks, pending questions
/tasks [SESSION] - the current iteration's tasks
/tail [SESSION] [N] - the last N events (default 10)
/pause [SESSION] [reason] - pause the session (resumable)
/resume [SESSION] - resume a paused session
/stop [SESSION] [reason] - abort the session
/approve [SESSION] - promote the staged knowledge (KNOWLEDGE_APPROVAL)
/skip [SESSION] - keep the staged knowledge staged
/help - this list

Reply to a question's message to answer it. "@SESSION text" is guidance for that session;
any other text is guidance for the primary session ({primary})."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


# --- settings ---

class Settings:
    """Where and to whom the bot talks. Its repr never shows the token."""

    def __init__(self, token: str, api_url: str, chats: list[int]):
        self.token = token
        self.api_url = api_url
        self.chats = list(chats)

    def __repr__(self) -> str:
        return f"Settings(api_url={self.api_url!r}, chats={self.chats!r})"


def settings(config, *, require_enabled: bool = True, environ=None) -> Settings | None:
    """The bot's settings, or None when Telegram is off (RObot.enabled false). Token and
    API URL: $RALPH_TELEGRAM_BOT_TOKEN / $RALPH_TELEGRAM_API_URL over the config.
    BadInput names the field when RObot.enabled has no token or no chat."""
    environ = os.environ if environ is None else environ
    robot = config.RObot
    if require_enabled and not robot.enabled:
        return None
    token = (environ.get(TOKEN_ENV) or robot.telegram.bot_token or "").strip()
    if not token:
        raise BadInput(f"$.RObot.telegram.bot_token: expected a bot token (or ${TOKEN_ENV})"
                       + (" when RObot.enabled is true" if require_enabled else ""))
    if any(c.isspace() or c == "/" for c in token):
        raise BadInput(f"$.RObot.telegram.bot_token: expected a Bot API token "
                       f"(no spaces, no '/'; or ${TOKEN_ENV})")
    if not robot.telegram.allowed_chat_ids:
        raise BadInput("$.RObot.telegram.allowed_chat_ids: expected at least one chat id "
                       "when Telegram is enabled")
    from_env = environ.get(API_URL_ENV)
    api_url = (from_env or robot.telegram.api_url or DEFAULT_API_URL).strip().rstrip("/")
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", api_url):
        where = f"${API_URL_ENV}" if from_env else "$.RObot.telegram.api_url"
        raise BadInput(f"{where}: expected the Bot API root, an http(s) URL such as "
                       f"{DEFAULT_API_URL}")
    return Settings(token, api_url, robot.telegram.allowed_chat_ids)


def check(config) -> None:
    """For `ralph session start/resume`: refuse a Telegram config that cannot work."""
    settings(config)


# --- the workspace lock ---

def lock_path(workspace: str) -> str:
    return os.path.join(sessions_root(workspace), LOCK_FILE)


def try_lock(workspace: str) -> int | None:
    """The workspace's bot lock (an fd to keep), or None when another process holds it."""
    make_dirs(sessions_root(workspace))
    fd = os.open(lock_path(workspace), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_holder(workspace: str) -> str:
    try:
        with open(lock_path(workspace), encoding="utf-8", errors="replace") as f:
            return f.read(32).strip() or "unknown"
    except OSError:
        return "unknown"


# --- logging without the token ---

def _quiet_libraries() -> None:
    """httpx logs every request URL at INFO, and the URL carries the token; PTB logs its
    base URL at DEBUG. The bot logs its own one-line diagnostics instead."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("telegram").setLevel(logging.CRITICAL + 1)


def stderr_log(text: str) -> None:
    stamp = datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] telegram: {text}", file=sys.stderr, flush=True)


# --- the state file ---

class BotState:
    """`.ralph-sessions/.telegram/state.yaml`, JSON (which YAML readers read too): the
    getUpdates offset, question messages, per-session bus offsets. Never the token."""

    def __init__(self, path: str):
        self.path = path
        self.update_offset: int | None = None
        self.messages: dict[str, dict] = {}      # "chat:message_id" -> {session, question}
        self.event_offsets: dict[str, int] = {}
        self.existed = False

    @classmethod
    def load(cls, path: str, log: Callable[[str], None]) -> "BotState":
        state = cls(path)
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
        except (BadInput, ValueError, TypeError, KeyError, AttributeError):
            log(f"{path}: unreadable; starting from an empty state")
        return state

    def save(self) -> None:
        if len(self.messages) > MAX_MESSAGES:   # oldest first: dicts keep insertion order
            for key in list(self.messages)[:len(self.messages) - MAX_MESSAGES]:
                del self.messages[key]
        make_dirs(os.path.dirname(self.path))
        write_atomic(self.path, json.dumps({
            "update_offset": self.update_offset, "messages": self.messages,
            "event_offsets": self.event_offsets}, indent=1, sort_keys=True) + "\n",
            "telegram-state")

    def question_for(self, chat: int, message_id: int) -> tuple[str, str] | None:
        entry = self.messages.get(f"{chat}:{message_id}")
        return (entry["session"], entry["question"]) if entry else None

    def sent(self) -> set[tuple[str, str]]:
        return {(v["session"], v["question"]) for v in self.messages.values()}


# --- texts ---

def _clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def question_text(q: questions.Question) -> str:
    c = q.context
    where = [f"state {c.state}", f"iteration {c.iteration}"]
    if c.role:
        where.append(f"role {c.role}")
    if c.task:
        where.append(f"task {c.task}")
    lines = [f"Question {q.id} from session {c.session}", ", ".join(where), "",
             _clip(q.text, 3000), ""]
    if q.options:
        lines.append("Options: " + " | ".join(q.options))
    if q.default is not None:
        lines.append(f"Default: {q.default}")
    lines.append(f"Deadline: {q.deadline.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC "
                 f"(then: {q.on_timeout if q.kind == 'loop' else 'the agent goes on'})")
    lines.append("Reply to this message to answer it.")
    return "\n".join(lines)


def notice_text(sid: str, record: dict) -> str | None:
    """What a bus record tells the humans, if anything."""
    topic, payload = record.get("topic"), record.get("payload")
    if topic == "human.progress":
        where = [f"session {sid}"]
        if record.get("iteration") is not None:
            where.append(f"iteration {record['iteration']}")
        if record.get("source") and record["source"] not in ("cli", "engine"):
            where.append(str(record["source"]))
        text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        return f"[{', '.join(where)}] {text}"
    if topic == "session.transition" and isinstance(payload, dict):
        reason = f": {payload['reason']}" if payload.get("reason") else ""
        if payload.get("to") == "PAUSED":
            return f"Session {sid} paused{reason}\n/resume {sid} to go on."
        if payload.get("to") == "COMPLETE":
            if payload.get("trigger") == "abort":
                return f"Session {sid} aborted{reason}"
            return f"Session {sid} completed."
    if topic == "human.timeout" and isinstance(payload, dict):
        why = "could not be delivered" if payload.get("delivery_failed") \
            else "was not answered in time"
        then = f"; policy: {payload['policy']}" if payload.get("policy") else ""
        return f"Question {payload.get('id')} of session {sid} {why}{then}."
    return None


def _short(payload, limit: int = 80) -> str:
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# --- the bot ---

class Channel:
    """The bot of one workspace, run in a background thread (start/stop)."""

    def __init__(self, workspace: str, settings: Settings, *, primary: str | None = None,
                 log: Callable[[str], None] = stderr_log):
        self.ws = os.path.abspath(workspace)
        self.settings = settings
        self.fixed_primary = primary
        self._log = log
        self.state_dir = os.path.join(sessions_root(self.ws), STATE_DIR)
        self.state = BotState.load(os.path.join(self.state_dir, STATE_FILE), self.log)
        self.bot = None
        self._stop = threading.Event()
        self._done = threading.Event()   # not Thread.join: a ^C inside join() can leave the
        self._thread: threading.Thread | None = None   # Thread marked stopped (CPython 3.11)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._astop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()      # question deliveries
        self._replies: set[asyncio.Task] = set()    # answers to what a human wrote
        self._settled: set[tuple[str, str]] = set()   # questions sent, failed or resolved
        self._sending: set[tuple[str, str]] = set()
        self._read_offsets: dict[str, int] = {}
        self._outstanding: collections.Counter = collections.Counter()
        self._notices: collections.deque = collections.deque()   # (sid, end offset, text)
        self._notice_ready: asyncio.Event | None = None
        self._dirty_since: float | None = None
        self._children: list[subprocess.Popen] = []
        self._last_error: str | None = None

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

    def alive(self) -> bool:
        return self._thread is not None and not self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """True once the bot's thread has ended."""
        return self._done.wait(timeout)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # never let the thread print a traceback
            self.log_error("the bot stopped", e)
        finally:
            self._done.set()

    # --- logging ---

    def scrub(self, text: str) -> str:
        token = self.settings.token
        from urllib.parse import quote
        for form in {token, quote(token, safe=""), quote(token)}:
            if form:
                text = text.replace(form, "<token>")
        return re.sub(r"bot\d+:[A-Za-z0-9_-]{10,}", "bot<token>", text)

    def log(self, text: str) -> None:
        try:
            self._log(self.scrub(text))
        except Exception:
            pass

    def log_error(self, what: str, error: BaseException) -> None:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        self.log(f"{what}: {type(error).__name__}{': ' + detail if detail else ''}")

    # --- the loop ---

    async def _main(self) -> None:
        from telegram import Bot
        from telegram.request import HTTPXRequest
        _quiet_libraries()
        self._astop = asyncio.Event()
        self._notice_ready = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stop.is_set():
            return
        api = self.settings.api_url
        self.bot = Bot(self.settings.token, base_url=f"{api}/bot",
                       base_file_url=f"{api}/file/bot",
                       request=HTTPXRequest(connection_pool_size=16, read_timeout=10,
                                            write_timeout=10, connect_timeout=5,
                                            pool_timeout=5),
                       get_updates_request=HTTPXRequest(connection_pool_size=2,
                                                        read_timeout=5, connect_timeout=5))
        try:
            if not await self._initialize():
                return
            self._first_scan()
            loops = [asyncio.create_task(self._guard(name, fn)) for name, fn in
                     (("getUpdates", self._poll_loop), ("scan", self._scan_loop),
                      ("notify", self._notify_loop))]
            await self._astop.wait()
            for task in loops + list(self._tasks):
                task.cancel()
            await asyncio.gather(*loops, *self._tasks, return_exceptions=True)
            if self._replies:   # what a human asked for last still gets its reply
                _done, late = await asyncio.wait(set(self._replies), timeout=FLUSH_SECONDS)
                for task in late:
                    task.cancel()
            await self._final_flush()
        finally:
            try:
                self._save()
            except Exception as e:
                self.log_error("could not save the bot state", e)
            try:
                await self.bot.shutdown()
            except Exception:
                pass

    async def _initialize(self) -> bool:
        """getMe (a failure is logged: sends still try, with their retries); False when
        the bot is stopped meanwhile."""
        init = asyncio.create_task(self.bot.initialize())
        stopping = asyncio.create_task(self._astop.wait())
        await asyncio.wait({init, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not init.done():
            init.cancel()
            await asyncio.gather(init, return_exceptions=True)
            return False
        if init.exception() is not None:
            self.log_error("getMe failed (questions are still sent, with retries)",
                           init.exception())
        else:
            self.log(f"connected as @{self.bot.username}; serving {self.ws}")
        return True

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
                self.log_error(f"{name} failed; again in {backoff:g}s", e)
                if await self._sleep(backoff):
                    return
                backoff = min(backoff * 2, 30.0)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep; True when the bot is stopping."""
        try:
            await asyncio.wait_for(self._astop.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    def _spawn(self, coro, into: set | None = None) -> None:
        into = self._tasks if into is None else into
        task = asyncio.get_running_loop().create_task(coro)
        into.add(task)
        task.add_done_callback(into.discard)

    # --- sending ---

    async def _send(self, chat: int, text: str, *, reply_to: int | None = None,
                    force_reply: bool = False, still_wanted=None, retries: bool = True):
        """Send one message; retried after 1 s, 2 s, 4 s (a 429 after its retry_after).
        The Message, or None when it failed for good or is no longer wanted."""
        from telegram import ForceReply, ReplyParameters
        from telegram.error import BadRequest, Forbidden, InvalidToken, RetryAfter
        delays = list(BACKOFF) if retries else []
        kwargs = {}
        if force_reply:
            kwargs["reply_markup"] = ForceReply(input_field_placeholder="Your answer")
        if reply_to is not None:
            kwargs["reply_parameters"] = ReplyParameters(message_id=reply_to,
                                                         allow_sending_without_reply=True)
        while True:
            try:
                return await self.bot.send_message(chat_id=chat, text=_clip(text), **kwargs)
            except asyncio.CancelledError:
                raise
            except RetryAfter as e:
                wait = _retry_after_seconds(e)
                why = f"flood control, retry after {wait:g}s"
            except (BadRequest, Forbidden, InvalidToken) as e:
                self.log_error(f"sendMessage to chat {chat} refused", e)
                return None
            except Exception as e:
                wait, why = None, f"{type(e).__name__}: {str(e).strip()[:120]}"
            if not delays:
                self.log(f"sendMessage to chat {chat} failed ({why}); giving up")
                return None
            backoff = delays.pop(0)
            wait = backoff if wait is None else wait
            self.log(f"sendMessage to chat {chat} failed ({why}); retry in {wait:g}s")
            if await self._sleep(wait):
                return None
            if still_wanted is not None and not still_wanted():
                return None

    async def _reply(self, chat: int, text: str, reply_to: int | None) -> None:
        await self._send(chat, text, reply_to=reply_to)

    # --- outbox: questions and notifications ---

    def _first_scan(self) -> None:
        """On the bot's first run in a workspace, sessions that exist already are not
        replayed: their bus offsets start at the end (but the primary's from its start)."""
        if self.state.existed:
            return
        for sid in list_ids(self.ws):
            if sid != self.fixed_primary:
                try:
                    size = os.path.getsize(os.path.join(sessions_root(self.ws), sid,
                                                        "events.jsonl"))
                except OSError:
                    size = 0
                self.state.event_offsets[sid] = _complete_end(
                    os.path.join(sessions_root(self.ws), sid, "events.jsonl"), size)
        self._save()

    async def _scan_loop(self) -> None:
        while True:
            self._scan(questions_too=True)
            self._reap()
            if self._dirty_since is not None and time.monotonic() - self._dirty_since > 2:
                self._save()
            await asyncio.sleep(SCAN_INTERVAL)

    def _scan(self, questions_too: bool) -> None:
        root = sessions_root(self.ws)
        for sid in list_ids(self.ws):
            sdir = os.path.join(root, sid)
            try:
                if questions_too:
                    self._scan_questions(sid, sdir)
                self._scan_events(sid, sdir)
            except Exception as e:
                self.log_error(f"session {sid}: scan failed", e)

    def _scan_questions(self, sid: str, sdir: str) -> None:
        try:
            names = os.listdir(os.path.join(sdir, "questions"))
        except FileNotFoundError:
            return
        sent = None
        now = _utcnow()
        for name in sorted(names):
            if not name.endswith(".yaml") or name.startswith("."):
                continue
            key = (sid, name[:-5])
            if key in self._settled or key in self._sending:
                continue
            try:
                q = questions.load_question(sdir, key[1])
            except BadInput:
                continue
            sent = self.state.sent() if sent is None else sent
            if q.status is not questions.QuestionStatus.PENDING or q.delivery_failed \
                    or key in sent or questions.read_answer(sdir, q.id) is not None:
                self._settled.add(key)
                continue
            if now >= q.deadline and not q.timeout_paused:
                continue  # its asker is applying the timeout
            if self._finished(sid):
                self._settled.add(key)
                continue
            self._sending.add(key)
            self._spawn(self._deliver(sid, sdir, q))

    def _finished(self, sid: str) -> bool:
        try:
            return load(self.ws, sid).metadata.status in (Status.COMPLETED, Status.ABORTED)
        except BadInput:
            return True

    def _still_pending(self, sdir: str, qid: str) -> bool:
        try:
            q = questions.load_question(sdir, qid)
        except BadInput:
            return False
        return q.status is questions.QuestionStatus.PENDING and not q.delivery_failed \
            and questions.read_answer(sdir, qid) is None

    async def _deliver(self, sid: str, sdir: str, q: questions.Question) -> None:
        key = (sid, q.id)
        try:
            text = question_text(q)
            chats = self.settings.chats

            async def to(chat):
                message = await self._send(chat, text, force_reply=True,
                                           still_wanted=lambda: self._still_pending(sdir, q.id))
                if message is not None:   # remembered at once: a reply may come any moment
                    self.state.messages[f"{chat}:{message.message_id}"] = {
                        "session": sid, "question": q.id}
                    self._save()
                return message
            results = await asyncio.gather(*[to(chat) for chat in chats])
            delivered = [m for m in results if m is not None]
            if delivered:
                self._settled.add(key)
                self.log(f"question {q.id} of session {sid} sent to {len(delivered)} chat(s)")
            elif self._stop.is_set():
                pass  # stopping: whoever runs the bot next sends it
            elif self._still_pending(sdir, q.id):
                if questions.mark_delivery_failed(sdir, q.id, _utcnow()):
                    self.log(f"question {q.id} of session {sid} could not be delivered: "
                             f"it times out now (on_timeout: {q.on_timeout})")
                self._settled.add(key)
            else:
                self._settled.add(key)
        finally:
            self._sending.discard(key)

    def _scan_events(self, sid: str, sdir: str) -> None:
        path = os.path.join(sdir, "events.jsonl")
        try:
            size = os.path.getsize(path)
        except OSError:
            return
        offset = self._read_offsets.get(sid)
        if offset is None:
            offset = min(self.state.event_offsets.get(sid, 0), size)
            self._read_offsets[sid] = offset
        if size <= offset:
            return
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(size - offset)
        pos = offset
        for line in data.split(b"\n")[:-1]:   # the last piece is torn or empty
            pos += len(line) + 1
            try:
                record = json.loads(line)
            except ValueError:
                continue
            text = notice_text(sid, record) if isinstance(record, dict) else None
            if text:
                self._notices.append((sid, pos, text))
                self._outstanding[sid] += 1
                self._notice_ready.set()
        self._read_offsets[sid] = pos
        if not self._outstanding[sid] and self.state.event_offsets.get(sid) != pos:
            self.state.event_offsets[sid] = pos
            self._dirty_since = self._dirty_since or time.monotonic()

    async def _notify_loop(self) -> None:
        while True:
            await self._notice_ready.wait()
            while self._notices:
                sid, pos, text = self._notices[0]   # leaves the queue once sent
                await asyncio.gather(*[self._send(chat, text) for chat in self.settings.chats])
                self._notice_done()
            self._notice_ready.clear()

    def _notice_done(self) -> None:
        sid, pos, _text = self._notices.popleft()
        self._outstanding[sid] -= 1
        self.state.event_offsets[sid] = max(pos, self.state.event_offsets.get(sid, 0))
        if not self._outstanding[sid]:
            self.state.event_offsets[sid] = max(self._read_offsets.get(sid, pos), pos)
        self._save()

    async def _final_flush(self) -> None:
        """The session's last words (paused, completed) go out before the bot stops:
        one try each, within FLUSH_SECONDS."""
        try:
            self._scan(questions_too=False)
        except Exception as e:
            self.log_error("last scan failed", e)

        async def drain():
            while self._notices:
                _sid, _pos, text = self._notices[0]
                await asyncio.gather(*[self._send(chat, text, retries=False)
                                       for chat in self.settings.chats])
                self._notice_done()
        try:
            await asyncio.wait_for(drain(), FLUSH_SECONDS)
        except (asyncio.TimeoutError, Exception) as e:
            if not isinstance(e, asyncio.TimeoutError):
                self.log_error("last notifications failed", e)

    def _save(self) -> None:
        alive = set(list_ids(self.ws))
        for sid in [sid for sid in self.state.event_offsets if sid not in alive]:
            del self.state.event_offsets[sid]
        for key in [k for k, v in self.state.messages.items() if v["session"] not in alive]:
            del self.state.messages[key]
        self.state.save()
        self._dirty_since = None

    # --- inbox: getUpdates ---

    async def _poll_loop(self) -> None:
        failing = False
        backoff = 1.0
        while True:
            try:
                updates = await self.bot.get_updates(offset=self.state.update_offset,
                                                     timeout=POLL_TIMEOUT,
                                                     allowed_updates=["message"])
            except asyncio.CancelledError:
                raise
            except Exception as e:
                from telegram.error import RetryAfter
                text = f"{type(e).__name__}: {e}"
                if text != self._last_error:
                    self.log_error("getUpdates failed; retrying with a back-off", e)
                    self._last_error = text
                failing = True
                wait = _retry_after_seconds(e) if isinstance(e, RetryAfter) else backoff
                if await self._sleep(wait):
                    return
                backoff = min(backoff * 2, 30.0)
                continue
            if failing:
                self.log("getUpdates works again")
                failing, backoff, self._last_error = False, 1.0, None
            for update in updates:
                try:
                    self._handle(update)
                except Exception as e:
                    self.log_error(f"update {update.update_id} failed", e)
                self.state.update_offset = update.update_id + 1
                self._save()

    def _handle(self, update) -> None:
        message = update.message
        if message is None:
            return
        chat = message.chat_id
        if chat not in self.settings.chats:
            self.log(f"ignored a message from chat {chat} (not in allowed_chat_ids)")
            return
        if not message.text:
            self._spawn(self._reply(chat, "I only read text messages.", message.message_id),
                        self._replies)
            return
        answer = self.route(chat, message.text, message.reply_to_message)
        if answer:
            self._spawn(self._reply(chat, answer, message.message_id), self._replies)

    # --- routing (sync: store reads and writes; returns the reply) ---

    def route(self, chat: int, text: str, reply_to=None) -> str | None:
        """What a message from an allowed chat does; the reply to send back. `reply_to`
        is the Message it replies to, if any."""
        if reply_to is not None and not self._is_command(text):
            target = self.state.question_for(chat, reply_to.message_id)
            if target is None and self._is_me(reply_to.from_user):
                # a question message whose send the bot has not recorded yet (the reply
                # overtook the send's response), or one forgotten since: its header says
                found = QUESTION_HEADER.match(reply_to.text or "")
                target = (found.group(2), found.group(1)) if found else None
            if target is not None:
                return self._answer(chat, *target, text)
        text = text.strip()
        if text.startswith("/"):
            return self._command(text, None)
        m = AT_SESSION.fullmatch(text)
        if m:
            sid, rest = m.group(1), (m.group(2) or "").strip()
            if sid not in list_ids(self.ws):
                return f"There is no session {sid} in this workspace; /status lists them."
            if not rest:
                return f"What should session {sid} be told? Write \"@{sid} your guidance\"."
            if rest.startswith("/"):
                return self._command(rest, sid)
            return self._guidance(sid, rest)
        sid = self.primary()
        if sid is None:
            return "No open session to guide. /status lists the sessions."
        return self._guidance(sid, text)

    def _is_command(self, text: str) -> bool:
        head = text.strip().split(maxsplit=1)[0] if text.strip() else ""
        return head.startswith("/") and \
            hasattr(self, f"_cmd_{head[1:].split('@', 1)[0].lower()}")

    def _is_me(self, user) -> bool:
        if user is None or not user.is_bot:
            return False
        try:
            return user.id == self.bot.id
        except Exception:  # getMe failed: any bot of an allowed chat will do
            return True

    def primary(self) -> str | None:
        """The engine's session when an engine runs the bot; else the newest open one."""
        if self.fixed_primary:
            return self.fixed_primary
        newest = None
        for sid in list_ids(self.ws):
            try:
                m = load(self.ws, sid).metadata
            except BadInput:
                continue
            if m.status not in (Status.COMPLETED, Status.ABORTED) and \
                    (newest is None or m.created_at > newest[0]):
                newest = (m.created_at, sid)
        return newest[1] if newest else None

    def _answer(self, chat: int, sid: str, qid: str, text: str) -> str:
        try:
            session = load(self.ws, sid)
        except BadInput:
            return f"Session {sid} is gone: the answer could not be recorded."
        try:
            questions.answer(session.dir, qid, text, now=_utcnow(), channel="telegram")
        except BadInput as e:
            if "already answered" in str(e):
                try:
                    earlier = questions.read_answer(session.dir, qid)
                except BadInput:
                    earlier = None
                said = f" ({earlier.channel}): {_clip(earlier.text, 300)}" if earlier else ""
                return (f"Thank you, but question {qid} of session {sid} was already "
                        f"answered{said}. Your reply changed nothing.")
            if "cancelled" in str(e):
                return f"Question {qid} of session {sid} was cancelled: it takes no answer now."
            return f"Your answer could not be recorded: {e}"
        self.log(f"answer to question {qid} of session {sid} from chat {chat}")
        q = questions.load_question(session.dir, qid)
        if q.status is questions.QuestionStatus.TIMED_OUT:
            return (f"Answer recorded for question {qid}. It had timed out already, so it "
                    f"reaches session {sid}'s next prompt as guidance.")
        return f"Answer recorded for question {qid} of session {sid}."

    def _open(self, sid: str):
        """(session, None) or (None, why not) for a session that takes signals."""
        try:
            session = load(self.ws, sid)
        except BadInput:
            return None, f"There is no session {sid} in this workspace."
        status = session.metadata.status
        if status in (Status.COMPLETED, Status.ABORTED):
            return None, f"Session {sid} is {status.value}: it takes no more signals."
        return session, None

    def _guidance(self, sid: str, text: str) -> str:
        session, why = self._open(sid)
        if session is None:
            return why
        signals.drop(session.dir, "INFO", text, now=_utcnow(), target="ALL")
        self.log(f"guidance for session {sid}")
        reply = f"Guidance queued for session {sid}: it reaches the next agent prompt."
        waiting = questions.pending(session.dir)
        if waiting:
            reply += (f"\n(Session {sid} waits for an answer to question {waiting[0].id}: "
                      f"reply to that question's message to answer it.)")
        return reply

    def _command(self, text: str, default_sid: str | None) -> str:
        head, _, rest = text.partition(" ")
        if "\n" in head:
            head, _, more = head.partition("\n")
            rest = more + " " + rest
        name = head[1:].split("@", 1)[0].lower()
        rest = rest.strip()
        handler = getattr(self, f"_cmd_{name}", None)
        if handler is None:
            return f"Unknown command /{name}. /help lists the commands."
        explicit, rest = self._session_arg(rest)
        return handler(explicit or default_sid, rest)

    def _session_arg(self, rest: str) -> tuple[str | None, str]:
        first, _, remaining = rest.partition(" ")
        candidate = first[1:] if first.startswith("@") else first
        if candidate and candidate in list_ids(self.ws):
            return candidate, remaining.strip()
        return None, rest

    def _pick(self, sid: str | None) -> tuple[str | None, str | None]:
        sid = sid or self.primary()
        if sid is None:
            return None, "No open session; name one (/status lists them)."
        return sid, None

    def _cmd_help(self, _sid, _rest) -> str:
        return HELP.format(primary=self.primary() or "none open")

    _cmd_start = _cmd_help

    def _cmd_status(self, sid, _rest) -> str:
        from .views import list_text, list_views, session_view, status_text
        if sid is None and self.primary() is None:
            return _clip(list_text(list_views(self.ws)))
        sid, why = self._pick(sid)
        if why:
            return why
        text = status_text(session_view(self.ws, sid, last_events=5))
        others = [v for v in list_views(self.ws) if v["session_id"] != sid]
        if others:
            text += "\n\nOther sessions:\n" + list_text(others)
        return _clip(text)

    def _cmd_tasks(self, sid, _rest) -> str:
        from .views import session_view
        sid, why = self._pick(sid)
        if why:
            return why
        v = session_view(self.ws, sid, last_events=0)
        t = v["tasks"]
        lines = [f"Session {sid}, iteration {v['iteration']} ({v['state']}): {t['completed']} "
                 f"done, {t['failed']} failed, {t['pending']} pending of {t['total']}"]
        lines += [f"[{x['marker']}] {x['id']}: {x['title']} (batch {x['batch']})"
                  + (f" - {x['note']}" if x["note"] else "") for x in v["current_tasks"]]
        if not v["current_tasks"]:
            lines.append("No tasks planned yet in this iteration.")
        return _clip("\n".join(lines))

    def _cmd_tail(self, sid, rest) -> str:
        from session_store import read_events
        sid, why = self._pick(sid)
        if why:
            return why
        count = int(rest.split()[0]) if rest.split() and rest.split()[0].isdigit() else 10
        count = max(1, min(count, 50))
        try:
            session = load(self.ws, sid)
        except BadInput as e:
            return str(e)
        records, _ = read_events(session.dir)
        lines = [f"Last {min(count, len(records))} events of session {sid}:"]
        for e in records[-count:]:
            payload = "" if e.get("payload") in (None, "", {}) else " " + _short(e["payload"])
            lines.append(f"#{e['seq']} {str(e.get('ts', ''))[11:19]} {e.get('source')} "
                         f"{e['topic']}{payload}")
        return _clip("\n".join(lines))

    def _signal(self, sid, kind: str, message: str, done: str) -> str:
        sid, why = self._pick(sid)
        if why:
            return why
        session, why = self._open(sid)
        if session is None:
            return why
        iteration = session.metadata.iteration if kind in ("APPROVE", "SKIP") else None
        signals.drop(session.dir, kind, message, now=_utcnow(), iteration=iteration)
        self.log(f"{kind} signal for session {sid}")
        return done.format(sid=sid, iteration=session.metadata.iteration,
                           state=session.metadata.orchestrator.state.value)

    def _cmd_pause(self, sid, rest) -> str:
        sid, why = self._pick(sid)
        if why:
            return why
        session, why = self._open(sid)
        if session is None:
            return why
        if session.metadata.status is Status.PAUSED:
            return f"Session {sid} is paused already. /resume {sid} to go on."
        return self._signal(sid, "PAUSE", rest or "paused from Telegram",
                            "PAUSE sent to session {sid}: it pauses within a second "
                            "(resumable with /resume {sid}).")

    def _cmd_stop(self, sid, rest) -> str:
        return self._signal(sid, "ABORT", rest or "stopped from Telegram",
                            "ABORT sent to session {sid}: it stops within a second.")

    def _cmd_approve(self, sid, rest) -> str:
        return self._signal(sid, "APPROVE", rest or "approved from Telegram", _KNOWLEDGE.format(
            kind="APPROVE", what="promoted to the docs"))

    def _cmd_skip(self, sid, rest) -> str:
        return self._signal(sid, "SKIP", rest or "skipped from Telegram", _KNOWLEDGE.format(
            kind="SKIP", what="kept staged"))

    def _cmd_resume(self, sid, _rest) -> str:
        from session_store import running_pid
        if sid is None:
            sid = self._resumable()
            if sid is None:
                return "Which session? /resume SESSION (no session waits to be resumed)."
        session, why = self._open(sid)
        if session is None:
            return why
        pid = running_pid(session.dir)
        if pid is not None:
            return f"Session {sid} is running already (engine pid {pid})."
        make_dirs(self.state_dir)
        log_path = os.path.join(self.state_dir, f"resume-{sid}.log")
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "engine", "session", "resume", sid, "--workspace", self.ws],
                cwd=self.ws, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                start_new_session=True)
        finally:
            os.close(fd)
        self._children.append(child)
        self.log(f"resuming session {sid} (pid {child.pid}; output in {log_path})")
        return f"Resuming session {sid} (engine pid {child.pid})."

    def _resumable(self) -> str | None:
        """With no session named: the primary when it is paused, else the only paused one."""
        paused = []
        for sid in list_ids(self.ws):
            try:
                if load(self.ws, sid).metadata.status is Status.PAUSED:
                    paused.append(sid)
            except BadInput:
                continue
        primary = self.primary()
        if primary in paused:
            return primary
        return paused[0] if len(paused) == 1 else None

    def _reap(self) -> None:
        self._children = [c for c in self._children if c.poll() is None]


_KNOWLEDGE = ("{kind} sent to session {{sid}} for iteration {{iteration}}: the staged knowledge "
              "is {what} once the session waits in KNOWLEDGE_APPROVAL (it is in {{state}}).")


def _retry_after_seconds(error) -> float:
    value = getattr(error, "_retry_after", None)   # a timedelta; the property warns
    if value is None:
        value = error.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _complete_end(path: str, size: int) -> int:
    """The offset just past the last complete line of the first `size` bytes."""
    if size == 0:
        return 0
    with open(path, "rb") as f:
        chunk = min(size, 65536)
        f.seek(size - chunk)
        data = f.read(chunk)
    cut = data.rfind(b"\n")
    return size - chunk + cut + 1 if cut != -1 else 0


# --- hosts: inside an engine, or in the foreground ---

class EngineHost:
    """The bot as an engine runs it: only with the workspace lock; an engine that does not
    get it stands by and takes over when the holder stops."""

    def __init__(self, workspace: str, settings: Settings, primary: str,
                 log: Callable[[str], None] = stderr_log):
        self.ws, self.settings, self.primary, self._log = workspace, settings, primary, log
        self._stop = threading.Event()
        self._lock_fd: int | None = None
        self.channel: Channel | None = None
        self._standby: threading.Thread | None = None

    def start(self) -> None:
        if not self._take():
            self._standby = threading.Thread(target=self._wait_for_lock, daemon=True,
                                             name="telegram-standby")
            self._standby.start()

    def _take(self) -> bool:
        try:
            fd = try_lock(self.ws)
        except OSError as e:
            self._log(f"cannot take the bot lock ({e.strerror})")
            return True  # do not retry
        if fd is None:
            return False
        self._lock_fd = fd
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
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def start_for_session(workspace: str, session_id: str, config) -> Callable[[], None]:
    """Called by Engine.run: start the workspace's bot when Telegram is on; returns stop."""
    try:
        found = settings(config)
    except BadInput as e:   # `ralph session start/resume` refused this already
        stderr_log(f"off: {e}")
        return lambda: None
    if found is None:
        return lambda: None
    try:
        host = EngineHost(workspace, found, session_id)
        host.start()
    except Exception as e:
        stderr_log(f"could not start the bot: {type(e).__name__}")
        return lambda: None

    def stop():
        try:
            host.stop()
        except Exception as e:
            stderr_log(f"could not stop the bot cleanly: {type(e).__name__}")
    return stop


def run_foreground(workspace: str, found: Settings) -> int:
    """`ralph bot run`: serve every session of the workspace until ^C / SIGTERM."""
    fd = try_lock(workspace)
    if fd is None:
        raise BadInput(f"the Telegram bot of {workspace} runs already "
                       f"(pid {lock_holder(workspace)})")
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
        os.close(fd)
    stderr_log("bot stopped")
    return 0
