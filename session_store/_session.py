"""A session of DESIGN §4, behind a few verbs: what every backend's handle is. Its work
area (`work_dir`, in the workspace), its iterations' files, notes and logs (`dir`, the
control plane out of the agents' reach, see _places) stay on the machine that runs it
in every backend, and are kept here; its control plane (metadata, the bus, questions,
signals, the lease, wakeups) is the backend's own: files/ or postgres/."""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from datetime import datetime
from typing import TYPE_CHECKING

from . import _diagnostics, _quota
from ._atomic import read_nofollow, write_atomic
from ._faults import DiskFaults
from ._iteration import Iteration
from ._metadata import SessionMetadata
from ._places import control_root, work_root
from ._work import WorkArea

if TYPE_CHECKING:
    from ._interface import BusReader, Lease, Questions, Signals, Wakeups
    from ._quota import QuotaReading

SUMMARY_FILE = "summary.md"
SCRATCHPAD_FILE = "scratchpad.md"
MAX_SCRATCHPAD_BYTES = 1 << 20    # what of it is read (agents may write it without end)


def sessions_root(workspace: str) -> str:
    """Where the workspace's sessions' control planes are."""
    return control_root(workspace)


class Session(DiskFaults, ABC):
    """One session, behind verbs. `dir` is its control plane, the file backend's address of
    it (nothing above the store passes it back: `questions`, `signals` and the lease are
    verbs here); `work_dir` is its work area, which agents get (RALPH_SESSION_DIR).
    `machine`: where it runs, in a fleet's shared store (None: this one's files)."""

    machine: str | None = None

    def __init__(self, workspace: str, session_id: str, metadata: SessionMetadata):
        self.workspace = os.path.abspath(workspace)
        self.id = session_id
        self.dir = os.path.join(sessions_root(workspace), session_id)
        self.work_dir = os.path.join(work_root(workspace), session_id)
        self.metadata = metadata
        self._work: WorkArea | None = None

    def runs_here(self) -> bool:
        """Whether its engine runs on this machine (its pid means a process here)."""
        return True

    @property
    @abstractmethod
    def mailbox_dir(self) -> str | None:
        """What an agent's poll may list to see whether signals wait, without asking the
        engine (None where the mailbox is no directory: the poll then asks)."""

    @property
    def work(self) -> WorkArea:
        """The engine's writer of the work area (every path walked without links)."""
        if self._work is None:
            self._work = WorkArea(self.work_dir)
        return self._work

    @abstractmethod
    def save(self, now: datetime) -> None:
        """Persist metadata: revision + 1, only over the revision this handle read or wrote
        last (a compare-and-set); another writer's save in between: StaleMetadata."""

    def iteration(self, number: int | None = None) -> Iteration:
        return Iteration(self.dir, self.metadata.iteration if number is None else number,
                         self.work)

    # --- its questions and signals, its run's lease ---

    @property
    @abstractmethod
    def questions(self) -> "Questions": ...

    @property
    @abstractmethod
    def signals(self) -> "Signals": ...

    @abstractmethod
    def running_pid(self) -> int | None:
        """The pid of the engine running the session, or None when none does."""

    @abstractmethod
    def acquire_lease(self, wait_seconds: float = 0.2) -> "Lease":
        """One engine per session: held for the engine's lifetime, else SessionLocked."""

    # --- the bus ---

    @abstractmethod
    def append_event(self, topic: str, payload=None, *, source: str = "engine", ts=None,
                     run: str | None = None, via: list | None = None) -> dict: ...

    @abstractmethod
    def reader(self) -> "BusReader":
        """An incremental reader of what is appended from now on."""

    @abstractmethod
    def once(self, key: str, topic: str, payload=None, *, source: str = "engine", ts=None,
             run: str | None = None, via: list | None = None) -> bool:
        """Append this record with dedupe key `key` (a string the caller builds, e.g.
        f"human.timeout:{qid}") unless one with that key is on the bus already: True when
        it was appended now, False when it was there. Exactly once across processes and
        crashes."""

    @abstractmethod
    def done(self, key: str) -> bool:
        """Whether a record with dedupe key `key` is on the bus (complete: a torn last
        line is not done)."""

    @abstractmethod
    def events_after(self, seq: int) -> list[dict]:
        """The records past `seq` (a reader's cursor), oldest first."""

    @abstractmethod
    def last_seq(self) -> int: ...

    @abstractmethod
    def tail(self, count: int) -> list[dict]:
        """The newest `count` records, oldest first."""

    # --- wakeups ---

    @abstractmethod
    def subscribe(self, wakeup) -> "Wakeups":
        """Set `wakeup` when something the engine acts on lands: a signal, a question or
        an answer (the inlet watches each open run's outbox). Calling the result stops
        it; its `failed` says why no notification works (it polls every second then)."""

    @abstractmethod
    def follow(self, wakeup) -> "Wakeups":
        """Set `wakeup` when the bus grows (and at other writes beside it)."""

    @abstractmethod
    def last_event(self, match) -> dict | None:
        """The newest record for which `match(record)` holds, read from the end back."""

    @abstractmethod
    def events_backwards(self):
        """The records, newest first, read from the end back as they are taken (a reader
        that stops early reads no further)."""

    # --- notes ---

    def append_scratchpad(self, *notes: tuple[str, str | None]) -> None:
        """Append notes (text, mark) in one rewrite; a note whose mark is there already
        is skipped, so appending is idempotent by mark. Not `once`: the note is the effect,
        in a file the agents read and write; a bus key beside it could not share its write."""
        old = self.scratchpad() or "# Scratchpad\n"
        new = [text.rstrip("\n") for text, mark in notes if not (mark and mark in old)]
        if new:
            self.work.write(SCRATCHPAD_FILE, old.rstrip("\n") + "\n\n" + "\n".join(new)
                            + "\n", "scratchpad")

    def scratchpad(self) -> str | None:
        """The scratchpad, in the work area (agents keep notes there): prompts' reading."""
        try:
            return read_nofollow(os.path.join(self.work_dir, SCRATCHPAD_FILE),
                                 MAX_SCRATCHPAD_BYTES).decode("utf-8", errors="replace")
        except OSError:   # none, or a symlink planted in its place: not read
            return None

    # --- its accounts' usage windows (shared by every session on an account: _quota) ---

    def quota(self, account: str) -> "dict[str, QuotaReading]":
        """The latest reading of each window of `account`, whichever session saw it."""
        return _quota.read_account(account)

    def record_quota(self, account: str, reading: "QuotaReading") -> bool:
        """Keep a window's reading for every session on `account` (unless a newer one is
        there): True when kept."""
        return _quota.record_reading(account, reading)

    # --- a hook run's log (descriptor, path), diagnostics: see _diagnostics ---

    def open_hook_log(self, name: str, now: datetime) -> tuple[int, str]:
        path = _diagnostics.hook_log(self.work_dir, name, now)
        return self.work.open_file(path), path

    def append_diagnostics(self, records: list[dict]) -> None:
        _diagnostics.append(self.dir, records)

    def diagnostics(self) -> list[dict]:
        return _diagnostics.read(self.dir)

    # --- the config it started with, its end ---

    @abstractmethod
    def config_snapshot(self) -> tuple[bytes, str]:
        """(the config text the session started with, where it is for error messages). A
        snapshot that is missing, empty or unreadable is refused: the session is never
        resumed on defaults it did not start with."""

    def has_summary(self) -> bool:
        """Written last: until it exists, a finished session's closing work is not done."""
        return os.path.exists(os.path.join(self.dir, SUMMARY_FILE))

    def write_summary(self) -> None:
        m = self.metadata
        t, u = m.tasks, m.usage
        write_atomic(os.path.join(self.dir, SUMMARY_FILE), (
            f"# Session {m.session_id}: {m.status.value}\n\n"
            f"Objective: {m.objective}\n\n"
            f"- iterations: {m.iteration}\n"
            f"- tasks: {t.total} ({t.completed} done, {t.failed} failed, {t.pending} pending)\n"
            f"- agent invocations: {u.agent_invocations}\n"
            f"- runtime: {u.runtime_seconds:.1f}s, cost: ${u.cost_usd:.2f}\n"
            f"- created: {m.created_at.isoformat()}\n"
            f"- completed: {m.completed_at.isoformat() if m.completed_at else '-'}\n"),
            "summary")
