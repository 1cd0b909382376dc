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

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from datetime import datetime
from typing import Callable

import psycopg

from ._changes import Change
from ._codec import structure, unstructure
from ._errors import (AlreadyAnswered, BadInput, QuestionCancelled, SessionLocked,
                      StaleMetadata, UnknownQuestion, UnknownSession)
from ._events import ONCE, _without_lone_surrogates, now_iso
from ._iteration import Iteration
from ._metadata import GitInfo, Limits, SessionMetadata
from ._places import StateDirInWorkspace, check_state_dir
from ._questions import Answer, Question, QuestionStatus, Undeliverable, chosen_option
from ._schema import dump_plain, parse_yaml
from ._session import SCRATCHPAD_FILE, Session, check_id, new_session_id, sessions_root
from ._signals import Signal, validate

CHANNEL = "ralph_changes"          # LISTEN/NOTIFY channel: {"s": id, "w": what, "q": qid}
RECONNECT_SECONDS = 30.0           # how long a lost database is waited for, with backoff
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
""")]
_MIGRATION_LOCK = 0x7261_6C70_6800   # "ralph" + 0: one migrator at a time


def this_machine() -> str:
    """This machine's name in the fleet: $RALPH_MACHINE, else its host name."""
    return os.environ.get("RALPH_MACHINE") or socket.gethostname()


