"""The fleet's sessions and one session's handle on the database: the bus, once/done,
metadata, the lease, wakeups (LISTEN/NOTIFY)."""
from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from typing import Callable

import psycopg

from .._codec import structure, unstructure
from .._errors import BadInput, StaleMetadata, UnknownSession
from .._events import ONCE, _without_lone_surrogates, now_iso
from .._ids import check_id, new_session_id
from .._interface import Change
from .._iteration import Iteration
from .._metadata import GitInfo, Limits, SessionMetadata
from .._quota import QuotaReading, check_account, parse_readings
from .._places import StateDirInWorkspace, check_places, check_state_dir, make_control_root
from .._schema import dump_plain, parse_yaml
from .._session import SCRATCHPAD_FILE, Session
from ._db import (CHANNEL, Database, _notify, database, session_channel, shown_url,
                  this_machine)
from ._lease import PostgresLease, _lease_holder
from ._mailbox import PostgresQuestions, PostgresSignals

# --- the store: every session of the fleet, by id ---

class PostgresSessions:
    """The sessions in one database (every machine's), by id: what `Sessions` is for a
    workspace's files. `workspace` is where sessions made here keep their local areas."""

    shared = True   # its changes are heard from the database (NOTIFY), not the files

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
        if machine == this_machine():   # its iterations' files and work area are here
            check_places(workspace, sid)
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
        from .._atomic import make_dirs
        make_control_root(workspace)
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
        """`notify(change)` for every session's change in the fleet (LISTEN/NOTIFY): a
        session made, its bus appended to, a question asked or marked (what the file
        store's watch says; signals and answers wake only the session's engine)."""
        return Listener(self.db, notify, whats=("session", "events", "question"))


class Listener:
    """A LISTEN on its own connection, in a thread; calling it stops it. It hears one
    session (its own channel), or every session of the fleet, so `add` has nothing to do
    (the file store's watcher follows each session by its directory)."""

    def __init__(self, db: Database, notify: Callable[[Change], None],
                 session: str | None = None, whats: tuple[str, ...] | None = None):
        self._db, self._notify = db, notify
        self._session, self._whats = session, whats
        self._stop = threading.Event()
        self.failed: str | None = None
        self._channel = CHANNEL if session is None else session_channel(session)
        self._conn = db.connect()
        self._conn.execute(f"LISTEN {self._channel}")
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
                    self._conn.execute(f"LISTEN {self._channel}")
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
    def mailbox_dir(self) -> str | None:
        return None   # its signals are rows: an agent's poll asks the engine

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

    # --- its accounts' usage windows: one row a window, shared by the fleet ---

    def quota(self, account: str) -> dict[str, QuotaReading]:
        rows = self._db.read(lambda cur: cur.execute(
            "SELECT window_name, reading FROM ralph_quota WHERE account = %s",
            (check_account(account),)).fetchall())
        return parse_readings(json.dumps({w: json.loads(r) for w, r in rows}))

    def record_quota(self, account: str, reading: QuotaReading) -> bool:
        text = json.dumps(unstructure(reading))

        def upsert(cur):
            # a newer reading wins, whichever engine commits last
            cur.execute("INSERT INTO ralph_quota (account, window_name, seen_at, reading) "
                        "VALUES (%s, %s, %s, %s) ON CONFLICT (account, window_name) DO "
                        "UPDATE SET seen_at = excluded.seen_at, reading = excluded.reading "
                        "WHERE ralph_quota.seen_at <= excluded.seen_at",
                        (check_account(account), reading.window, reading.seen_at, text))
            return cur.rowcount == 1
        return self._db.write(upsert)

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
            for _seq, record in rows:
                yield json.loads(record)
            seq = rows[-1][0]

    def last_event(self, match) -> dict | None:
        return next((r for r in self.events_backwards() if match(r)), None)

    def subscribe(self, wakeup) -> Listener:
        """What wakes the engine: a signal, question or answer of this session (NOTIFY,
        no polling). (The inlet watches each open run's outbox, local as the agents.)"""
        return Listener(self._db, lambda _change: wakeup.set(), self.id,
                        ("signal", "question", "answer"))

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


class SeqReader:
    """Reads a bus incrementally by seq: each call returns what was appended since."""

    def __init__(self, db: Database, sid: str, seq: int):
        self._db, self._sid, self.seq = db, sid, seq

    def read_new(self) -> list[dict]:
        records = _events_after(self._db, self._sid, self.seq)
        if records:
            self.seq = records[-1]["seq"]
        return records


