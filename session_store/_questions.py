"""Human questions and their one answer (DESIGN §7).

`questions/<QID>.yaml` is rewritten atomically as its status moves (pending ->
answered | timed_out | cancelled), by whoever waits on it and by nobody else.
`answers/<QID>.yaml` is created exclusively: the first answer wins, a second is refused
and changes nothing. A channel that could not deliver a question says so in a file of its
own, `questions/<QID>.undeliverable` (created exclusively too); a reader of the question
sees its deadline moved to that moment, so the waiter applies the timeout at once, and a
channel never rewrites the question file (two writers raced: a timed-out question could
fall back to pending).
"""
# no `from __future__ import annotations`: cattrs reads these classes' annotations at
# each command's start, and every one given as a string costs it a compile

import enum
import os
import stat
from datetime import datetime
from typing import Callable

from attrs import field

from ._atomic import create_exclusive, write_atomic
from ._codec import structure, unstructure
from ._errors import AlreadyAnswered, BadInput, QuestionCancelled, UnknownQuestion
from ._record import record
from ._schema import dump_plain, parse_yaml, shown
from ._ids import check_id

UNDELIVERABLE = ".undeliverable"   # questions/<QID>.undeliverable: a channel gave up on it


class QuestionStatus(enum.Enum):
    PENDING = "pending"
    ANSWERED = "answered"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


@record
class QuestionContext:
    session: str
    state: str
    iteration: int
    role: str | None = None
    task: str | None = None


@record
class Question:
    id: str
    text: str
    asked_at: datetime
    deadline: datetime
    on_timeout: str                      # continue | pause | abort
    context: QuestionContext
    kind: str = "loop"   # loop (human.interact) | in_run (tools interact ask) | fallback | checkin
    fallback_type: str | None = None     # for kind fallback: clarification, guidance, ...
    status: QuestionStatus = QuestionStatus.PENDING
    options: list[str] = field(factory=list)
    default: str | None = None
    resolved_at: datetime | None = None
    late_answer_delivered: bool = False
    timeout_paused: bool = False         # on_timeout: pause has paused the session once
    delivery_failed: bool = False        # a channel could not deliver it: its deadline is moved
                                         # to that moment, so it times out under on_timeout
                                         # (read from the .undeliverable mark while pending;
                                         # kept in the file once resolved, and in old sessions)
    asker_gone: bool = False             # in_run: the agent that asked stopped waiting (its run
                                         # was stopped); the answer goes to the unit's next run

    @property
    def unit(self) -> str:
        """The unit of work that asked: "<iteration>/<role>/<task>"."""
        c = self.context
        return f"{c.iteration}/{c.role or ''}/{c.task or ''}"


@record
class Undeliverable:
    """`questions/<QID>.undeliverable`: a channel gave up delivering the question."""
    question: str
    at: datetime
    channel: str


@record
class Answer:
    question: str
    text: str
    answered_at: datetime
    channel: str = "cli"


def _qpath(session_dir: str, qid: str) -> str:
    return os.path.join(session_dir, "questions", f"{check_id(qid, 'question id')}.yaml")


def _apath(session_dir: str, qid: str) -> str:
    return os.path.join(session_dir, "answers", f"{check_id(qid, 'question id')}.yaml")


def _mpath(session_dir: str, qid: str) -> str:
    return os.path.join(session_dir, "questions",
                        f"{check_id(qid, 'question id')}{UNDELIVERABLE}")


def question_id(name: str) -> str | None:
    """The question a file of `questions/` belongs to (None for anything else: temp
    files, strays), for watchers that are told a file name changed."""
    if name.startswith("."):
        return None
    for suffix in (".yaml", UNDELIVERABLE):
        if name.endswith(suffix):
            qid = name[:-len(suffix)]
            try:
                return check_id(qid, "question id")
            except BadInput:
                return None
    return None


def _read_own(path: str, fd: int) -> bytes:
    """A question or answer file's bytes: only a regular file of this user (like the
    session lock: a file planted by another user is not ours to act on)."""
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid():
            raise BadInput(f"{path}: belongs to another user (uid {st.st_uid}); refused")
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{path}: not a regular file; refused")
        return f.read()


def new_question_id(now: datetime) -> str:
    return f"q{now.strftime('%y%m%d-%H%M%S')}-{os.urandom(2).hex()}"


def ask(session_dir: str, question: Question) -> Question:
    write_atomic(_qpath(session_dir, question.id), dump_plain(unstructure(question)), "question")
    return question


def save_question(session_dir: str, question: Question) -> None:
    write_atomic(_qpath(session_dir, question.id), dump_plain(unstructure(question)),
                 "question-status")


def load_question(session_dir: str, qid: str) -> Question:
    path = _qpath(session_dir, qid)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnknownQuestion(f"unknown question {qid!r}") from None
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror}; symlinks are refused)") from None
    question = structure(parse_yaml(_read_own(path, fd), path), Question, path)
    if question.id != qid:   # its id names the file every later write goes to
        raise BadInput(f"{path}: $.id: expected {qid!r}, got {question.id[:80]!r}")
    if question.status is QuestionStatus.PENDING and not question.delivery_failed:
        mark = _read_undeliverable(session_dir, qid)
        if mark is not None:
            question.delivery_failed = True
            question.deadline = min(question.deadline, mark.at)
    return question


