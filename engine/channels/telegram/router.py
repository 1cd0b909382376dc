"""From what a chat wrote to what the bot does: a pure function, no I/O.

Its inputs are plain data the bot gathers first (the sessions of the workspace, the
question a replied-to message asked, whether that message is the bot's own); its result is
one action, which `commands.Commands` carries out:

- a chat outside `allowed_chat_ids`: Ignore (nothing is written, nothing is said);
- a reply to a question's message (unless it is a command): Answer;
- `/command [SESSION] [rest]`: Command (Say for an unknown one);
- `@SESSION text`: Guidance for that session (`@SESSION /command`: that command);
- any other text: Guidance for the primary session (session None).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


COMMANDS = frozenset({"help", "start", "status", "tasks", "tail", "pause", "resume", "stop",
                      "approve", "skip"})   # /start is /help: what a chat sends first
QUESTION_HEADER = re.compile(r"Question ([A-Za-z0-9][A-Za-z0-9._-]{0,63}) from session "
                             r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\n")
AT_SESSION = re.compile(r"@([A-Za-z0-9][A-Za-z0-9._-]{0,63})[:,]?(?:\s+(.*))?", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Replied:
    """The message a chat replied to: its text, whether the bot sent it, and the question
    it asked when the bot remembers sending it ((session, question) or None)."""
    text: str | None = None
    from_bot: bool = False
    question: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Ignore:
    reason: str


@dataclass(frozen=True, slots=True)
class Say:
    text: str


@dataclass(frozen=True, slots=True)
class Answer:
    session: str
    question: str
    text: str


@dataclass(frozen=True, slots=True)
class Guidance:
    session: str | None   # None: the primary session
    text: str


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    session: str | None   # None: the command's default (mostly the primary session)
    rest: str


Action = Ignore | Say | Answer | Guidance | Command


def route(chat: int, text: str | None, *, allowed, sessions, replied: Replied | None = None
          ) -> Action:
    """What a message from `chat` does; `sessions` are the workspace's session ids."""
    if chat not in allowed:
        return Ignore(f"ignored a message from chat {chat} (not in allowed_chat_ids)")
    if not text:
        return Say("I only read text messages.")
    if replied is not None and not is_command(text):
        target = replied.question
        if target is None and replied.from_bot:
            # a question message whose send the bot has not recorded yet (the reply
            # overtook the send's response), or one forgotten since: its header says
            found = QUESTION_HEADER.match(replied.text or "")
            target = (found.group(2), found.group(1)) if found else None
        if target is not None:
            return Answer(target[0], target[1], text)
    text = text.strip()
    if text.startswith("/"):
        return command(text, None, sessions)
    m = AT_SESSION.fullmatch(text)
    if m:
        sid, rest = m.group(1), (m.group(2) or "").strip()
        if sid not in sessions:
            return Say(f"There is no session {sid} in this workspace; /status lists them.")
        if not rest:
            return Say(f"What should session {sid} be told? Write \"@{sid} your guidance\".")
        if rest.startswith("/"):
            return command(rest, sid, sessions)
        return Guidance(sid, rest)
    return Guidance(None, text)


def is_command(text: str) -> bool:
    head = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    return head.startswith("/") and _name(head) in COMMANDS


def command(text: str, default_sid: str | None, sessions) -> Command | Say:
    """`/name[@bot] [SESSION|@SESSION] rest`; a first word naming a session picks it."""
    head, _, rest = text.partition(" ")
    if "\n" in head:
        head, _, more = head.partition("\n")
        rest = more + " " + rest
    name = _name(head)
    if name not in COMMANDS:
        return Say(f"Unknown command /{name}. /help lists the commands.")
    rest = rest.strip()
    first, _, remaining = rest.partition(" ")
    candidate = first[1:] if first.startswith("@") else first
    if candidate and candidate in sessions:
        return Command(name, candidate, remaining.strip())
    return Command(name, default_sid, rest)


def _name(head: str) -> str:
    return head[1:].split("@", 1)[0].lower()
