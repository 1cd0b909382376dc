"""The engine's lease on a session: a session-level advisory lock on the engine's shared
connection to the store, and who holds it (pg_locks: the database's own view of live
holders). The engine dying ends its connection, and the lease with it."""
from __future__ import annotations

import os
import time

from .._errors import SessionLocked
from ._db import Database, this_machine


class PostgresLease:
    """The engine's hold on a session, for its lifetime."""

    def __init__(self, db: Database, sid: str, generation: int):
        self._db, self.session_id, self._generation = db, sid, generation
        self._key = db.lock_key("lease", sid)

    def keep(self) -> None:
        """The connection that held it was lost (the database restarted, its backend was
        killed) and the lock went with it: taken again at once, unless another engine was
        quicker (SessionLocked)."""
        if not self._db.holds(self._key, self._generation):
            self._generation = type(self).take(self._db, self.session_id, 0)._generation

    def release(self) -> None:
        self._db.unlock(self._key, self._generation)

    @classmethod
    def take(cls, db: Database, sid: str, wait_seconds: float) -> "PostgresLease":
        def name_holder(conn) -> None:
            conn.execute("INSERT INTO ralph_leases (session_id, pid, machine, backend_pid) "
                         "VALUES (%s, %s, %s, pg_backend_pid()) ON CONFLICT (session_id) "
                         "DO UPDATE SET pid = excluded.pid, machine = excluded.machine, "
                         "backend_pid = excluded.backend_pid",
                         (sid, os.getpid(), this_machine()))
        deadline = time.monotonic() + wait_seconds
        while (generation := db.try_lock(db.lock_key("lease", sid), name_holder)) is None:
            if time.monotonic() >= deadline:
                holder = _lease_holder(db, sid)
                raise SessionLocked(f"session {sid} is locked by a running engine "
                                    f"(pid {holder if holder and holder > 0 else 'unknown'})")
            time.sleep(0.01)
        return cls(db, sid, generation)


def _lease_holder(db: Database, sid: str) -> int | None:
    """The pid of the engine holding a session's lease (-1: held, holder unnamed), or None.
    pg_locks lists the whole cluster's locks: only this database's are its store's (a
    session of the same id in another database is another fleet's)."""
    key = db.lock_key("lease", sid)
    row = db.read(lambda cur: cur.execute(
        "SELECT coalesce(e.pid, -1) FROM pg_locks l "
        "LEFT JOIN ralph_leases e ON e.session_id = %s AND e.backend_pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid = %s AND l.objid = %s",
        (sid, (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone())
    return None if row is None else row[0]
