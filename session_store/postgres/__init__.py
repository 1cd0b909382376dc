"""The PostgreSQL backend: the same verbs as the file store, over a database that a fleet
of engines shares (selected by a `postgresql://` store URL).

The control plane lives in the database; each session's work area and iteration files
stay on the machine that runs it (its `dir` and `work_dir`, as in the file store). Each
promise is the database's own tool:
  - the bus is an append-only table with a per-session sequence, assigned under the
    session row's lock (gapless, ordered as committed); a record's dedupe key is a
    column under a unique constraint, checked in the same transaction (`once`);
  - first answer wins by the answers table's primary key;
  - a signal is claimed with `FOR UPDATE SKIP LOCKED` (one consumer wins, none waits);
  - metadata is saved with `UPDATE ... WHERE revision = $read`;
  - the engine's lease is a session-level advisory lock held by the engine's own
    connection: a dead engine's lease ends with its connection, no staleness guess;
  - wakeups are `LISTEN/NOTIFY` (sent in the writing transaction: heard on commit);
  - the schema is versioned and migrated on open, under an advisory lock.

A connection lost mid-write is reopened with backoff and the write retried; each write
transaction records its token in `ralph_commits`, so a retry after a commit whose answer
was lost finds it and returns its result instead of writing twice.
"""
from __future__ import annotations

from ._channel import PostgresChannel
from ._db import database
from ._sessions import PostgresSession, PostgresSessions

__all__ = ["PostgresChannel", "PostgresSession", "PostgresSessions", "database"]
