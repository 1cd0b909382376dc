"""The Telegram channel (seed 000, DESIGN §7), on python-telegram-bot's `Bot`.

    settings   config and environment, the token-scrubbing log
    transport  the Bot API calls, with their retries
    state      the bot's persisted memory (offsets, which message asked what)
    outbox     questions and notices out, woken by the shared file watcher
    router     a pure function from what a chat wrote to an action
    commands   the actions, through the store
    inbox      getUpdates, routed and carried out in order
    host       the thread and event loop it runs in; the workspace lock; `ralph bot run`

The engine needs only `start_for_session(workspace, session_id, config) -> stop`; the CLI
`check`, `settings` and `run_foreground`. The host (asyncio, and python-telegram-bot with
it) is imported when first used, as session_store does, so importing this is cheap.
"""
from importlib import import_module

from .settings import TOKEN_ENV, Settings, check, settings

__all__ = ["TOKEN_ENV", "Settings", "check", "settings", "start_for_session", "run_foreground"]


def __getattr__(name):
    if name in ("start_for_session", "run_foreground"):
        return getattr(import_module(f"{__name__}.host"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
