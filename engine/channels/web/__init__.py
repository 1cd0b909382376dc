"""`ralph web`: a live web view of a workspace's sessions. A human channel like Telegram:
it reads the store (through engine/views.py) and writes only answers, signal files and,
to resume a session, the log of the `ralph session resume` it starts.

Starlette under uvicorn serves a static page (plain JS, no build step), a small JSON API
and server-sent events, which one shared file-system watcher drives.
"""
from .server import serve

__all__ = ["serve"]
