"""A session's control plane as the crash suites read it and the tests' humans act on it,
on either backend: `FilePlane` (the files of the state directory) and `StorePlane` (the
PostgreSQL store's rows, through the session handle's verbs, and read-only SQL for what
the verbs do not show: handled and rejected signals with their outcome, the metadata as
saved). Both answer the same questions, so one check holds both backends to one standard.

The session's iteration files and work area are local files on both backends (`sd`, the
control plane's directory on this machine, and the workspace's work area).
"""
from __future__ import annotations

import json
import os
import urllib.parse
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import yaml

from ralph import session_store
from ralph.session_store import questions, signals, write_atomic
from support import session_dir


class Mailbox(NamedTuple):
    waiting: list[str]        # names of signals no consumer took yet
    unfinished: list[str]     # a take or a rejection begun and not finished
    processed: list[dict]     # each signal's fields, its `name` and `handling_metadata`
    rejected: list[dict]      # each one's fields (when they parse), `name` and `rejection`


class FilePlane:
    """The file store's control plane: metadata.yaml, events.jsonl, signals/, questions/,
    answers/ and guidance.yaml in the session's directory."""

    def __init__(self, ws: Path, sid: str):
        self.ws, self.sid = Path(ws), sid
        self.sd = session_dir(self.ws, sid)

    def exists(self) -> bool:
        return self.sd.exists()

    def check_whole(self, finished: bool) -> None:
        """Metadata parses (plainly and strictly); every line of the bus but a torn last
        one is a record; a finished session has no torn line left."""
        assert isinstance(yaml.safe_load((self.sd / "metadata.yaml").read_text()), dict)
        session_store.load(str(self.ws), self.sid)   # strict: raises on anything malformed
        text = (self.sd / "events.jsonl").read_text()
        for line in text.split("\n")[:-1]:   # after the last newline: a torn line, or nothing
            assert isinstance(json.loads(line), dict), line
        if finished:
            assert text.endswith("\n"), "a torn line is left at the end of events.jsonl"

    def metadata(self) -> dict:
        return yaml.safe_load((self.sd / "metadata.yaml").read_text())

    def records(self) -> list[dict]:
        return [json.loads(line) for line in (self.sd / "events.jsonl").read_text().splitlines()]

    def running_pid(self) -> int | None:
        return session_store.running_pid(str(self.sd))

    def mailbox(self) -> Mailbox:
        box = self.sd / "signals"

        def docs(folder: str) -> list[dict]:
            return [{**yaml.safe_load(p.read_text()), "name": p.name}
                    for p in (box / folder).iterdir() if not p.name.endswith(".taken")]
        return Mailbox(sorted(os.listdir(box / "inputs")),
                       sorted(p.name for p in box.rglob("*.taken")),
                       docs("processed"), docs("rejected"))

    def guidance(self) -> list[dict]:
        return json.loads((self.sd / "guidance.yaml").read_text())

    def question_ids(self) -> list[str]:
        return sorted(name[:-5] for name in os.listdir(self.sd / "questions")
                      if name.endswith(".yaml") and not name.startswith("."))

    def question(self, qid: str) -> questions.Question:
        return questions.load_question(str(self.sd), qid)   # strict

    def questions(self) -> list[questions.Question]:
        return questions.questions(str(self.sd))

    def read_answer(self, qid: str) -> questions.Answer | None:
        return questions.read_answer(str(self.sd), qid)

    # --- what the humans do ---

    def drop(self, spec: dict, now: datetime) -> None:
        if "raw" in spec:
            # named to sort before the time-named ones dropped with it: the engine takes
            # (or rejects) inputs oldest name first, whether it looks between drops or after
            write_atomic(str(self.sd / "signals" / "inputs" /
                             f"signal.000000-{spec['label']}.yaml"), spec["raw"], "human-file")
        else:
            signals.drop(str(self.sd), spec["type"], spec.get("message", ""), now=now,
                         target=spec.get("target", "ALL"), iteration=spec.get("iteration"),
                         priority=spec.get("priority", False))

    def answer(self, qid: str, text: str, now: datetime) -> None:
        questions.answer(str(self.sd), qid, text, now=now)

    def mark_undeliverable(self, qid: str, now: datetime) -> None:
        questions.mark_undeliverable(str(self.sd), qid, now)

    def close(self) -> None:
        """Nothing is held open."""