def _lock_key(kind: str, name: str) -> int:
    """A 64-bit advisory lock key for one session's lease or one channel's lock."""
    digest = hashlib.blake2b(f"ralph:{kind}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def shown_url(url: str) -> str:
    """The URL without its password, for messages (credentials never reach a line)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the store URL"
    host = info.get("host", "localhost")
    return f"postgresql://{info.get('user', '')}@{host}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class StoreUnreachable(BadInput):
    """The database did not answer within RECONNECT_SECONDS: one line, the engine pauses
    resumably (nothing half-written: a transaction is whole or absent)."""


class Database:
    """One connection to the store's database, shared by a process's handles, reopened
    with backoff when lost. `write(fn)` runs fn(cursor) in a transaction, exactly once."""

    def __init__(self, url: str, *, reconnect_seconds: float = RECONNECT_SECONDS):
        self.url = url
        self.reconnect_seconds = reconnect_seconds
        self._lock = threading.RLock()
        self._conn: psycopg.Connection | None = None
        self._pid = os.getpid()
        self._connect()
        self._migrate()

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection:
        """A new connection of its own (a lease, a listener), with backoff."""
        deadline = time.monotonic() + self.reconnect_seconds
        delay = 0.05
        while True:
            try:
                return psycopg.connect(self.url, autocommit=autocommit, connect_timeout=5)
            except psycopg.OperationalError as e:
                if time.monotonic() + delay > deadline:
                    raise StoreUnreachable(f"{shown_url(self.url)}: the store's database does "
                                           f"not answer ({_first_line(e)})") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _connect(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._pid != os.getpid():
            self._conn, self._pid = self.connect(), os.getpid()
        return self._conn

    def _migrate(self) -> None:
        with self._connect().transaction():
            cur = self._conn.cursor()
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            cur.execute("CREATE TABLE IF NOT EXISTS ralph_schema (version integer PRIMARY KEY, "
                        "applied_at timestamptz NOT NULL DEFAULT now())")
            cur.execute("SELECT coalesce(max(version), 0) FROM ralph_schema")
            current = cur.fetchone()[0]
            for version, sql in MIGRATIONS:
                if version > current:
                    cur.execute(sql)
                    cur.execute("INSERT INTO ralph_schema (version) VALUES (%s)", (version,))

    def read(self, fn):
        """fn(cursor) in a read-only transaction; retried on a lost connection."""
        return self._run(fn, None)

    def write(self, fn):
        """fn(cursor) in a transaction, exactly once even when the connection is lost
        while committing (its token says, on retry, whether it committed and with what)."""
        return self._run(fn, uuid.uuid4())

    def _run(self, fn, token):
        deadline = time.monotonic() + self.reconnect_seconds
        delay = 0.05
        with self._lock:
            while True:
                try:
                    conn = self._connect()
                    if token is not None:
                        found = conn.execute("SELECT result FROM ralph_commits WHERE token = %s",
                                             (token,)).fetchone()
                        if found is not None:   # committed before the connection was lost
                            return json.loads(found[0])
                    with conn.transaction():
                        cur = conn.cursor()
                        result = fn(cur)
                        if token is not None:
                            cur.execute("INSERT INTO ralph_commits (token, result) "
                                        "VALUES (%s, %s)", (token, json.dumps(result)))
                    return result
                except psycopg.OperationalError as e:
                    if self._conn is not None and not self._conn.closed \
                            and not self._conn.broken:
                        raise   # the statement failed, not the connection
                    self._conn = None
                    if time.monotonic() + delay > deadline:
                        raise StoreUnreachable(f"{shown_url(self.url)}: the store's database "
                                               f"does not answer ({_first_line(e)})") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _notify(cur, session: str, what: str, question: str | None = None) -> None:
    payload = {"s": session, "w": what, **({"q": question} if question else {})}
    cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps(payload)))


_databases: dict[str, Database] = {}
_databases_lock = threading.Lock()


def database(url: str) -> Database:
    """The process's connection to `url` (one per process, shared by its handles)."""
    with _databases_lock:
        db = _databases.get(url)
        if db is None or db._pid != os.getpid():
            db = _databases[url] = Database(url)
        return db


# --- the store: every session of the fleet, by id ---

class PostgresSessions:
    """The sessions in one database (every machine's), by id: what `Sessions` is for a
    workspace's files. `workspace` is where sessions made here keep their local areas."""

    def __init__(self, url: str, workspace: str | None = None):
        self.url = url
        self.workspace = workspace
        self.db = database(url)

    def ids(self) -> list[str]:
        return self.db.read(lambda cur: [r[0] for r in cur.execute(
            "SELECT id FROM ralph_sessions ORDER BY id").fetchall()])

    def where(self, sid: str) -> tuple[str, str]:
        """(machine, workspace) of a session: where its engine runs and resumes."""
        row = self.db.read(lambda cur: cur.execute(
            "SELECT machine, workspace FROM ralph_sessions WHERE id = %s",
            (check_id(sid),)).fetchone())
        if row is None:
            raise UnknownSession(f"unknown session {sid!r} in {shown_url(self.url)}")
        return row

    def load(self, sid: str) -> "PostgresSession":
        check_id(sid)
        row = self.db.read(lambda cur: cur.execute(
            "SELECT workspace, machine, metadata FROM ralph_sessions WHERE id = %s",
            (sid,)).fetchone())
        if row is None:
            raise UnknownSession(f"unknown session {sid!r} in {shown_url(self.url)}")
        workspace, machine, text = row
        where = f"{shown_url(self.url)} session {sid} metadata"
        meta = structure(parse_yaml(text, where), SessionMetadata, where)
        if meta.session_id != sid:
            raise BadInput(f"{where}: $.session_id: expected {sid!r}, got {meta.session_id!r}")
        return PostgresSession(self, workspace, sid, meta, machine)

    def create(self, objective: str, *, now: datetime, session_id: str | None = None,
               limits: Limits | None = None, config_path: str | None = None,
               config_snapshot: str | None = None, git: GitInfo | None = None
               ) -> "PostgresSession":
        """The session's local areas, then its row, its config and its first record in one
        transaction (the commit point: before it there is no session)."""
        workspace = self.workspace
        if workspace is None:
            raise BadInput("a session is made in a workspace: none given")
        session_id = check_id(session_id) if session_id else new_session_id(now)
        try:
            check_state_dir(workspace)
        except StateDirInWorkspace as e:
            raise BadInput(str(e)) from None
        meta = SessionMetadata(session_id=session_id, objective=objective, created_at=now,
                               updated_at=now, limits=limits or Limits(),
                               config_path=config_path, git=git)
        session = PostgresSession(self, workspace, session_id, meta, this_machine())
        from ._atomic import make_dirs
        make_dirs(os.path.join(session.dir, "iterations"))
        session.work.start_fresh()
        session.work.write(SCRATCHPAD_FILE, "# Scratchpad\n", "scratchpad")
        Iteration(session.dir, 1, session.work).create(now)
        meta.revision = 1
        record = session._record("session.created", {"objective": objective}, "engine",
                                 now.isoformat(), None, None, seq=1)

        def insert(cur):
            cur.execute("INSERT INTO ralph_sessions (id, workspace, machine, revision, metadata, "
                        "config_snapshot, last_seq) VALUES (%s, %s, %s, 1, %s, %s, 1) "
                        "ON CONFLICT (id) DO NOTHING",
                        (session_id, os.path.abspath(workspace), this_machine(),
                         dump_plain(unstructure(meta)),
                         config_snapshot.encode() if config_snapshot is not None else None))
            if cur.rowcount != 1:
                return False
            cur.execute("INSERT INTO ralph_events (session_id, seq, record) VALUES (%s, 1, %s)",
                        (session_id, record))
            _notify(cur, session_id, "session")
            return True
        if not self.db.write(insert):
            raise BadInput(f"session {session_id} already exists in {shown_url(self.url)}")
        return session

    def events_after(self, sid: str, seq: int) -> list[dict]:
        return _events_after(self.db, check_id(sid), seq)

    def last_seq(self, sid: str) -> int:
        return _last_seq(self.db, check_id(sid))

    def questions(self, sid: str) -> "PostgresQuestions":
        return PostgresQuestions(self.db, check_id(sid))

    def watch(self, notify: Callable[[Change], None]) -> "Listener":
        """`notify(change)` for every session's change in the fleet (LISTEN/NOTIFY)."""
        return Listener(self.db, lambda change: notify(change))


class Listener:
    """A LISTEN on its own connection, in a thread; calling it stops it. It hears every
    session, so `add` has nothing to do (the file store's watcher follows by directory)."""

    def __init__(self, db: Database, notify: Callable[[Change], None],
                 session: str | None = None, whats: tuple[str, ...] | None = None):
        self._db, self._notify = db, notify
        self._session, self._whats = session, whats
        self._stop = threading.Event()
        self.failed: str | None = None
        self._conn = db.connect()
        self._conn.execute(f"LISTEN {CHANNEL}")
        self._thread = threading.Thread(target=self._listen, daemon=True,
                                        name="ralph-store-listen")
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                for note in self._conn.notifies(timeout=0.5):
                    self._heard(note.payload)
            except psycopg.OperationalError:
                if self._stop.is_set():
                    return
                try:   # the database restarted: listen again (and say something changed)
                    self._conn = self._db.connect()
                    self._conn.execute(f"LISTEN {CHANNEL}")
                    if self._session is not None:
                        self._notify(Change(self._session, "events"))
                except BadInput as e:
                    self.failed = str(e)
                    time.sleep(1.0)

    def _heard(self, payload: str) -> None:
        try:
            data = json.loads(payload)
            change = Change(data["s"], data["w"], data.get("q"))
        except (ValueError, KeyError, TypeError):
            return
        if self._session is not None and change.session != self._session:
            return
        if self._whats is not None and change.what not in self._whats:
            return
        self._notify(change)

    def add(self, sid: str) -> None:
        """Every session is heard already."""

    def __call__(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._conn.close()
        except psycopg.Error:
            pass


def _events_after(db: Database, sid: str, seq: int) -> list[dict]:
    rows = db.read(lambda cur: cur.execute(
        "SELECT record FROM ralph_events WHERE session_id = %s AND seq > %s ORDER BY seq",
        (sid, seq)).fetchall())
    return [json.loads(r[0]) for r in rows]


def _last_seq(db: Database, sid: str) -> int:
    row = db.read(lambda cur: cur.execute(
        "SELECT last_seq FROM ralph_sessions WHERE id = %s", (sid,)).fetchone())
    return row[0] if row else 0


# --- one session ---

class PostgresSession(Session):
    """A session whose control plane is in the database: the bus, once/done, metadata,
    questions, signals, guidance and the lease are rows; its iteration files, work area,
    scratchpad and notes stay local (`dir`, `work_dir`), as the file store keeps them."""

    def __init__(self, store: PostgresSessions, workspace: str, session_id: str,
                 metadata: SessionMetadata, machine: str):
        super().__init__(workspace, session_id, metadata)
        self._store = store
        self._db = store.db
        self.machine = machine   # where its workspace is: where it runs and resumes

    def runs_here(self) -> bool:
        return self.machine == this_machine()

    @property
    def store_url(self) -> str:
        return self._store.url

    def save(self, now: datetime) -> None:
        read = self.metadata.revision
        self.metadata.revision = read + 1
        self.metadata.updated_at = now
        text = dump_plain(unstructure(self.metadata))

        def update(cur):
            cur.execute("UPDATE ralph_sessions SET metadata = %s, revision = %s "
                        "WHERE id = %s AND revision = %s", (text, read + 1, self.id, read))
            return cur.rowcount == 1
        if not self._db.write(update):
            self.metadata.revision = read
            raise StaleMetadata(f"{shown_url(self._store.url)} session {self.id}: revision "
                                f"{read} expected: another writer saved session {self.id}; "
                                f"nothing written")

    # --- the bus ---

    def _record(self, topic, payload, source, ts, run, via, *, seq: int,
                key: str | None = None) -> str:
        m = self.metadata
        record = {"seq": seq, "ts": ts or now_iso(), "topic": topic, "payload": payload,
                  "source": source, "iteration": m.iteration,
                  "state": m.orchestrator.state.value}
        if run is not None:
            record["run"] = run
        if via is not None:
            record["via"] = via
        if key is not None:
            record[ONCE] = key
        return json.dumps(_without_lone_surrogates(record), ensure_ascii=False)

    def _append(self, topic, payload, source, ts, run, via, key: str | None) -> dict | None:
        def append(cur):
            cur.execute("SELECT last_seq FROM ralph_sessions WHERE id = %s FOR UPDATE",
                        (self.id,))
            row = cur.fetchone()
            if row is None:
                raise UnknownSession(f"unknown session {self.id!r} in "
                                     f"{shown_url(self._store.url)}")
            if key is not None and cur.execute(
                    "SELECT 1 FROM ralph_events WHERE session_id = %s AND once = %s",
                    (self.id, key)).fetchone():
                return None
            seq = row[0] + 1
            line = self._record(topic, payload, source, ts, run, via, seq=seq, key=key)
            cur.execute("INSERT INTO ralph_events (session_id, seq, once, record) "
                        "VALUES (%s, %s, %s, %s)", (self.id, seq, key, line))
            cur.execute("UPDATE ralph_sessions SET last_seq = %s WHERE id = %s",
                        (seq, self.id))
            _notify(cur, self.id, "events")
            return line
        line = self._db.write(append)
        return None if line is None else json.loads(line)

    def append_event(self, topic: str, payload=None, *, source: str = "engine", ts=None,
                     run: str | None = None, via: list | None = None) -> dict:
        record = self._append(topic, payload, source, ts, run, via, None)
        assert record is not None
        return record

    def once(self, key: str, topic: str, payload=None, *, source: str = "engine", ts=None,
             run: str | None = None, via: list | None = None) -> bool:
        if not isinstance(key, str) or not key:
            raise BadInput(f"once key {key!r}: expected a non-empty string")
        return self._append(topic, payload, source, ts, run, via, key) is not None

    def done(self, key: str) -> bool:
        return self._db.read(lambda cur: cur.execute(
            "SELECT 1 FROM ralph_events WHERE session_id = %s AND once = %s",
            (self.id, key)).fetchone()) is not None

    def reader(self) -> "SeqReader":
        return SeqReader(self._db, self.id, self.last_seq())

    def events_after(self, seq: int) -> list[dict]:
        return _events_after(self._db, self.id, seq)

    def last_seq(self) -> int:
        return _last_seq(self._db, self.id)

    def tail(self, count: int) -> list[dict]:
        rows = self._db.read(lambda cur: cur.execute(
            "SELECT record FROM ralph_events WHERE session_id = %s ORDER BY seq DESC LIMIT %s",
            (self.id, count)).fetchall())
        return [json.loads(r[0]) for r in reversed(rows)]

    def events_backwards(self):
        seq = None
        while True:
            rows = self._db.read(lambda cur: cur.execute(
                "SELECT seq, record FROM ralph_events WHERE session_id = %s "
                "AND (%s::bigint IS NULL OR seq < %s) ORDER BY seq DESC LIMIT 500",
                (self.id, seq, seq)).fetchall())
            if not rows:
                return
            for seq, record in rows:
                yield json.loads(record)

    def last_event(self, match) -> dict | None:
        return next((r for r in self.events_backwards() if match(r)), None)

    def subscribe(self, wakeup) -> "Subscription":
        """What wakes the engine: a signal, question or answer of this session (NOTIFY,
        no polling), or a line in the work area's outbox (inotify, local as the agents)."""
        from ._outbox import OUTBOX
        from ._watch import watch
        outbox = watch([], wakeup, files=[os.path.join(self.work_dir, OUTBOX)])
        heard = Listener(self._db, lambda _change: wakeup.set(), self.id,
                         ("signal", "question", "answer"))
        return Subscription(outbox, heard)

    def follow(self, wakeup) -> Listener:
        return Listener(self._db, lambda _change: wakeup.set(), self.id, ("events",))

    # --- its questions and signals, its run's lease, its config ---

    @property
    def questions(self) -> "PostgresQuestions":
        return PostgresQuestions(self._db, self.id)

    @property
    def signals(self) -> "PostgresSignals":
        return PostgresSignals(self._db, self.id)

    def running_pid(self) -> int | None:
        return _lease_holder(self._db, self.id)

    def acquire_lease(self, wait_seconds: float = 0.2) -> "PostgresLease":
        """Only on the session's machine: its work area and iterations are there."""
        if not self.runs_here():
            raise BadInput(f"session {self.id} runs on {self.machine} (workspace "
                           f"{self.workspace}): resume it there")
        return PostgresLease.take(self._db, self.id, wait_seconds)

    def config_snapshot(self) -> tuple[bytes, str]:
        where = f"{shown_url(self._store.url)} session {self.id} config"
        row = self._db.read(lambda cur: cur.execute(
            "SELECT config_snapshot FROM ralph_sessions WHERE id = %s", (self.id,)).fetchone())
        if row is None or not row[0] or not bytes(row[0]).strip():
            raise BadInput(f"{where}: the session's config snapshot is missing or empty; the "
                           f"session is not resumed without it")
        return bytes(row[0]), where


class Subscription:
    """The engine's wakeups: calling it stops both; `failed` says why no watcher works."""

    def __init__(self, outbox, heard: Listener):
        self._outbox, self._heard = outbox, heard

    @property
    def failed(self) -> str | None:
        return self._outbox.failed or self._heard.failed

    def __call__(self) -> None:
        self._outbox()
        self._heard()


class SeqReader:
    """Reads a bus incrementally by seq: each call returns what was appended since."""

    def __init__(self, db: Database, sid: str, seq: int):
        self._db, self._sid, self.seq = db, sid, seq

    def read_new(self) -> list[dict]:
        records = _events_after(self._db, self._sid, self.seq)
        if records:
            self.seq = records[-1]["seq"]
        return records


class PostgresLease:
    """The engine's hold on a session: a session-level advisory lock on a connection of
    its own. The engine dying closes the connection, which ends the lease."""

    def __init__(self, conn: psycopg.Connection, sid: str):
        self._conn, self.session_id = conn, sid

    @classmethod
    def take(cls, db: Database, sid: str, wait_seconds: float) -> "PostgresLease":
        conn = db.connect()
        key = _lock_key("lease", sid)
        deadline = time.monotonic() + wait_seconds
        while not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
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
        return cls(conn, sid)

    def held(self) -> bool:
        """Whether the lease still holds (its connection lives: a restarted database has
        ended it, and the engine must stop)."""
        try:
            self._conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def release(self) -> None:
        self._conn.close()


def _lease_holder(db: Database, sid: str) -> int | None:
    """The pid of the engine holding a session's lease (-1: held, holder unnamed), or None."""
    key = _lock_key("lease", sid)
    row = db.read(lambda cur: cur.execute(
        "SELECT coalesce(e.pid, -1) FROM pg_locks l "
        "LEFT JOIN ralph_leases e ON e.session_id = %s AND e.backend_pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.classid = %s AND l.objid = %s",
        (sid, (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone())
    return None if row is None else row[0]


# --- questions: one answer each, by the answers table's key ---

class PostgresQuestions:
    def __init__(self, db: Database, sid: str):
        self._db, self._sid = db, sid

    def _where(self, qid: str) -> str:
        return f"session {self._sid} question {qid}"

    def ask(self, question: Question) -> Question:
        self.save(question)
        return question

    def save(self, question: Question) -> None:
        text = dump_plain(unstructure(question))
        qid = check_id(question.id, "question id")

        def upsert(cur):
            cur.execute("INSERT INTO ralph_questions (session_id, id, question) "
                        "VALUES (%s, %s, %s) ON CONFLICT (session_id, id) "
                        "DO UPDATE SET question = excluded.question", (self._sid, qid, text))
            _notify(cur, self._sid, "question", qid)
        self._db.write(upsert)

    def _row(self, cur, qid: str):
        return cur.execute("SELECT q.question, q.undeliverable, a.answer IS NOT NULL "
                           "FROM ralph_questions q LEFT JOIN ralph_answers a "
                           "ON a.session_id = q.session_id AND a.question_id = q.id "
                           "WHERE q.session_id = %s AND q.id = %s", (self._sid, qid)).fetchone()

    def _question(self, qid: str, text: str, mark: str | None) -> Question:
        where = self._where(qid)
        question = structure(parse_yaml(text, where), Question, where)
        if mark is not None and question.status is QuestionStatus.PENDING \
                and not question.delivery_failed:
            undeliverable = structure(parse_yaml(mark, where), Undeliverable, where)
            question.delivery_failed = True
            question.deadline = min(question.deadline, undeliverable.at)
        return question

    def load(self, qid: str) -> Question:
        check_id(qid, "question id")
        row = self._db.read(lambda cur: self._row(cur, qid))
        if row is None:
            raise UnknownQuestion(f"unknown question {qid!r}")
        return self._question(qid, row[0], row[1])

    def ids(self) -> list[str]:
        return self._db.read(lambda cur: [r[0] for r in cur.execute(
            "SELECT id FROM ralph_questions WHERE session_id = %s ORDER BY id",
            (self._sid,)).fetchall()])

    def _rows(self, only_open: bool) -> list[tuple]:
        return self._db.read(lambda cur: cur.execute(
            "SELECT q.id, q.question, q.undeliverable FROM ralph_questions q "
            "WHERE q.session_id = %s AND (NOT %s OR NOT EXISTS (SELECT 1 FROM ralph_answers a "
            "WHERE a.session_id = q.session_id AND a.question_id = q.id))",
            (self._sid, only_open)).fetchall())

    def all(self) -> list[Question]:
        found = []
        for qid, text, mark in self._rows(False):
            try:
                found.append(self._question(qid, text, mark))
            except BadInput:
                continue
        return sorted(found, key=lambda q: q.asked_at)

    def pending(self) -> list[Question]:
        found = []
        for qid, text, mark in self._rows(True):
            try:
                question = self._question(qid, text, mark)
            except BadInput:
                continue
            if question.status is QuestionStatus.PENDING:
                found.append(question)
        return sorted(found, key=lambda q: q.asked_at)

    def answer(self, qid: str, text: str, *, now: datetime, channel: str = "cli") -> Answer:
        question = self.load(qid)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(f"the answer to {qid} is not valid UTF-8 text") from None
        if question.status is QuestionStatus.CANCELLED:
            raise QuestionCancelled(f"question {qid} was cancelled: it takes no answer")
        if self.has_answer(qid):
            raise AlreadyAnswered(f"question {qid} is already answered")
        result = Answer(question=qid, text=chosen_option(question.options, text, qid),
                        answered_at=now, channel=channel)
        line = dump_plain(unstructure(result))

        def insert(cur):
            cur.execute("INSERT INTO ralph_answers (session_id, question_id, answer) "
                        "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (self._sid, qid, line))
            if cur.rowcount == 1:
                _notify(cur, self._sid, "answer", qid)
            return cur.rowcount == 1
        if not self._db.write(insert):
            raise AlreadyAnswered(f"question {qid} is already answered")
        return result

    def read_answer(self, qid: str) -> Answer | None:
        row = self._db.read(lambda cur: cur.execute(
            "SELECT answer FROM ralph_answers WHERE session_id = %s AND question_id = %s",
            (self._sid, qid)).fetchone())
        if row is None:
            return None
        return structure(parse_yaml(row[0], self._where(qid)), Answer, self._where(qid))

    def has_answer(self, qid: str) -> bool:
        return self._db.read(lambda cur: cur.execute(
            "SELECT 1 FROM ralph_answers WHERE session_id = %s AND question_id = %s",
            (self._sid, qid)).fetchone()) is not None

    def resolve(self, question: Question, status: QuestionStatus, now: datetime) -> None:
        question.status = status
        question.resolved_at = now
        self.save(question)

    def mark_asker_gone(self, question: Question) -> None:
        if not question.asker_gone:
            question.asker_gone = True
            self.save(question)

    def mark_undeliverable(self, qid: str, now: datetime, *, channel: str = "telegram") -> bool:
        question = self.load(qid)
        if question.status is not QuestionStatus.PENDING or question.delivery_failed \
                or self.has_answer(qid):
            return False
        mark = dump_plain(unstructure(Undeliverable(question=qid, at=now, channel=channel)))

        def set_mark(cur):
            cur.execute("UPDATE ralph_questions SET undeliverable = %s WHERE session_id = %s "
                        "AND id = %s AND undeliverable IS NULL", (mark, self._sid, qid))
            if cur.rowcount == 1:
                _notify(cur, self._sid, "question", qid)
            return cur.rowcount == 1
        return self._db.write(set_mark)


# --- the signals mailbox: claimed with FOR UPDATE SKIP LOCKED ---

class PostgresSignals:
    def __init__(self, db: Database, sid: str):
        self._db, self._sid = db, sid

    def drop(self, kind: str, message: str, *, now: datetime, target: str = "ALL",
             iteration: int | None = None, priority: bool = False) -> str:
        signal = validate({"type": kind, "target": target, "message": message,
                           **({"iteration": iteration} if iteration is not None else {}),
                           **({"priority": True} if priority else {})})
        stamp = f"{now.strftime('%y%m%d-%H%M%S')}-{now.microsecond // 1000:03d}"
        name = f"signal.{stamp}-{os.urandom(4).hex()}.yaml"
        raw = dump_plain(signal.fields()).encode()

        def insert(cur):
            cur.execute("INSERT INTO ralph_signals (session_id, name, raw) VALUES (%s, %s, %s)",
                        (self._sid, name, raw))
            _notify(cur, self._sid, "signal")
        self._db.write(insert)
        return name

    def waiting(self) -> list[str]:
        return self._names("waiting")

    def _names(self, state: str) -> list[str]:
        return self._db.read(lambda cur: [r[0] for r in cur.execute(
            "SELECT name FROM ralph_signals WHERE session_id = %s AND state = %s ORDER BY name",
            (self._sid, state)).fetchall()])

    def _raw(self, name: str, states: tuple[str, ...]) -> bytes | None:
        row = self._db.read(lambda cur: cur.execute(
            "SELECT raw FROM ralph_signals WHERE session_id = %s AND name = %s "
            "AND state = ANY(%s)", (self._sid, name, list(states))).fetchone())
        return None if row is None else bytes(row[0])

    def read(self, name: str) -> tuple[Signal | None, str | None, bytes]:
        raw = self._raw(name, ("waiting",))
        if raw is None:
            return None, None, b""
        try:
            return validate(parse_yaml(raw, name), name), None, raw
        except BadInput as e:
            return None, str(e), raw

    def take(self, name: str) -> bool:
        def claim(cur):
            cur.execute("UPDATE ralph_signals SET state = 'taken' WHERE (session_id, name) IN "
                        "(SELECT session_id, name FROM ralph_signals WHERE session_id = %s "
                        "AND name = %s AND state = 'waiting' FOR UPDATE SKIP LOCKED)",
                        (self._sid, name))
            return cur.rowcount == 1
        return self._db.write(claim)

    def mark_handled(self, signal: Signal, *, handled_by: str, action: str,
                     now: datetime) -> None:
        outcome = json.dumps({"handled_by": handled_by, "handled_at": now.isoformat(),
                              "action_taken": action})
        self._db.write(lambda cur: cur.execute(
            "UPDATE ralph_signals SET state = 'handled', outcome = %s WHERE session_id = %s "
            "AND name = %s", (outcome, self._sid, signal.name)) and None)

    def reject(self, name: str, reason: str, raw: bytes, *, now: datetime) -> bool:
        outcome = json.dumps({"reason": reason, "at": now.isoformat()})

        def move(cur):
            cur.execute("UPDATE ralph_signals SET state = 'rejected', outcome = %s "
                        "WHERE session_id = %s AND name = %s AND state = 'waiting'",
                        (outcome, self._sid, name))
            return cur.rowcount == 1
        return self._db.write(move)

    def taken_unmarked(self) -> list[str]:
        return self._names("taken")

    def finish_rejections(self, now: datetime) -> None:
        """A rejection is one update: none is ever left half-done."""

    def read_taken(self, name: str) -> Signal | None:
        raw = self._raw(name, ("taken", "handled"))
        if raw is None:
            return None
        try:
            return validate(parse_yaml(raw, name), name)
        except BadInput:
            return None

    # --- guidance: one JSON list on the session's row, changed under its row lock ---

    def guidance(self) -> list[dict]:
        row = self._db.read(lambda cur: cur.execute(
            "SELECT guidance FROM ralph_sessions WHERE id = %s", (self._sid,)).fetchone())
        return json.loads(row[0]) if row else []

    def _change_guidance(self, change: Callable[[list[dict]], list[dict] | None]) -> None:
        def update(cur):
            row = cur.execute("SELECT guidance FROM ralph_sessions WHERE id = %s FOR UPDATE",
                              (self._sid,)).fetchone()
            items = change(json.loads(row[0]) if row else [])
            if items is not None:
                cur.execute("UPDATE ralph_sessions SET guidance = %s WHERE id = %s",
                            (json.dumps(items), self._sid))
        self._db.write(update)

    def queue_guidance(self, *new: dict) -> None:
        def add(items):
            queued = {i["id"] for i in items}
            added = [i for i in new if i["id"] not in queued]
            return items + added if added else None
        self._change_guidance(add)

    def delivered(self, ids: list[str], to: str | None = None) -> None:
        if not ids:
            return

        def mark(items):
            if to is None:
                return [i for i in items if i["id"] not in ids]
            for i in items:
                if i["id"] in ids:
                    i["delivered_to"] = to
            return items
        self._change_guidance(mark)

    def forget_delivered(self) -> None:
        def forget(items):
            kept = [i for i in items if "delivered_to" not in i]
            return kept if len(kept) != len(items) else None
        self._change_guidance(forget)


# --- a channel's own state and its one-process lock, fleet-wide ---

class PostgresChannel:
    """What `ChannelFiles` is for a workspace: a channel's state (one row) and the lock
    that lets one process run it for the whole fleet (an advisory lock on a connection of
    its own: the holder dying ends it)."""

    def __init__(self, url: str, channel: str):
        self._db = database(url)
        self.channel = check_id(channel, "channel")

    def read_state(self) -> bytes | None:
        row = self._db.read(lambda cur: cur.execute(
            "SELECT state FROM ralph_channels WHERE channel = %s", (self.channel,)).fetchone())
        return None if row is None else bytes(row[0])

    def write_state(self, text: str, kind: str) -> None:
        self._db.write(lambda cur: cur.execute(
            "INSERT INTO ralph_channels (channel, state) VALUES (%s, %s) ON CONFLICT (channel) "
            "DO UPDATE SET state = excluded.state", (self.channel, text.encode())) and None)

    def try_lock(self) -> "ChannelLock | None":
        conn = self._db.connect()
        key = _lock_key("channel", self.channel)
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            conn.close()
            return None
        conn.execute("SELECT set_config('application_name', %s, false)",
                     (f"ralph {self.channel} pid {os.getpid()}",))
        return ChannelLock(conn)

    def lock_holder(self) -> str:
        key = _lock_key("channel", self.channel)
        row = self._db.read(lambda cur: cur.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid = %s "
            "AND l.objid = %s", ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone())
        if row is None or " pid " not in (row[0] or ""):
            return "unknown"
        return row[0].rsplit(" pid ", 1)[1]


class ChannelLock:
    """A held channel lock; `release()` (or the holder's death) lets go."""

    def __init__(self, conn: psycopg.Connection):
        self._conn = conn

    def release(self) -> None:
        self._conn.close()
