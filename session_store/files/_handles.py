"""A session's questions and signals, behind its handle: `session.questions.ask(...)`,
`session.signals.drop(...)`. The verbs bind the session's address (the file backend's
control plane, read when called: `create` renames it in); a database backend would
implement the same verbs over its rows. The module-level verbs of `_questions` and
`_signals` stay, for the file backend's own use and the store's tests."""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from .. import _signals
from .._signals import Signal

if TYPE_CHECKING:
    from .._questions import Answer, Question, QuestionStatus


class _Addressed(Protocol):
    @property
    def dir(self) -> str: ...


class _OfSession:
    """Verbs bound to one session (its address read at each call): a Session, or anything
    with its `dir` (Sessions hands out a session's questions by id, unloaded)."""

    def __init__(self, session: "_Addressed"):
        self._session = session

    @property
    def _at(self) -> str:
        return self._session.dir


class SessionQuestions(_OfSession):
    """The session's human questions and their one answer each (see _questions: loaded
    at the first call, so that a command that asks nothing builds none of its records)."""

    @property
    def _verbs(self):
        from .. import _questions
        return _questions

    def ask(self, question: Question) -> Question:
        return self._verbs.ask(self._at, question)

    def save(self, question: Question) -> None:
        """Rewrite it as its status or marks moved (its waiter's write only)."""
        self._verbs.save_question(self._at, question)

    def load(self, qid: str) -> Question:
        """BadInput when it is gone or unreadable."""
        return self._verbs.load_question(self._at, qid)

    def ids(self) -> list[str]:
        return self._verbs.ids(self._at)

    def all(self) -> list[Question]:
        """Every question that can be read, oldest first."""
        return self._verbs.questions(self._at)

    def pending(self) -> list[Question]:
        return self._verbs.pending(self._at)

    def answer(self, qid: str, text: str, *, now: datetime, channel: str = "cli") -> Answer:
        """The first answer wins (AlreadyAnswered, QuestionCancelled otherwise)."""
        return self._verbs.answer(self._at, qid, text, now=now, channel=channel)

    def read_answer(self, qid: str) -> Answer | None:
        return self._verbs.read_answer(self._at, qid)

    def has_answer(self, qid: str) -> bool:
        return self._verbs.has_answer(self._at, qid)

    def resolve(self, question: Question, status: QuestionStatus, now: datetime) -> None:
        self._verbs.resolve(self._at, question, status, now)

    def mark_asker_gone(self, question: Question) -> None:
        self._verbs.mark_asker_gone(self._at, question)

    def mark_undeliverable(self, qid: str, now: datetime, *, channel: str = "telegram") -> bool:
        return self._verbs.mark_undeliverable(self._at, qid, now, channel=channel)


class SessionSignals(_OfSession):
    """The session's signals mailbox and its guidance queue (see _signals)."""

    def drop(self, kind: str, message: str, *, now: datetime, target: str = "ALL",
             iteration: int | None = None, priority: bool = False) -> str:
        """A human's signal, waiting for its consumer; its name."""
        return _signals.drop(self._at, kind, message, now=now, target=target,
                             iteration=iteration, priority=priority)

    def waiting(self) -> list[str]:
        """The names of the signals waiting, oldest first."""
        return _signals.waiting(self._at)

    def read(self, name: str) -> tuple[Signal | None, str | None, bytes]:
        return _signals.read(self._at, name)

    def take(self, name: str) -> bool:
        """Claim it (False: another consumer won it)."""
        return _signals.take(self._at, name)

    def mark_handled(self, signal: Signal, *, handled_by: str, action: str,
                     now: datetime) -> None:
        _signals.mark_handled(self._at, signal, handled_by=handled_by, action=action, now=now)

    def reject(self, name: str, reason: str, raw: bytes, *, now: datetime) -> bool:
        return _signals.reject(self._at, name, reason, raw, now=now)

    def taken_unmarked(self) -> list[str]:
        return _signals.taken_unmarked(self._at)

    def finish_rejections(self, now: datetime) -> None:
        _signals.finish_rejections(self._at, now)

    def read_taken(self, name: str) -> Signal | None:
        return _signals.read_taken(self._at, name)

    def guidance(self) -> list[dict]:
        return _signals.guidance(self._at)

    def queue_guidance(self, *new: dict) -> None:
        _signals.queue_guidance(self._at, *new)

    def delivered(self, ids: list[str], to: str | None = None) -> None:
        _signals.delivered(self._at, ids, to=to)

    def forget_delivered(self) -> None:
        _signals.forget_delivered(self._at)
