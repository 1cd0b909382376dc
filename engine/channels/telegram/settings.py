"""Where and to whom the bot talks (DESIGN §7), and logging that never shows the token.

Token and API root come from `RObot.telegram` in the config, overridden by
$RALPH_TELEGRAM_BOT_TOKEN and $RALPH_TELEGRAM_API_URL. The token never reaches a log line,
an event, a file or an error message: every line the bot logs goes through `Log`, which
scrubs it, and the libraries' own loggers (httpx logs request URLs, which carry the
token) are kept quiet.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from datetime import datetime
from typing import Callable
from urllib.parse import quote

from ralph.session_store import BadInput

TOKEN_ENV = "RALPH_TELEGRAM_BOT_TOKEN"
API_URL_ENV = "RALPH_TELEGRAM_API_URL"
DEFAULT_API_URL = "https://api.telegram.org"


class Settings:
    """Where and to whom the bot talks. Its repr never shows the token."""

    def __init__(self, token: str, api_url: str, chats: list[int]):
        self.token = token
        self.api_url = api_url
        self.chats = list(chats)

    def __repr__(self) -> str:
        return f"Settings(api_url={self.api_url!r}, chats={self.chats!r})"


def settings(config, *, require_enabled: bool = True, environ=None) -> Settings | None:
    """The bot's settings, or None when Telegram is off (RObot.enabled false). BadInput
    names the field when RObot.enabled has no token or no chat."""
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


def stderr_log(text: str) -> None:
    stamp = datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] telegram: {text}", file=sys.stderr, flush=True)


class Log:
    """The bot's one-line diagnostics, scrubbed of the token; a failing sink is ignored."""

    def __init__(self, token: str, sink: Callable[[str], None] = stderr_log):
        self._forms = {form for form in (token, quote(token, safe=""), quote(token)) if form}
        self._sink = sink

    def scrub(self, text: str) -> str:
        for form in self._forms:
            text = text.replace(form, "<token>")
        return re.sub(r"bot\d+:[A-Za-z0-9_-]{10,}", "bot<token>", text)

    def __call__(self, text: str) -> None:
        try:
            self._sink(self.scrub(text))
        except Exception:
            pass

    def error(self, what: str, error: BaseException) -> None:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        self(f"{what}: {type(error).__name__}{': ' + detail if detail else ''}")


def quiet_libraries() -> None:
    """httpx logs every request URL at INFO, and the URL carries the token; PTB logs its
    base URL at DEBUG. The bot logs its own one-line diagnostics instead."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("telegram").setLevel(logging.CRITICAL + 1)