def _read_undeliverable(session_dir: str, qid: str) -> Undeliverable | None:
    return _read_if_there(_mpath(session_dir, qid), Undeliverable)


def _read_if_there(path: str, cls):
    """The file at `path` as a `cls`, or None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise BadInput(f"{path}: cannot be read ({e.strerror}; symlinks are refused)") from None
    return structure(parse_yaml(_read_own(path, fd), path), cls, path)


def ids(session_dir: str) -> list[str]:
    """The ids of every question file of the session, in name order (cheap: nothing read)."""
    folder = os.path.join(session_dir, "questions")
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    return [n[:-5] for n in names if n.endswith(".yaml") and not n.startswith(".")]


def questions(session_dir: str) -> list[Question]:
    """Every question of the session, oldest first (unreadable files are skipped)."""
    found = []
    for qid in ids(session_dir):
        try:
            found.append(load_question(session_dir, qid))
        except BadInput:
            continue
    return sorted(found, key=lambda q: q.asked_at)


def has_answer(session_dir: str, qid: str) -> bool:
    return os.path.exists(_apath(session_dir, qid))


def pending(session_dir: str) -> list[Question]:
    """Questions still waiting for an answer (none written yet)."""
    return [q for q in questions(session_dir) if q.status is QuestionStatus.PENDING
            and not has_answer(session_dir, q.id)]


def answer(session_dir: str, qid: str, text: str, *, now: datetime, channel: str = "cli") -> Answer:
    """Write the one answer to `qid`; UnknownQuestion, QuestionCancelled or AlreadyAnswered
    (all BadInput) when it is unknown, cancelled or answered."""
    result = answer_to(load_question(session_dir, qid), text, now=now, channel=channel,
                       answered=lambda: has_answer(session_dir, qid))
    if not create_exclusive(_apath(session_dir, qid), dump_plain(unstructure(result)), "answer"):
        raise AlreadyAnswered(f"question {qid} is already answered")
    return result


def answer_to(question: Question, text: str, *, now: datetime, channel: str,
              answered: Callable[[], bool]) -> Answer:
    """The answer `text` gives `question`, as every backend checks it before writing it:
    refused (BadInput) when not UTF-8 text, when the question was cancelled, when it is
    `answered()` already; an option named by its number or text stands as its own text."""
    qid = question.id
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"the answer to {qid} is not valid UTF-8 text") from None
    if question.status is QuestionStatus.CANCELLED:
        raise QuestionCancelled(f"question {qid} was cancelled: it takes no answer")
    if answered():   # before the option check: "already" says it all
        raise AlreadyAnswered(f"question {qid} is already answered")
    return Answer(question=qid, text=chosen_option(question.options, text, qid),
                  answered_at=now, channel=channel)


def chosen_option(options: list[str], text: str, qid: str = "the question") -> str:
    """An answer names an option by its number (`3`, `3.`), its text (any case) or a
    unique prefix of it: the option's own text is what is kept. A prefix of several is
    refused (BadInput naming them), and so is a bare number that names no option (a slip
    of the finger, not an answer); anything else is free text, kept as given."""
    given = text.strip()
    if not options or not given:
        return text
    number = given.rstrip(".)")
    if number.isascii() and number.isdigit() and 1 <= int(number) <= len(options):
        return options[int(number) - 1]
    folded = given.casefold()
    exact = [o for o in options if o.strip().casefold() == folded]
    if exact:
        return exact[0]
    if number.isascii() and number.isdigit():
        raise BadInput(f"answer {shown(given)} to {qid}: its options are numbered 1-"
                       f"{len(options)}; to answer with a number as free text, say it with "
                       f"a word (\"{shown(number)} please\")")
    starting = [o for o in options if o.strip().casefold().startswith(folded)]
    if len(starting) == 1:
        return starting[0]
    if starting:
        listed = "; ".join(f"{options.index(o) + 1}. {shown(o)}" for o in starting)
        raise BadInput(f"answer {shown(given)} to {qid} matches several options ({listed}): "
                       f"answer with one's number or more of its text")
    return text


def read_answer(session_dir: str, qid: str) -> Answer | None:
    return _read_if_there(_apath(session_dir, qid), Answer)


def mark_undeliverable(session_dir: str, qid: str, now: datetime, *,
                       channel: str = "telegram") -> bool:
    """A channel gave up delivering a pending question: `questions/<QID>.undeliverable`
    (created exclusively; the question file is left to its waiter), so readers see its
    deadline moved to `now` and whoever waits on it applies its timeout at once. False
    when it waits no more (answered, resolved) or was marked already."""
    question = load_question(session_dir, qid)
    if question.status is not QuestionStatus.PENDING or question.delivery_failed \
            or has_answer(session_dir, qid):
        return False
    mark = Undeliverable(question=qid, at=now, channel=channel)
    return create_exclusive(_mpath(session_dir, qid), dump_plain(unstructure(mark)),
                            "question-undeliverable")


def mark_asker_gone(session_dir: str, question: Question) -> None:
    """An in-run question outlived the run that asked it: it stays answerable."""
    if not question.asker_gone:
        question.asker_gone = True
        save_question(session_dir, question)


def resolve(session_dir: str, question: Question, status: QuestionStatus, now: datetime) -> None:
    question.status = status
    question.resolved_at = now
    save_question(session_dir, question)
