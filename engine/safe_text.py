"""Text an agent wrote (or any bus record holds), made safe to show a human.

A terminal obeys what it is sent: `ESC[2J` clears the screen, OSC 0 sets the window's
title, OSC 52 writes the clipboard, a carriage return overwrites the line; a bidi
override (U+202E) shows text in another order than it is written. So every control
character (C0, DEL, C1), every bidi control and the Unicode line separators become a
visible escape (`\\x1b`, `\\u202e`) before they reach the console, `session status`,
`tail`, `list` or a Telegram message. Newlines and tabs are kept only where the caller
shows several lines on purpose (and then says how each line is marked as whose).

Stdlib only and cheap (one regex pass; text without such characters comes back as is).
"""
from __future__ import annotations

import json
import re

_C0_C1 = "\x00-\x08\x0b-\x1f\x7f-\x9f"   # all but \t and \n, which the caller decides on
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"   # marks, embeddings, overrides, isolates
_SEPARATORS = "\u2028\u2029"              # line and paragraph separators
_UNSAFE_IN_LINES = re.compile(f"[{_C0_C1}{_BIDI}{_SEPARATORS}]")
_UNSAFE_IN_A_LINE = re.compile(f"[\t\n{_C0_C1}{_BIDI}{_SEPARATORS}]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_RUN = re.compile(r"\d+-([A-Za-z]+)(?:-(.+))?")


def _escape(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with its control and bidi characters escaped visibly; with `lines`,
    newlines and tabs are kept (the caller marks where each line comes from)."""
    return (_UNSAFE_IN_LINES if lines else _UNSAFE_IN_A_LINE).sub(_escape, text)


def payload_text(payload, limit: int) -> str:
    """A record's payload as text (a string as it is, anything else as JSON), cut to
    `limit` characters: cut first, so a payload of megabytes costs no more than its cut."""
    if isinstance(payload, str):
        text = payload[:limit + 1]
    else:
        try:
            text = json.dumps(payload, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = "?"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def excerpt(payload, limit: int) -> str:
    """The payload as one safe line of at most `limit` characters before escaping."""
    return printable(payload_text(payload, limit))


def field(value, missing: str = "?", *, text: bool = True) -> str:
    """A record's field for a text view: a string escaped to one line (unless `text` is
    false: a number is expected), an integer as it is, anything else (absent, null, a
    list, a float) as `missing`."""
    if isinstance(value, str) and text:
        return printable(value[:200])
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return missing


def clock(record: dict, width: int) -> str:
    """The time of day of a record's `ts` (ISO 8601), `width` characters of it
    ("12:03:07.123" for 12), or "?"."""
    ts = record.get("ts")
    return field(ts[11:11 + width] if isinstance(ts, str) and len(ts) > 11 else None)


def author(record: dict) -> str:
    """Who wrote a bus record, as a label: "ralph" (the engine), "executor t1" (an agent
    run's role and task), "cli" (a command outside any run), "?" when it does not say.
    `source` is stamped by whoever appends: the engine for what it ingests."""
    source = record.get("source")
    if source == "engine":
        return "ralph"
    if not isinstance(source, str) or not source:
        return "?"
    run = record.get("run")
    found = _RUN.fullmatch(run) if isinstance(run, str) else None
    if found and found.group(1) == source and found.group(2):
        return f"{field(source)} {field(found.group(2))}"
    return field(source)
