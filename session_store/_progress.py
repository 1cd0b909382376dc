"""Task markers and counts, and progress.md: one line per task with its marker, the file a
human reads first. The markers are data (the iteration's metadata, `TaskProgress`); progress.md
is rendered from them on every change and never read back."""
# no `from __future__ import annotations`: cattrs reads TaskCounts' annotations (in a
# session's metadata), and each one given as a string costs it a compile
from dataclasses import dataclass

from ._record import record

TODO, IN_PROGRESS, DONE, FAILED, CANCELLED = " ", "/", "x", "F", "C"
MARKERS = (TODO, IN_PROGRESS, DONE, FAILED, CANCELLED)
FINISHED = (DONE, FAILED, CANCELLED)


@dataclass(slots=True)
class TaskLine:
    id: str
    title: str
    batch: int
    marker: str = TODO
    note: str | None = None


@record
class TaskCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0
    pending: int = 0


def session_counts(before: TaskCounts, lines: list[TaskLine]) -> TaskCounts:
    """The session's task counts: those before the iteration plus its own."""
    return TaskCounts(total=before.total + len(lines),
                      completed=before.completed + sum(t.marker == DONE for t in lines),
                      failed=before.failed + sum(t.marker == FAILED for t in lines),
                      pending=before.pending + sum(t.marker not in FINISHED for t in lines))


def render(iteration: int, tasks: list[TaskLine]) -> str:
    lines = [f"# Progress — iteration {iteration}", "",
             "Markers: [ ] todo, [/] in progress, [x] done, [F] failed, [C] cancelled", ""]
    for t in tasks:
        note = f" — {_one_line(t.note)}" if t.note else ""
        lines.append(f"- [{t.marker}] {t.id}: {_one_line(t.title)} (batch {t.batch}){note}")
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    """A title or note an agent wrote stays on its task's line: a newline in it would cut
    the task out of the file."""
    return text.replace("\n", " ")

