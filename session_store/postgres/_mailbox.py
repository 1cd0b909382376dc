"""A session's questions (one answer each, by a primary key) and its signals mailbox
(claimed with FOR UPDATE SKIP LOCKED) and guidance queue, as rows."""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Callable

from .._codec import structure, unstructure
from .._errors import AlreadyAnswered, BadInput, UnknownQuestion
from .._questions import Answer, Question, QuestionStatus, Undeliverable, answer_to
from .._schema import dump_plain, parse_yaml
from .._ids import check_id
from .._signals import Signal, validate
from ._db import Database, _notify

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
        result = answer_to(self.load(qid), text, now=now, channel=channel,
                           answered=lambda: self.has_answer(qid))
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
        """`change` the queue under its row's lock; no write when it changes nothing (as
        now read: most transitions forget nothing)."""
        if change(self.guidance()) is None:
            return

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


