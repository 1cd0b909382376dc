"""The database under the PostgreSQL store: its schema (versioned, migrated on open),
one shared connection per process reopened with backoff, writes exactly once across a
lost connection, and the names a fleet shares (lock keys, NOTIFY payloads)."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid

import psycopg

from .._atomic import durable_write_done
from .._errors import BadInput, StoreUnreachable

# LISTEN/NOTIFY channels, payload {"s": id, "w": what, "q": qid}: the fleet's (what a
# channel serving every session hears) and each session's own (what its engine hears:
# an engine is not woken by the other sessions' changes)
CHANNEL = "ralph_changes"
RECONNECT_SECONDS = 30.0   # how long a lost database is waited for, with backoff (by default)
MIGRATIONS: list[tuple[int, str]] = [(1, """
CREATE TABLE ralph_sessions (
    id text PRIMARY KEY,
    workspace text NOT NULL,
    machine text NOT NULL,
    revision bigint NOT NULL,
    metadata text NOT NULL,
    config_snapshot bytea,
    last_seq bigint NOT NULL DEFAULT 0,
    guidance text NOT NULL DEFAULT '[]',
    created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE ralph_events (
    session_id text NOT NULL REFERENCES ralph_sessions ON DELETE CASCADE,
    seq bigint NOT NULL,
    once text,
    record text NOT NULL,
    PRIMARY KEY (session_id, seq),
    UNIQUE (session_id, once));
CREATE TABLE ralph_questions (
    session_id text NOT NULL REFERENCES ralph_sessions ON DELETE CASCADE,
    id text NOT NULL,
    question text NOT NULL,
    undeliverable text,
    PRIMARY KEY (session_id, id));
CREATE TABLE ralph_answers (
    session_id text NOT NULL,
    question_id text NOT NULL,
    answer text NOT NULL,
    PRIMARY KEY (session_id, question_id),
    FOREIGN KEY (session_id, question_id) REFERENCES ralph_questions ON DELETE CASCADE);
CREATE TABLE ralph_signals (
    session_id text NOT NULL REFERENCES ralph_sessions ON DELETE CASCADE,
    name text NOT NULL,
    raw bytea NOT NULL,
    state text NOT NULL DEFAULT 'waiting'
        CHECK (state IN ('waiting', 'taken', 'handled', 'rejected')),
    outcome text,
    PRIMARY KEY (session_id, name));
CREATE TABLE ralph_leases (
    session_id text PRIMARY KEY REFERENCES ralph_sessions ON DELETE CASCADE,
    pid integer NOT NULL,
    machine text NOT NULL,
    backend_pid integer NOT NULL);
CREATE TABLE ralph_channels (
    channel text PRIMARY KEY,
    state bytea NOT NULL);
CREATE TABLE ralph_commits (
    token uuid PRIMARY KEY,
    result text,
    at timestamptz NOT NULL DEFAULT now());
"""), (2, """
CREATE TABLE ralph_quota (
    account text NOT NULL,
    window_name text NOT NULL,
    seen_at timestamptz NOT NULL,
    reading text NOT NULL,
    PRIMARY KEY (account, window_name));
""")]
_MIGRATION_LOCK = 0x7261_6C70_6800   # "ralph" + 0: one migrator at a time


def this_machine() -> str:
    """This machine's name in the fleet: $RALPH_MACHINE, else its host name."""
    return os.environ.get("RALPH_MACHINE") or socket.gethostname()


def shown_url(url: str) -> str:
    """The URL without its password, for messages (credentials never reach a line)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the store URL"
    host = info.get("host", "localhost")
    return f"postgresql://{info.get('user', '')}@{host}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class Database:
    """One connection to the store's database, shared by a process's handles, reopened
    with backoff when lost. `write(fn)` runs fn(cursor) in a transaction, exactly once."""

    def __init__(self, url: str, *, reconnect_seconds: float | None = None):
        self.url = url
        self.reconnect_seconds = reconnect_window() if reconnect_seconds is None \
            else reconnect_seconds
        self._lock = threading.RLock()
        self._pid = os.getpid()
        # the first connection is not waited for: a command given a wrong URL, a refused
        # password or a database that is down says so at once (a lost one is waited for)
        self._conn: psycopg.Connection | None = self.connect(patience=0.0)
        self.generation = 1   # the shared connection's: a new one holds none of the old's locks
        self._locks: set[int] = set()   # advisory locks this process holds on it
        self.namespace = scalar(self._conn, "SELECT current_schema()")
        self._migrate()

    def connect(self, *, patience: float | None = None) -> psycopg.Connection:
        """A new connection of its own (a lease, a listener), with backoff for up to
        `patience` seconds (the reconnect window by default)."""
        window = self.reconnect_seconds if patience is None else patience
        deadline = time.monotonic() + window
        delay = 0.05
        while True:
            try:
                return psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            except psycopg.OperationalError as e:
                if time.monotonic() + delay > deadline:
                    raise StoreUnreachable(f"{shown_url(self.url)}: cannot reach the store's "
                                           f"database ({_first_line(e)})") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _connect(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._pid != os.getpid():
            self._conn, self._pid = self.connect(), os.getpid()
            self.generation += 1
            self._locks.clear()   # they ended with the connection that held them
        return self._conn

    # --- session-level advisory locks on the shared connection (an engine's lease) ---

    def try_lock(self, key: int, then=None) -> int | None:
        """Take advisory lock `key` on the shared connection (once per process: a second
        handle in this process is refused too), then run `then(connection)`: the
        connection's generation, or None when another holds it."""
        with self._lock:
            conn = self._connect()
            if key in self._locks or not scalar(conn, "SELECT pg_try_advisory_lock(%s)",
                                                (key,)):
                return None
            self._locks.add(key)
            if then is not None:
                then(conn)
            return self.generation

    def holds(self, key: int, generation: int) -> bool:
        """Whether the lock taken at `generation` is still held: the connection that took
        it is the shared one still (not reopened since: its locks ended with it)."""
        with self._lock:
            return generation == self.generation and key in self._locks \
                and self._conn is not None and not self._conn.closed

    def unlock(self, key: int, generation: int) -> None:
        with self._lock:
            conn = self._conn
            if conn is None or not self.holds(key, generation):
                return
            self._locks.discard(key)
            try:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            except psycopg.Error:   # the connection is gone, and the lock with it
                self._conn = None

    def lock_key(self, kind: str, name: str) -> int:
        """A 64-bit advisory lock key for one session's lease or one channel's lock, in
        this store (advisory locks are the database's: two stores in two schemas of one
        database must not share them)."""
        digest = hashlib.blake2b(f"ralph:{self.namespace}:{kind}:{name}".encode(),
                                 digest_size=8).digest()
        return int.from_bytes(digest, "big", signed=True)

    def _migrate(self) -> None:
        conn = self._connect()
        with conn.transaction():
            cur = conn.cursor()
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            cur.execute("CREATE TABLE IF NOT EXISTS ralph_schema (version integer PRIMARY KEY, "
                        "applied_at timestamptz NOT NULL DEFAULT now())")
            current = scalar(cur, "SELECT coalesce(max(version), 0) FROM ralph_schema")
            known = MIGRATIONS[-1][0]
            if current > known:
                raise BadInput(f"{shown_url(self.url)}: the store's schema is version {current}, "
                               f"newer than this ralph knows ({known}): upgrade ralph")
            for version, sql in MIGRATIONS:
                if version > current:
                    cur.execute(sql)
                    cur.execute("INSERT INTO ralph_schema (version) VALUES (%s)", (version,))
            # a commit's token is asked for only by its own retry, seconds later
            cur.execute("DELETE FROM ralph_commits WHERE at < now() - interval '1 day'")

    def read(self, fn):
        """fn(cursor), one statement (autocommit: no transaction's round trips); retried
        on a lost connection."""
        return self._run(fn, None)

    def write(self, fn):
        """fn(cursor) in a transaction, exactly once even when the connection is lost
        while committing (its token says, on retry, whether it committed and with what)."""
        return self._run(fn, uuid.uuid4())

    def _run(self, fn, token):
        deadline = time.monotonic() + self.reconnect_seconds
        delay = 0.05
        retry = False
        with self._lock:
            while True:
                try:
                    conn = self._connect()
                    if token is not None and retry:
                        found = conn.execute("SELECT result FROM ralph_commits WHERE token = %s",
                                             (token,)).fetchone()
                        if found is not None:   # committed before the connection was lost
                            return json.loads(found[0])
                    if token is None:   # a read: one statement, atomic by itself
                        return fn(conn.cursor())
                    with conn.transaction():
                        cur = conn.cursor()
                        result = fn(cur)
                        cur.execute("INSERT INTO ralph_commits (token, result) "
                                    "VALUES (%s, %s)", (token, json.dumps(result)))
                    # (the crash matrix kills right after a commit)
                    durable_write_done("store", f"postgresql:{fn.__qualname__}")
                    return result
                except psycopg.OperationalError as e:
                    if self._conn is not None and not self._conn.closed \
                            and not self._conn.broken:
                        raise   # the statement failed, not the connection
                    self._conn, retry = None, True
                    if time.monotonic() + delay > deadline:
                        raise StoreUnreachable(f"{shown_url(self.url)}: cannot reach the "
                                               f"store's database ({_first_line(e)})") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


def scalar(on, sql: str, params: tuple = ()):
    """The one value a query returns (`on`: a connection or a cursor)."""
    row = on.execute(sql, params).fetchone()
    assert row is not None, sql
    return row[0]


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def session_channel(sid: str) -> str:
    """A session's own NOTIFY channel (an identifier of at most 63 bytes, whatever its id)."""
    return "ralph_s_" + hashlib.blake2b(sid.encode(), digest_size=8).hexdigest()


def _notify(cur, session: str, what: str, question: str | None = None) -> None:
    payload = json.dumps({"s": session, "w": what, **({"q": question} if question else {})})
    cur.execute("SELECT pg_notify(%s, %s), pg_notify(%s, %s)",
                (CHANNEL, payload, session_channel(session), payload))


_databases: dict[str, Database] = {}
_databases_lock = threading.Lock()


def reconnect_window() -> float:
    """$RALPH_STORE_RECONNECT_SECONDS, else RECONNECT_SECONDS (a bad value: the default)."""
    try:
        seconds = float(os.environ.get("RALPH_STORE_RECONNECT_SECONDS", RECONNECT_SECONDS))
    except ValueError:
        return RECONNECT_SECONDS
    return seconds if 0 <= seconds < 86400 else RECONNECT_SECONDS


def database(url: str) -> Database:
    """The process's connection to `url` (one per process, shared by its handles)."""
    with _databases_lock:
        db = _databases.get(url)
        if db is None or db._pid != os.getpid():
            db = _databases[url] = Database(url)
        return db




class HeldByConnection:
    """An advisory lock held by a connection of its own (a channel's, one in a fleet):
    `release()` lets go at once (a closed connection's backend lets go only when it has
    exited), and the holder's death lets go too (its connection ends)."""

    def __init__(self, conn: psycopg.Connection):
        self._conn = conn

    def release(self) -> None:
        try:
            self._conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:   # the connection is gone, and the lock with it
            pass
        self._conn.close()
