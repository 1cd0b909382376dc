"""What the bot writes to the chats: questions, notices from the bus, clipped to fit.

Whose words are whose: ralph's own notices (a session paused, completed, aborted, a
question unanswered) come only from records the engine appended (`source: engine`), and
begin with their subject ("Session s1 paused"). What an agent wrote comes after a line
naming its author ("executor t1 says, in session s1:") and inside a blockquote entity,
so it never begins a message and cannot pass for a notice. Every text is escaped
(engine/safe_text.py): no control or bidi character reaches a chat.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timezone

from ralph.session_store import questions

from ...safe_text import author, field, payload_text, printable

MAX_TEXT = 3900   # Telegram takes 4096 characters a message


@dataclass(frozen=True, slots=True)
class Message:
    """A text to send and the span shown as a quote: (offset, length) in UTF-16 code
    units, as the Bot API counts entities; None when nothing is quoted."""
    text: str
    quote: tuple[int, int] | None = None

    @classmethod
    def plain(cls, text: str) -> "Message":
        return cls(clip(printable(text, lines=True)))

    @classmethod
    def quoting(cls, head: str, words: str, tail: str = "") -> "Message":
        """`head`, then `words` (someone else's) as a quote, then `tail`: all escaped,
        the words cut so that the whole fits."""
        head = printable(head, lines=True) + "\n"
        tail = "\n" + printable(tail, lines=True) if tail else ""
        words = clip(printable(words, lines=True) or "(empty)",
                     max(1, MAX_TEXT - len(head) - len(tail)))
        return cls(head + words + tail, (_utf16(head), _utf16(words)))


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def question_text(q: questions.Question) -> Message:
    c = q.context
    where = [f"state {c.state}", f"iteration {c.iteration}"]
    if c.role:
        where.append(f"role {printable(c.role)}")
    if c.task:
        where.append(f"task {printable(c.task)}")
    asker = f"The {printable(c.role)}" + (f" ({printable(c.task)})" if c.task else "") \
        if c.role else "ralph"
    tail = []
    if q.options:
        tail.append("Options: " + " | ".join(printable(o) for o in q.options))
    if q.default is not None:
        tail.append(f"Default: {printable(q.default)}")
    tail.append(f"Deadline: {q.deadline.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC "
                f"(then: {_then(q)})")
    tail.append("Reply to this message to answer it.")
    return Message.quoting("\n".join([f"Question {q.id} from session {c.session}",
                                      ", ".join(where), f"{asker} asks:"]),
                           clip(q.text, 3000), "\n".join(tail))


def _then(q: questions.Question) -> str:
    if q.kind == "approval":
        return "the call is allowed" if q.default == "allow" else "the call is denied"
    return q.on_timeout if q.kind == "loop" else "the agent goes on"


def notice_text(sid: str, record: dict) -> Message | None:
    """What a bus record tells the humans, if anything: an agent's progress note, quoted
    under its author's name; the engine's own transitions and timeouts as its notices."""
    topic, payload = record.get("topic"), record.get("payload")
    if topic == "human.progress":
        iteration = field(record.get("iteration"), "", text=False)
        where = f"session {sid}" + (f", iteration {iteration}" if iteration else "")
        return Message.quoting(f"{author(record)} says, in {where}:",
                               payload_text(payload, MAX_TEXT))
    if record.get("source") != "engine" or not isinstance(payload, dict):
        return None   # only the engine speaks as ralph
    if topic == "session.transition":
        reason = f": {printable(str(payload['reason']))}" if payload.get("reason") else ""
        if payload.get("to") == "PAUSED":
            return Message.plain(f"Session {sid} paused{reason}\n/resume {sid} to go on.")
        if payload.get("to") == "COMPLETE":
            if payload.get("trigger") == "abort":
                return Message.plain(f"Session {sid} aborted{reason}")
            return Message.plain(f"Session {sid} completed.")
    if topic == "human.timeout":
        why = "could not be delivered" if payload.get("delivery_failed") \
            else "was not answered in time"
        then = f"; policy: {printable(str(payload['policy']))}" if payload.get("policy") else ""
        return Message.plain(f"Question {printable(str(payload.get('id')))} of session {sid} "
                             f"{why}{then}.")
    return None