class StorePlane:
    """The PostgreSQL store's control plane, in the database at `url` (one of the test's
    own): read through the session handle's verbs, or read-only SQL where they show
    less than the check needs."""

    def __init__(self, ws: Path, sid: str, url: str):
        from ralph.session_store.postgres import PostgresSessions
        self.ws, self.sid, self.url = Path(ws), sid, url
        self.sd = session_dir(self.ws, sid)
        self.store = PostgresSessions(url, str(ws))

    def _session(self):
        return self.store.load(self.sid)   # strict: raises on malformed metadata

    def _rows(self, sql: str) -> list[tuple]:
        return self.store.db.read(lambda cur: cur.execute(sql, (self.sid,)).fetchall())

    def exists(self) -> bool:
        return self.sid in self.store.ids()

    def check_whole(self, finished: bool) -> None:
        """The session loads strictly; its bus is gapless (rows are whole: no torn line)."""
        self._session()
        seqs = [r["seq"] for r in self.records()]
        assert seqs == list(range(1, len(seqs) + 1)), seqs

    def metadata(self) -> dict:
        [(text,)] = self._rows("SELECT metadata FROM ralph_sessions WHERE id = %s")
        return yaml.safe_load(text)

    def records(self) -> list[dict]:
        return self._session().events_after(0)

    def running_pid(self) -> int | None:
        return self._session().running_pid()

    def mailbox(self) -> Mailbox:
        rows = self._rows("SELECT name, raw, state, outcome FROM ralph_signals "
                          "WHERE session_id = %s ORDER BY name")
        by_state: dict[str, list] = {"waiting": [], "taken": [], "handled": [], "rejected": []}
        for name, raw, state, outcome in rows:
            try:
                fields = yaml.safe_load(bytes(raw))
            except yaml.YAMLError:
                fields = None
            doc = {**(fields if isinstance(fields, dict) else {}), "name": name}
            if state == "handled":
                doc["handling_metadata"] = json.loads(outcome)
            elif state == "rejected":
                doc["rejection"] = json.loads(outcome)
            by_state[state].append(doc if state in ("handled", "rejected") else name)
        return Mailbox(by_state["waiting"], by_state["taken"], by_state["handled"],
                       by_state["rejected"])

    def guidance(self) -> list[dict]:
        return self._session().signals.guidance()

    def question_ids(self) -> list[str]:
        return self.store.questions(self.sid).ids()

    def question(self, qid: str) -> questions.Question:
        return self.store.questions(self.sid).load(qid)   # strict

    def questions(self) -> list[questions.Question]:
        return self.store.questions(self.sid).all()

    def read_answer(self, qid: str) -> questions.Answer | None:
        return self.store.questions(self.sid).read_answer(qid)

    # --- what the humans do ---

    def drop(self, spec: dict, now: datetime) -> None:
        if "raw" in spec:
            # what a human's broken client would store: the bytes as they are, named to
            # sort before the time-named ones dropped with it (see FilePlane.drop)
            name = f"signal.000000-{spec['label']}.yaml"
            self.store.db.write(lambda cur: cur.execute(
                "INSERT INTO ralph_signals (session_id, name, raw) VALUES (%s, %s, %s)",
                (self.sid, name, spec["raw"].encode())) and None)
        else:
            self._session().signals.drop(
                spec["type"], spec.get("message", ""), now=now,
                target=spec.get("target", "ALL"), iteration=spec.get("iteration"),
                priority=spec.get("priority", False))

    def answer(self, qid: str, text: str, now: datetime) -> None:
        self.store.questions(self.sid).answer(qid, text, now=now)

    def mark_undeliverable(self, qid: str, now: datetime) -> None:
        self.store.questions(self.sid).mark_undeliverable(qid, now)

    def close(self) -> None:
        """This process's connection to the database ends (it is copied or dropped next;
        a later read opens another)."""
        from ralph.session_store.postgres import _db
        with _db._databases_lock:
            if _db._databases.get(self.url) is self.store.db:
                del _db._databases[self.url]
        self.store.db.close()


def database_url(url: str, name: str) -> str:
    """`url` with its database named `name` (its options kept)."""
    return urllib.parse.urlsplit(url)._replace(path="/" + name).geturl()


Plane = FilePlane | StorePlane
