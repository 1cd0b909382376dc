"""`iterations/<N>/`: the iteration's metadata (with its tasks' markers and attempts'
outcomes), the views rendered from it (plan, tasks, progress.md), one report per
attempt, reviews, run logs and work-state captures. Every name and format here is the
store's own: callers hand over data (an Attempt, a Review) and get data back."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from datetime import datetime


from . import _legacy, _progress
from ._atomic import disk, durable_write_done, make_dirs, open_private, read_nofollow, write_atomic
from ._codec import structure, unstructure
from ._knowledge import Knowledge
from ._metadata import IterationMetadata, PlannedTask, TaskProgress
from ._schema import dump_plain, parse_yaml

METADATA_FILE = "metadata.yaml"
ITERATION_SUBDIRS = ("tasks", "reports", "reviews", "knowledge")


@dataclass(slots=True)
class Attempt:
    """One run of a role on a task, as its report records it."""
    task_id: str
    title: str
    outcome: str            # done | failed | blocked | empty | asked | timed_out
    exit_code: int | None
    timed_out: bool
    duration: float
    events: list[tuple[str, object]]   # (topic, payload) as gated
    output_tail: str


@dataclass(slots=True)
class RunFiles:
    """Where one agent run's prompt and output are kept."""
    prompt: str
    stdout: str
    stderr: str

    @property
    def base(self) -> str:
        return self.stdout[:-len(".stdout")]


