"""The signals mailbox of seed 001: signals/inputs, processed, rejected.

A signal is written aside and renamed into inputs/, so no consumer sees half a file.
Taking one is a rename into processed/ as `<name>.taken`: exactly one consumer wins.
Marking it handled writes `processed/<name>` (the original fields plus
`handling_metadata`) and removes the `.taken` file, so a `.taken` left by a crash is
the exact list of signals taken but not yet marked, found without parsing anything.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from datetime import datetime


from ._atomic import (create_exclusive, disk, fsync_dir, read_nofollow, rename_durable,
                      write_atomic)
from ._errors import BadInput
from ._inbox import dirs, waiting  # noqa: F401 - waiting is this module's verb too
from ._schema import dump_plain, dump_yaml, parse_yaml, shown

TYPES = ("STEER", "INFO", "PAUSE", "ABORT", "APPROVE", "SKIP")
TARGETS = ("ALL", "Orchestrator", "Planner", "Executor", "Reviewer", "Librarian", "Questioner")
FIELDS = {"type", "target", "message", "iteration", "priority"}
MAX_SIGNAL_BYTES = 1 << 20
TAKEN = ".taken"
# what else can sit in inputs/: refused by its kind, never opened, followed nor walked
_NOT_FILES = {stat.S_IFDIR: "a directory (moved aside whole, never read)",
              stat.S_IFLNK: "a symlink (never followed)", stat.S_IFIFO: "a FIFO",
              stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


@dataclass(slots=True)
class Signal:
    name: str
    type: str
    target: str
    message: str
    iteration: int | None = None
    priority: bool = False   # a STEER that interrupts the running agent (seed 004)

    @property
    def role(self) -> str | None:
        """The role a targeted signal waits for (None for ALL and Orchestrator)."""
        return None if self.target in ("ALL", "Orchestrator") else self.target.lower()

    def fields(self) -> dict:
        data: dict[str, object] = {"type": self.type, "target": self.target,
                                   "message": self.message}
        if self.iteration is not None:
            data["iteration"] = self.iteration
        if self.priority:
            data["priority"] = True
        return data


def canonical_target(value: str) -> str | None:
    """'ALL', 'executor', 'Ralph-Executor' -> the canonical name; None when unknown."""
    name = value[len("Ralph-"):] if value.lower().startswith("ralph-") else value
    return next((t for t in TARGETS if t.lower() == name.lower()), None)


def validate(data, name: str = "signal") -> Signal:
    """A signal from parsed YAML, or BadInput saying which field is wrong."""
    if not isinstance(data, dict):
        raise BadInput("$: expected a mapping with type, target, message")
    unknown = sorted(k if isinstance(k, str) else shown(k) for k in data if k not in FIELDS)
    if unknown:
        raise BadInput(f"$: unknown field {', '.join(unknown)}")
    kind = data.get("type")
    if not isinstance(kind, str) or kind.upper() not in TYPES:
        raise BadInput(f"$.type: expected one of {', '.join(TYPES)}, got {shown(kind)}")
    target = data.get("target", "ALL")
    canonical = canonical_target(target) if isinstance(target, str) else None
    if canonical is None:
        raise BadInput(f"$.target: expected one of {', '.join(TARGETS)}, got {shown(target)}")
    message = data.get("message", "")
    if message is None:
        message = ""
    if not isinstance(message, str):
        raise BadInput(f"$.message: expected a string, got {type(message).__name__}")
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:   # from argv bytes or a JSON "\ud800": not writable
        raise BadInput("$.message: expected UTF-8 text") from None
    iteration = data.get("iteration")
    if iteration is not None and (type(iteration) is not int or iteration < 1):
        raise BadInput(f"$.iteration: expected a positive integer, got {shown(iteration)}")
    priority = data.get("priority", False)
    if type(priority) is not bool:
        raise BadInput(f"$.priority: expected true or false, got {shown(priority)}")
    if priority and kind.upper() != "STEER":
        raise BadInput("$.priority: only a STEER can be a priority signal")
    return Signal(name, kind.upper(), canonical, message, iteration, priority)


def drop(session_dir: str, kind: str, message: str, *, now: datetime, target: str = "ALL",
         iteration: int | None = None, priority: bool = False) -> str:
    """Write a signal into inputs/ (whole, under a name no other writer can take)."""
    signal = validate({"type": kind, "target": target, "message": message,
                       **({"iteration": iteration} if iteration is not None else {}),
                       **({"priority": True} if priority else {})})
    inputs, _, _ = dirs(session_dir)
    stamp = f"{now.strftime('%y%m%d-%H%M%S')}-{now.microsecond // 1000:03d}"
    text = dump_plain(signal.fields())
    while True:
        name = f"signal.{stamp}-{os.urandom(4).hex()}.yaml"
        if create_exclusive(os.path.join(inputs, name), text, "signal-drop"):
            return name


def read(session_dir: str, name: str, where: str = "inputs") -> tuple[Signal | None, str | None, bytes]:
    """(signal, None, raw) or (None, why it is rejected, raw); raw is b'' when it is gone."""
    inputs, processed, _ = dirs(session_dir)
    path = os.path.join(inputs if where == "inputs" else processed, name)
    try:
        odd = _NOT_FILES.get(stat.S_IFMT(os.lstat(path).st_mode))
        if odd:
            return None, f"not a signal file: {odd}", b"?"
        # O_NONBLOCK: a FIFO swapped in since must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None, b""
    except OSError as e:
        return None, f"cannot be read ({e.strerror}; symlinks are refused)", b"?"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SIGNAL_BYTES:
            return None, f"not a regular file of at most {MAX_SIGNAL_BYTES} bytes", b"?"
        raw = os.read(fd, MAX_SIGNAL_BYTES + 1)
    finally:
        os.close(fd)
    try:
        data = parse_yaml(raw, name)
        return validate(data, name), None, raw
    except BadInput as e:
        return None, str(e), raw
    except Exception as e:  # the YAML library's own odd failures on garbage bytes
        return None, f"not valid YAML ({type(e).__name__})", raw


def take(session_dir: str, name: str) -> bool:
    """Claim a signal: False when another consumer took it first."""
    inputs, processed, _ = dirs(session_dir)
    try:
        rename_durable(os.path.join(inputs, name), os.path.join(processed, name + TAKEN),
                       "signal-take")
        return True
    except FileNotFoundError:
        return False


def mark_handled(session_dir: str, signal: Signal, *, handled_by: str, action: str,
                 now: datetime) -> None:
    _, processed, _ = dirs(session_dir)
    doc = signal.fields()
    doc["handling_metadata"] = {"handled_by": handled_by, "handled_at": now.isoformat(),
                                "action_taken": action}
    write_atomic(os.path.join(processed, signal.name), dump_plain(doc), "signal-handled")
    _remove(os.path.join(processed, signal.name + TAKEN))


def reject(session_dir: str, name: str, reason: str, raw: bytes, *, now: datetime) -> bool:
    """Move a signal that cannot be parsed or routed to rejected/, with the reason (any
    entry: a rename moves a directory whole and a symlink as the link)."""
    inputs, _, rejected = dirs(session_dir)
    try:
        rename_durable(os.path.join(inputs, name), os.path.join(rejected, name + TAKEN),
                       "signal-reject")
    except FileNotFoundError:
        return False
    _finish_reject(rejected, name, reason, raw, now)
    return True


def _finish_reject(rejected: str, name: str, reason: str, raw: bytes, now: datetime) -> None:
    try:
        original = parse_yaml(raw, name)
    except Exception:
        original = None
    doc = dict(original) if isinstance(original, dict) else \
        {"original": raw[:4096].decode("utf-8", errors="replace")}
    doc["rejection"] = {"reason": reason, "at": now.isoformat()}
    try:
        text = dump_yaml(doc)
    except Exception:  # keys or values YAML cannot write back: keep the text instead
        text = dump_yaml({"original": raw[:4096].decode("utf-8", errors="replace"),
                          "rejection": doc["rejection"]})
    write_atomic(os.path.join(rejected, name), text, "signal-rejected")
    _remove(os.path.join(rejected, name + TAKEN))


def taken_unmarked(session_dir: str) -> list[str]:
    """Signals taken but not marked handled (a crash came in between), oldest first."""
    _, processed, _ = dirs(session_dir)
    return sorted(n[:-len(TAKEN)] for n in os.listdir(processed) if n.endswith(TAKEN))


def finish_rejections(session_dir: str, now: datetime) -> None:
    """Complete rejections a crash interrupted."""
    _, _, rejected = dirs(session_dir)
    for n in sorted(os.listdir(rejected)):
        if n.endswith(TAKEN):
            try:
                fd = os.open(os.path.join(rejected, n),
                             os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                try:
                    raw = os.read(fd, MAX_SIGNAL_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) \
                        else b"?"
                finally:
                    os.close(fd)
            except OSError:  # a symlink, or gone
                raw = b"?"
            _finish_reject(rejected, n[:-len(TAKEN)], "rejected (recovered after a crash)",
                           raw, now)


def read_taken(session_dir: str, name: str) -> Signal | None:
    signal, _reason, _raw = read(session_dir, name + TAKEN, where="processed")
    if signal is not None:
        signal.name = name
    return signal


def _remove(path: str) -> None:
    """Unlink a `.taken` entry; a directory that took a signal's place is kept instead,
    beside the signal's record as `<name>.<random>.dir` (removing it means walking it)."""
    with disk(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except IsADirectoryError:
            os.rename(path, f"{path.removesuffix(TAKEN)}.{os.urandom(4).hex()}.dir")
        fsync_dir(os.path.dirname(path))


# --- guidance: STEER/INFO messages waiting for a role's next invocation ---

GUIDANCE_FILE = "guidance.yaml"


def _guidance_path(session_dir: str) -> str:
    return os.path.join(session_dir, GUIDANCE_FILE)


def guidance(session_dir: str) -> list[dict]:
    path = _guidance_path(session_dir)
    try:
        raw = read_nofollow(path)
    except FileNotFoundError:
        return []
    except OSError:   # a symlink planted in its place: not read (the next write replaces it)
        return []
    try:
        return json.loads(raw) or []
    except ValueError:  # written as YAML by an earlier version
        return parse_yaml(raw, path) or []


def _save_guidance(session_dir: str, items: list[dict]) -> None:
    """As one line of JSON (YAML readers read it too): the queue is rewritten per signal,
    and PyYAML's pure-Python build and dump of 1,000 items took 60 ms each time."""
    write_atomic(_guidance_path(session_dir), json.dumps(items) + "\n", "guidance")


def queue_guidance(session_dir: str, *new: dict) -> None:
    """Add items {id, target, message, at} in one rewrite; an id queued already is
    skipped (idempotent)."""
    items = guidance(session_dir)
    queued = {i["id"] for i in items}
    added = [i for i in new if i["id"] not in queued]
    if added:
        _save_guidance(session_dir, items + added)


def delivered(session_dir: str, ids: list[str], to: str | None = None) -> None:
    """Guidance that reached a completed agent run. With `to` (the run's unit of work:
    iteration, role, task) it is marked delivered there and stays queued for a re-run of
    that same unit, until the next transition (forget_delivered): a crash can come after
    a run completes and before its outcome is recorded, and the unit then runs again,
    which must get its guidance (and its human's answer) again. Without `to` it leaves the
    queue at once."""
    if not ids:
        return
    items = guidance(session_dir)
    if to is None:
        items = [i for i in items if i["id"] not in ids]
    else:
        for i in items:
            if i["id"] in ids:
                i["delivered_to"] = to
    _save_guidance(session_dir, items)


def forget_delivered(session_dir: str) -> None:
    """Delivered guidance leaves the queue (the work it went to is recorded)."""
    items = guidance(session_dir)
    kept = [i for i in items if "delivered_to" not in i]
    if len(kept) != len(items):
        _save_guidance(session_dir, kept)
