"""A channel's state and its one-process lock, fleet-wide."""
from __future__ import annotations

import os

from .._channel import Channel
from .._ids import check_id
from ._db import HeldByConnection, database, scalar, shown_url

# --- a channel's own state and its one-process lock, fleet-wide ---

class PostgresChannel(Channel):
    """What `ChannelFiles` is for a workspace, for the fleet: a channel's state (one row)
    and the lock that lets one process run it for the whole fleet (an advisory lock on a
    connection of its own: the holder dying ends it). Its logs stay local (`open_log`)."""

    def __init__(self, workspace: str, channel: str, url: str):
        super().__init__(workspace, channel)
        self._db = database(url)
        self.channel = check_id(channel, "channel")
        self.state_path = f"{shown_url(url)} channel {self.channel} state"

    def read_state(self) -> bytes | None:
        row = self._db.read(lambda cur: cur.execute(
            "SELECT state FROM ralph_channels WHERE channel = %s", (self.channel,)).fetchone())
        return None if row is None else bytes(row[0])

    def write_state(self, text: str, kind: str) -> None:
        self._db.write(lambda cur: cur.execute(
            "INSERT INTO ralph_channels (channel, state) VALUES (%s, %s) ON CONFLICT (channel) "
            "DO UPDATE SET state = excluded.state", (self.channel, text.encode())) and None)

    def try_lock(self) -> HeldByConnection | None:
        conn = self._db.connect()
        key = self._db.lock_key("channel", self.channel)
        if not scalar(conn, "SELECT pg_try_advisory_lock(%s)", (key,)):
            conn.close()
            return None
        conn.execute("SELECT set_config('application_name', %s, false)",
                     (f"ralph {self.channel} pid {os.getpid()}",))
        return HeldByConnection(conn)

    def lock_holder(self) -> str:
        key = self._db.lock_key("channel", self.channel)
        row = self._db.read(lambda cur: cur.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid = %s "
            "AND l.objid = %s", ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone())
        if row is None or " pid " not in (row[0] or ""):
            return "unknown"
        return row[0].rsplit(" pid ", 1)[1]
