"""What the chats write: getUpdates long-polled, each update routed (router.route, pure)
and carried out (commands.Commands, store I/O in a worker thread), in the order they
came; the bot's reply to each goes out without holding up the next."""
from __future__ import annotations

import asyncio

from ralph.session_store import list_ids

from .commands import Commands
from .router import Replied, route
from .settings import Log
from .state import BotState
from .transport import Sleep, Transport, retry_after_seconds

POLL_TIMEOUT = 25   # getUpdates long-poll, seconds; stopping the bot cancels it at once


class Inbox:
    def __init__(self, workspace: str, chats: list[int], transport: Transport,
                 state: BotState, commands: Commands, log: Log, sleep: Sleep):
        self.ws = workspace
        self.chats = chats
        self.transport = transport
        self.state = state
        self.commands = commands
        self.log = log
        self._sleep = sleep
        self.replies: set[asyncio.Task] = set()   # answers to what a human wrote

    async def poll_forever(self) -> None:
        from telegram.error import RetryAfter
        failing, backoff, last_error = False, 1.0, None
        while True:
            try:
                updates = await self.transport.get_updates(self.state.update_offset,
                                                           POLL_TIMEOUT)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                text = f"{type(e).__name__}: {e}"
                if text != last_error:
                    self.log.error("getUpdates failed; retrying with a back-off", e)
                    last_error = text
                failing = True
                wait = retry_after_seconds(e) if isinstance(e, RetryAfter) else backoff
                if await self._sleep(wait):
                    return
                backoff = min(backoff * 2, 30.0)
                continue
            if failing:
                self.log("getUpdates works again")
                failing, backoff, last_error = False, 1.0, None
            for update in updates:
                try:
                    await self.handle(update)
                except Exception as e:
                    self.log.error(f"update {update.update_id} failed", e)
                self.state.update_offset = update.update_id + 1
            if updates:   # not urgent: the next getUpdates confirms them to the API anyway
                self.state.save_later()

    async def handle(self, update) -> None:
        """Carry out one update; its reply is sent in the background (`replies`)."""
        message = update.message
        if message is None:
            return
        chat = message.chat_id
        replied = None
        original = message.reply_to_message
        if original is not None:
            replied = Replied(text=original.text, from_bot=self._from_me(original.from_user),
                              question=self.state.question_for(chat, original.message_id))
        reply = await asyncio.to_thread(self._act, chat, message.text, replied)
        if reply:
            task = asyncio.get_running_loop().create_task(
                self.transport.send(chat, reply, reply_to=message.message_id))
            self.replies.add(task)
            task.add_done_callback(self.replies.discard)

    def _act(self, chat: int, text: str | None, replied: Replied | None) -> str | None:
        """The worker thread's part: route, then act through the store."""
        action = route(chat, text, allowed=self.chats, sessions=list_ids(self.ws),
                       replied=replied)
        return self.commands.run(action, chat)

    def _from_me(self, user) -> bool:
        if user is None or not user.is_bot:
            return False
        bot_id = self.transport.bot_id
        return bot_id is None or user.id == bot_id   # getMe failed: any bot of an allowed chat
