"""The Bot API calls the bot makes, through python-telegram-bot's `Bot`.

A failed send is retried after 1 s, 2 s and 4 s, a 429 after its `retry_after`; a send
the API refuses for good (bad request, forbidden, bad token) is not retried. `Transport`
takes the API root and the token; tests hand it a stand-in `bot` instead.
"""
from __future__ import annotations

import asyncio
import warnings
from datetime import timedelta
from typing import Awaitable, Callable

from .settings import Log
from .texts import Message

BACKOFF = (1.0, 2.0, 4.0)   # a failed send is retried after 1 s, 2 s and 4 s

Sleep = Callable[[float], Awaitable[bool]]   # sleeps; True when the bot is stopping


class Transport:
    def __init__(self, token: str, api_url: str, log: Log, sleep: Sleep, *, bot=None):
        self._log = log
        self._sleep = sleep
        self.bot = bot if bot is not None else _ptb_bot(token, api_url)

    @property
    def bot_id(self) -> int | None:
        """The bot's own user id, or None before a getMe that worked."""
        try:
            return self.bot.id
        except Exception:   # PTB raises until initialize() has fetched getMe
            return None

    async def connect(self, stopping: asyncio.Event) -> bool:
        """getMe (a failure is logged: sends still try, with their retries); False when
        the bot is stopped meanwhile."""
        init = asyncio.create_task(self.bot.initialize())
        stop = asyncio.create_task(stopping.wait())
        await asyncio.wait({init, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not init.done():
            init.cancel()
            await asyncio.gather(init, return_exceptions=True)
            return False
        if init.exception() is not None:
            self._log.error("getMe failed (questions are still sent, with retries)",
                            init.exception())
        else:
            self._log(f"connected as @{self.bot.username}")
        return True

    async def close(self) -> None:
        try:
            await self.bot.shutdown()
        except Exception:
            pass

    async def get_updates(self, offset: int | None, timeout: int):
        return await self.bot.get_updates(offset=offset, timeout=timeout,
                                          allowed_updates=["message"])

    async def send(self, chat: int, message: Message | str, *, reply_to: int | None = None,
                   force_reply: bool = False,
                   still_wanted: Callable[[], Awaitable[bool]] | None = None,
                   retries: bool = True):
        """Send one message (a plain text is escaped and clipped here), with the retries.
        The Bot API's Message, or None when it failed for good, the bot is stopping, or
        `still_wanted()` says it is no longer wanted."""
        from telegram import ForceReply, MessageEntity, ReplyParameters
        from telegram.error import BadRequest, Forbidden, InvalidToken, RetryAfter
        delays = list(BACKOFF) if retries else []
        if isinstance(message, str):
            message = Message.plain(message)
        kwargs = {}
        if message.quote is not None:
            offset, length = message.quote
            kwargs["entities"] = [MessageEntity(MessageEntity.BLOCKQUOTE, offset, length)]
        if force_reply:
            kwargs["reply_markup"] = ForceReply(input_field_placeholder="Your answer")
        if reply_to is not None:
            kwargs["reply_parameters"] = ReplyParameters(message_id=reply_to,
                                                         allow_sending_without_reply=True)
        while True:
            try:
                return await self.bot.send_message(chat_id=chat, text=message.text, **kwargs)
            except asyncio.CancelledError:
                raise
            except RetryAfter as e:
                wait = retry_after_seconds(e)
                why = f"flood control, retry after {wait:g}s"
            except (BadRequest, Forbidden, InvalidToken) as e:
                self._log.error(f"sendMessage to chat {chat} refused", e)
                return None
            except Exception as e:
                wait, why = None, f"{type(e).__name__}: {str(e).strip()[:120]}"
            if not delays:
                self._log(f"sendMessage to chat {chat} failed ({why}); giving up")
                return None
            backoff = delays.pop(0)
            wait = backoff if wait is None else wait
            self._log(f"sendMessage to chat {chat} failed ({why}); retry in {wait:g}s")
            if await self._sleep(wait):
                return None
            if still_wanted is not None and not await still_wanted():
                return None


def retry_after_seconds(error) -> float:
    """A 429's wait, through PTB's public `retry_after`: seconds, or a timedelta once PTB
    makes it one (PTB 22.2 warns of that change at each read; not ours to show)."""
    from telegram.warnings import PTBDeprecationWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = error.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _ptb_bot(token: str, api_url: str):
    from telegram import Bot
    from telegram.request import HTTPXRequest
    return Bot(token, base_url=f"{api_url}/bot", base_file_url=f"{api_url}/file/bot",
               request=HTTPXRequest(connection_pool_size=16, read_timeout=10, write_timeout=10,
                                    connect_timeout=5, pool_timeout=5),
               get_updates_request=HTTPXRequest(connection_pool_size=2, read_timeout=5,
                                                connect_timeout=5))
