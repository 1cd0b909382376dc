"""A fake Telegram Bot API on 127.0.0.1, for the real python-telegram-bot client.

It serves `/bot<TOKEN>/<method>` (getMe, sendMessage, getUpdates with its long-poll, and
anything else as `true`), records every call and every sent message, queues updates that
tests inject (messages and replies from any chat), and plays scripted failures (500, 429
with `parameters.retry_after`) before answering normally.
"""
from __future__ import annotations

import collections
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

BOT_USER = {"id": 4242, "is_bot": True, "first_name": "Ralph", "username": "ralph_test_bot"}


class FakeTelegram:
    def __init__(self, token: str):
        self.token = token
        self.cond = threading.Condition()
        self.calls: list[dict] = []          # {method, params, at}
        self.sent: list[dict] = []           # Message objects the bot sent
        self.updates: list[dict] = []        # queued, not yet confirmed
        self.confirmed = 0                   # highest update_id confirmed by an offset
        self.failures: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.wrong_tokens = 0
        self._update_id = 100
        self._message_id = 5000
        self._user_message_id = 1
        self._stopping = False
        self.pushed: dict[int, dict] = {}    # update_id -> the user's message
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                fake._serve(self)

            do_GET = do_POST

            def log_message(self, *_args):  # request lines carry the token: keep quiet
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that hung up on a long-poll (the bot stopping)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # --- lifecycle ---

    def __enter__(self) -> "FakeTelegram":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # --- scripting ---

    def fail(self, method: str, status: int = 500, retry_after: int | None = None,
             times: int = 1) -> None:
        """The next `times` calls of `method` fail with `status`."""
        body = {"ok": False, "error_code": status,
                "description": "Too Many Requests: retry after %s" % retry_after
                if status == 429 else "Internal Server Error"}
        if retry_after is not None:
            body["parameters"] = {"retry_after": retry_after}
        with self.cond:
            for _ in range(times):
                self.failures[method].append((status, body))

    def push(self, chat_id: int, text: str | None, reply_to: dict | None = None,
             user_id: int | None = None) -> int:
        """Queue a user's message (a reply when `reply_to` is a sent message); its update_id."""
        with self.cond:
            self._update_id += 1
            self._user_message_id += 1
            message = {"message_id": self._user_message_id, "date": int(time.time()),
                       "chat": {"id": chat_id, "type": "private"},
                       "from": {"id": user_id or chat_id, "is_bot": False, "first_name": "Ada"}}
            if text is not None:
                message["text"] = text
            if reply_to is not None:
                message["reply_to_message"] = reply_to
            update = {"update_id": self._update_id, "message": message}
            self.updates.append(update)
            self.pushed[self._update_id] = message
            self.cond.notify_all()
            return self._update_id

    # --- reading ---

    def messages(self, chat_id: int | None = None) -> list[dict]:
        with self.cond:
            return [m for m in self.sent if chat_id is None or m["chat"]["id"] == chat_id]

    def calls_of(self, method: str) -> list[dict]:
        with self.cond:
            return [c for c in self.calls if c["method"] == method]

    def wait_message(self, predicate, timeout: float = 20) -> dict:
        """The first sent message for which predicate(message) holds (waits for it)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for m in self.sent:
                    if predicate(m):
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    texts = [m.get("text", "")[:80] for m in self.sent]
                    raise AssertionError(f"no such message after {timeout}s; sent: {texts}")
                self.cond.wait(left)

    def wait_text(self, fragment: str, chat_id: int | None = None, timeout: float = 20,
                  after: int = 0) -> dict:
        """The first message (from index `after` on) containing `fragment`."""
        return self.wait_message(lambda m: fragment in m.get("text", "")
                                 and (chat_id is None or m["chat"]["id"] == chat_id)
                                 and self.sent.index(m) >= after, timeout)

    def wait_reply(self, update_id: int, timeout: float = 20) -> dict:
        """The bot's reply to the message of update `update_id`."""
        with self.cond:
            target = self.pushed[update_id]
        return self.wait_message(
            lambda m: (m.get("reply_to_message") or {}).get("message_id") == target["message_id"]
            and m["chat"]["id"] == target["chat"]["id"], timeout)

    def wait_polling(self, timeout: float = 20) -> None:
        """Until the bot has long-polled getUpdates at least once."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not any(c["method"] == "getUpdates" for c in self.calls):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("the bot never called getUpdates")
                self.cond.wait(left)

    def wait_confirmed(self, update_id: int, timeout: float = 20) -> None:
        """Until the bot confirmed `update_id` (asked for a later offset)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.confirmed < update_id:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"update {update_id} never confirmed")
                self.cond.wait(left)

    # --- serving ---

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        length = int(request.headers.get("Content-Length") or 0)
        raw = request.rfile.read(length) if length else b""
        params = _params(raw, request.headers.get("Content-Type", ""))
        if len(parts) != 2 or not parts[0].startswith("bot"):
            return _reply(request, 404, {"ok": False, "error_code": 404,
                                         "description": "Not Found"})
        if parts[0][3:] != self.token:
            with self.cond:
                self.wrong_tokens += 1
            return _reply(request, 401, {"ok": False, "error_code": 401,
                                         "description": "Unauthorized"})
        method = parts[1]
        with self.cond:
            self.calls.append({"method": method, "params": params, "at": time.monotonic()})
            self.cond.notify_all()
            failure = self.failures[method].popleft() if self.failures[method] else None
        if failure is not None:
            return _reply(request, failure[0], failure[1])
        if method == "getMe":
            return _reply(request, 200, {"ok": True, "result": BOT_USER})
        if method == "sendMessage":
            return _reply(request, 200, {"ok": True, "result": self._record(params)})
        if method == "getUpdates":
            return _reply(request, 200, {"ok": True, "result": self._get_updates(params)})
        return _reply(request, 200, {"ok": True, "result": True})

    def _record(self, params: dict) -> dict:
        with self.cond:
            self._message_id += 1
            message = {"message_id": self._message_id, "date": int(time.time()),
                       "chat": {"id": int(params["chat_id"]), "type": "private"},
                       "from": BOT_USER, "text": str(params.get("text", ""))}
            reply = params.get("reply_parameters")
            if isinstance(reply, dict):
                original = next((m for m in self.pushed.values()
                                 if m["message_id"] == reply.get("message_id")
                                 and m["chat"]["id"] == message["chat"]["id"]), None)
                message["reply_to_message"] = original or {"message_id": reply.get("message_id")}
            if params.get("entities"):   # what the client shows as a quote, a code span...
                message["entities"] = params["entities"]
            markup = params.get("reply_markup")
            if markup:
                message["reply_markup_sent"] = markup
            self.sent.append(message)
            self.cond.notify_all()
            return {k: v for k, v in message.items() if k != "reply_markup_sent"}

    def _get_updates(self, params: dict) -> list[dict]:
        offset = int(params.get("offset") or 0)
        timeout = float(params.get("timeout") or 0)
        deadline = time.monotonic() + timeout
        with self.cond:
            if offset:
                self.confirmed = max(self.confirmed, offset - 1)
                self.updates = [u for u in self.updates if u["update_id"] >= offset]
                self.cond.notify_all()
            while True:
                ready = [u for u in self.updates if u["update_id"] >= offset]
                left = deadline - time.monotonic()
                if ready or left <= 0 or self._stopping:
                    return ready
                self.cond.wait(left)


def _params(raw: bytes, content_type: str) -> dict:
    if not raw:
        return {}
    if "json" in content_type:
        return json.loads(raw)
    out = {}
    for key, values in parse_qs(raw.decode(), keep_blank_values=True).items():
        value = values[-1]
        try:   # PTB sends strings as they are and everything else as JSON
            out[key] = value if key == "text" else json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _reply(request: BaseHTTPRequestHandler, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)