class Iteration:
    """Files of `iterations/<N>/`: `dir` in the control plane (the plan, progress,
    reports, reviews), `work_dir` in the work area, where agents write (RALPH_ITERATION_DIR:
    the knowledge the Librarian stages) and the runs' logs are kept (their prompts and
    output: what agents read and print, never read back to decide anything but the run's
    own report)."""

    def __init__(self, session_dir: str, number: int, work=None):
        self.number = number
        self._session_dir = session_dir
        self.dir = os.path.join(session_dir, "iterations", str(number))
        self._work = work
        self.work_rel = f"iterations/{number}"
        self.work_dir = os.path.join(work.path, self.work_rel) if work else self.dir
        self.knowledge = Knowledge(self.work_dir, self.dir, work)
        self._seeded = False                     # loaded from an older ralph's markdown
        self._progress_view: str | None = None   # progress.md as last read or rendered

    def make_work_dirs(self) -> None:
        """The agents' side of the iteration (knowledge/, logs/), made without following
        links."""
        if self._work is not None:
            for sub in ("knowledge", "logs"):
                os.close(self._work.dir_fd(f"{self.work_rel}/{sub}"))

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    # --- metadata ---

    def exists(self) -> bool:
        return os.path.isfile(self.path(METADATA_FILE))

    def start(self, now: datetime, **fields) -> IterationMetadata:
        """Make the iteration's directories and its metadata (with `fields`, e.g.
        tasks_before), not yet written: its first save (the plan's commit point) writes it
        whole, so a crash never leaves it half-initialised."""
        make_dirs(*(self.path(sub) for sub in ITERATION_SUBDIRS))
        self.make_work_dirs()
        return IterationMetadata(iteration=self.number, started_at=now, **fields)

    def create(self, now: datetime, **fields) -> IterationMetadata:
        meta = self.start(now, **fields)
        self.save(meta)
        return meta

    def load(self) -> IterationMetadata:
        """Its metadata. One an older ralph wrote (no `progress` in it) gets its markers and
        attempt outcomes from the markdown it kept them in (`_legacy`), in memory: the
        engine's `settle` writes them, and the markdown is not read again."""
        path = self.path(METADATA_FILE)
        data = parse_yaml(read_nofollow(path), path)
        meta = structure(data, IterationMetadata, path)
        if isinstance(data, dict) and "progress" not in data:
            self._seed_from_markdown(meta)
        return meta

    def save(self, meta: IterationMetadata) -> None:
        """The metadata, the iteration's truth (markers and attempts included), then
        progress.md rendered from it: a kill in between leaves a view `settle` renders."""
        write_atomic(self.path(METADATA_FILE), dump_plain(unstructure(meta)), "iteration-metadata")
        self._seeded = False
        self._render_progress(meta)

    def settle(self, meta: IterationMetadata) -> None:
        """What a kill, a power cut or an older ralph left, made whole from the metadata
        (the engine's, when it takes the iteration up): seeded markers written once, the
        plan's views written again if they were lost, progress.md rendered again if it is
        not the metadata's (a kill before its render, or anyone's edit)."""
        if self._seeded:
            self.save(meta)
        if meta.planning_completed_at is not None and meta.tasks_defined \
                and self._read("plan.md") is None:
            self.write_plan(meta.tasks_defined)
        self._render_progress(meta)

    # --- the plan and its progress ---

    def write_plan(self, tasks: list[PlannedTask]) -> None:
        """tasks/<ID>.md and plan.md. They are views of the tasks the iteration's metadata
        records, written before it (the commit point, the caller's), so they need no fsync
        of their own: lost to a power cut, they are written again from it (`settle`)."""
        for t in tasks:
            self._write(f"tasks/{t.id}.md", f"# {t.id}: {t.title}\n\nBatch {t.batch}\n\n"
                                            f"{t.description}\n", "task", durable=False)
        lines = [f"# Plan — iteration {self.number}", ""]
        for batch in sorted({t.batch for t in tasks}):
            lines += [f"## Batch {batch}", ""]
            lines += [f"- **{t.id}**: {t.title}" + (f" — {t.description}" if t.description else "")
                      for t in tasks if t.batch == batch]
            lines.append("")
        self._write("plan.md", "\n".join(lines), "plan", durable=False)

    def plan_text(self) -> str | None:
        return self._read("plan.md")

    def progress_text(self) -> str | None:
        """progress.md, the markers' view (for eyes: agents and humans)."""
        return self._read("progress.md")

    def set_markers(self, meta: IterationMetadata, task_ids: list[str], marker: str,
                    note: str | None = None) -> None:
        """Mark tasks (one write of the metadata), then render progress.md."""
        for task_id in task_ids:
            mine = meta.progress.setdefault(task_id, TaskProgress())
            mine.marker, mine.note = marker, note
        self.save(meta)

    def _render_progress(self, meta: IterationMetadata) -> None:
        """progress.md from the markers, when it would change. A view, no fsync: lost to a
        power cut, the next `settle` renders it again."""
        if not meta.tasks_defined:
            return
        text = _progress.render(self.number, meta.task_lines())
        if self._progress_view is None:
            self._progress_view = self.progress_text()
        if text != self._progress_view:
            write_atomic(self.path("progress.md"), text, "progress", durable=False)
            self._progress_view = text

    def _seed_from_markdown(self, meta: IterationMetadata) -> None:
        marks = _legacy.markers(self.progress_text() or "")
        for t in meta.tasks_defined:
            marker, note = marks.get(t.id, (_progress.TODO, None))
            outcomes = [_legacy.outcome(read_nofollow(p).decode("utf-8", errors="replace"))
                        for p in self._legacy_reports(t.id)]
            meta.progress[t.id] = TaskProgress(marker, note, outcomes)
        self._seeded = True

    # --- attempts and reviews ---

    def _report_path(self, task_id: str, attempt: int) -> str:
        suffix = "" if attempt == 1 else f"-r{attempt}"
        return self.path("reports", f"{task_id}-report{suffix}.md")

    def _legacy_reports(self, task_id: str) -> list[str]:
        found, attempt = [], 1
        while os.path.exists(path := self._report_path(task_id, attempt)):
            found.append(path)
            attempt += 1
        return found

    def record_attempt(self, meta: IterationMetadata, a: Attempt) -> str:
        """Its report (-report.md, -report-r2.md, ...: the details), then its outcome in the
        metadata, where it counts: a kill in between leaves a report the next attempt's
        replaces."""
        mine = meta.progress.setdefault(a.task_id, TaskProgress())
        path = self._report_path(a.task_id, len(mine.attempts) + 1)
        events = "\n".join(f"- {topic}: {payload}" for topic, payload in a.events) or "(none)"
        write_atomic(path, (
            f"# Report: {a.task_id} — {a.title}\n\n"
            f"- outcome: {a.outcome}\n"
            f"- exit code: {a.exit_code}{' (timed out)' if a.timed_out else ''}\n"
            f"- duration: {a.duration:.2f}s\n\n"
            f"## Events (as gated)\n\n{events}\n\n"
            f"## Output (last lines)\n\n```\n{a.output_tail}\n```\n"), "report")
        mine.attempts.append(a.outcome)
        self.save(meta)
        return path

    def latest_report(self, meta: IterationMetadata, task_id: str) -> str | None:
        attempts = len(meta.task_progress(task_id).attempts)
        return self._report_path(task_id, attempts) if attempts else None

    def has_review(self, task_id: str) -> bool:
        """The review file is a review's commit point."""
        return os.path.exists(self.path("reviews", f"{task_id}.md"))

    def write_review(self, task_id: str, title: str, verdict: str, reason) -> None:
        self._write(f"reviews/{task_id}.md",
                    f"# Review: {task_id} — {title}\n\nverdict: {verdict}\n\n{reason}\n", "review")

    # --- agent runs ---

    def run_files(self, seq: int, name: str) -> RunFiles:
        return self._files_of(f"{seq:04d}-{name}")

    @property
    def logs(self) -> str:
        return os.path.join(self.work_dir, "logs")

    def _files_of(self, run: str) -> RunFiles:
        base = os.path.join(self.logs, run)
        return RunFiles(base + ".prompt.md", base + ".stdout", base + ".stderr")

    def runs_of(self, name: str) -> int:
        """How many runs of `name` (role, or role-task) this iteration has logs of."""
        return sum(1 for f in self.run_logs() if f.endswith(f"-{name}.stdout"))

    def write_prompt(self, files: RunFiles, text: str) -> None:
        """A log, like the run's output: written once, under a name of its own, no fsync."""
        fd = self.open_output(files.prompt)
        try:
            with disk(files.prompt):
                view = memoryview(text.encode("utf-8"))
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        durable_write_done("prompt", files.prompt, durable=False)

    def last_run_seq(self) -> int:
        """The highest run number among this iteration's logs (0 when none)."""
        return max((int(f[:4]) for f in self.run_logs() if f[:4].isdigit()), default=0)

    def open_output(self, path: str) -> int:
        """A log of one of its runs (`run_files`), opened private (0600) for writing, never
        through a planted link (in the work area, agents can plant one anywhere)."""
        if self._work is None:
            with disk(path):
                return open_private(path)
        return self._work.open_file(path)

    def run_logs(self) -> list[str]:
        """The file names of every run's prompt and output, in run order."""
        folder = self._open_logs()
        if folder is None:
            return []
        try:
            return sorted(os.listdir(folder))
        finally:
            os.close(folder)

    def _open_logs(self) -> int | None:
        """logs/, reached without following a link: in the work area an agent can plant
        one anywhere (its iterations/<N> linked to a folder with a logs/ of its own would
        have that folder listed and its files read as this iteration's logs)."""
        if self._work is not None:
            return self._work.open_dir(f"{self.work_rel}/logs")
        try:
            return os.open(self.logs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                           | os.O_CLOEXEC)
        except OSError:
            return None

    def runs(self) -> list[dict]:
        """Each agent run of the iteration, in run order: {"run": its name
        ("<seq>-<role>[-<task>]"), "files": its prompt and output files of `run_logs()`}."""
        names = self.run_logs()
        present = set(names)
        found = []
        for name in names:
            if name.endswith(".stdout"):
                files = self._files_of(name[:-len(".stdout")])
                found.append({"run": name[:-len(".stdout")],
                              "files": [os.path.basename(p) for p in
                                        (files.prompt, files.stdout, files.stderr)
                                        if os.path.basename(p) in present]})
        return found

    def run_log(self, name: str, limit: int) -> tuple[str, int] | None:
        """The last `limit` bytes of one of `run_logs()` as text, and the file's size; None
        for a name that is not one of them (so a name from outside never becomes a path), or
        one that is not a regular file of this logs/ (no link followed, on the way or at
        the name)."""
        folder = self._open_logs()
        if folder is None:
            return None
        try:
            if name not in os.listdir(folder):
                return None
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=folder)
        except OSError:
            return None
        finally:
            os.close(folder)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None
            f.seek(max(0, st.st_size - limit))
            return f.read(limit).decode("utf-8", errors="replace"), st.st_size

    # --- the rest ---

    def write_work_state(self, text: str) -> str:
        """work-state-<k>.md, a fallback's capture of where the work stands."""
        n = 1 + sum(1 for f in os.listdir(self.dir) if f.startswith("work-state-"))
        return self._write(f"work-state-{n}.md", text, "work-state")

    def _write(self, relpath: str, text: str, kind: str, durable: bool = True) -> str:
        path = self.path(relpath)
        make_dirs(os.path.dirname(path))
        write_atomic(path, text, kind, durable)
        return path

    def _read(self, relpath: str) -> str | None:
        try:
            return read_nofollow(self.path(relpath)).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None
