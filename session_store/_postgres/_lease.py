"""The engine's lease on a session: a session-level advisory lock on a connection of its
own, and who holds it (pg_locks: the database's own view of live holders)."""
from __future__ import annotations

import os
import time

import psycopg

from .._errors import SessionLocked
from ._db import HeldByConnection, scalar, Database, _lock_key, this_machine


class PostgresLease(HeldByConnection):
    """The engine's hold on a session: a session-level advisory lock on a connection of
    its own. The engine dying closes the connection, which ends the lease."""

    def __init__(self, conn: psycopg.Connection, sid: str, db: Database):
        super().__init__(conn)
        self.session_id, self._db = sid, db

    def keep(self) -> None:
        """Its connection lost (the database restarted, its backend was killed), the lock
        went with it: taken again at once, unless another engine was quicker."""
        if self.held():
            return
        self._conn = type(self).take(self._db, self.session_id, 0)._conn

    @classmethod
    def take(cls, db: Database, sid: str, wait_seconds: float) -> "PostgresLease":
        conn = db.connect()
        key = _lock_key("lease", sid)
        deadline = time.monotonic() + wait_seconds
        while not scalar(conn, "SELECT pg_try_advisory_lock(%s)", (key,)):
            if time.monotonic() >= deadline:
                conn.close()
                holder = _lease_holder(db, sid)
                raise SessionLocked(f"session {sid} is locked by a running engine "
                                    f"(pid {holder if holder and holder > 0 else 'unknown'})")
            time.sleep(0.01)
        conn.execute("INSERT INTO ralph_leases (session_id, pid, machine, backend_pid) "
                     "VALUES (%s, %s, %s, pg_backend_pid()) ON CONFLICT (session_id) DO UPDATE "
                     "SET pid = excluded.pid, machine = excluded.machine, "
                     "backend_pid = excluded.backend_pid", (sid, os.getpid(), this_machine()))
        return cls(conn, sid, db)


def _lease_holder(db: Database, sid: str) -> int | None:
    """The pid of the engine holding a session's lease (-1: held, holder unnamed), or None.
    pg_locks lists the whole cluster's locks: only this database's are its store's (a
    session of the same id in another database is another fleet's)."""
    key = _lock_key("lease", sid)
    row = db.read(lambda cur: cur.execute(
        "SELECT coalesce(e.pid, -1) FROM pg_locks l "
        "LEFT JOIN ralph_leases e ON e.session_id = %s AND e.backend_pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid = %s AND l.objid = %s",
        (sid, (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone())
    return None if row is None else row[0]
