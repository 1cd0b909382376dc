"""What a ralph from before markers and attempt outcomes were data left: an iteration
whose metadata has no `progress`, whose markers were progress.md's lines and whose
outcomes were its reports' `- outcome:` lines. Read once, to seed the data (the engine
then writes the metadata, and nothing reads these files again)."""
from __future__ import annotations

import re

from ._progress import MARKERS

_LINE = re.compile(r"^- \[(?P<marker>.)\] (?P<id>[^:\s]+): .*? \(batch \d+\)"
                   r"(?: — (?P<note>.*))?$")
_OUTCOME = re.compile(r"^- outcome: (\w+)", re.MULTILINE)


def markers(progress_md: str) -> dict[str, tuple[str, str | None]]:
    """{task id: (marker, note)} from an old progress.md."""
    found = {}
    for line in progress_md.split("\n"):   # not splitlines(): \r, \x1c, U+2028 are no line ends here
        m = _LINE.match(line)
        if m and m["marker"] in MARKERS:
            found[m["id"]] = (m["marker"], m["note"])
    return found


def outcome(report_md: str) -> str:
    """An old report's outcome ("" when it names none)."""
    found = _OUTCOME.search(report_md)
    return found.group(1) if found else ""
