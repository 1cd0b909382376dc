"""A human channel's own place in the store (the Telegram bot's, the web view's): its state,
the lock that lets one process run it, both the backend's, and its logs, local in every
backend (the engines it starts run here)."""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from ._atomic import FILE_MODE, make_dirs
from ._errors import BadInput
from ._ids import check_id
from ._places import check_places
from ._session import sessions_root

if TYPE_CHECKING:
    from ._interface import Held


class Channel(ABC):
    """A channel's folder, hidden beside the sessions (`.<channel>/`), and its state and
    lock (files/, postgres/)."""

    def __init__(self, workspace: str, channel: str):
        self._workspace = workspace
        self._root = sessions_root(workspace)
        check_places(workspace)
        self.dir = os.path.join(self._root, "." + check_id(channel, "channel"))

    @abstractmethod
    def read_state(self) -> bytes | None:
        """None when there is none yet."""

    @abstractmethod
    def write_state(self, text: str, kind: str) -> None: ...

    @abstractmethod
    def try_lock(self) -> "Held | None":
        """The channel's lock (`release()` lets go, and so does the holder's death), or
        None when another process holds it."""

    @abstractmethod
    def lock_holder(self) -> str: ...

    def open_log(self, name: str) -> tuple[int, str]:
        """`<name>.log`, opened for appending, private, never through a planted link: e.g.
        the output of an engine the channel started. Returns the fd and the path."""
        make_dirs(self.dir)
        path = os.path.join(self.dir, check_id(name, "log name") + ".log")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                         | os.O_CLOEXEC, FILE_MODE)
        except OSError as e:
            raise BadInput(f"{path}: cannot be opened ({e.strerror}; symlinks are refused)") \
                from None
        return fd, path
