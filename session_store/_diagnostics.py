"""A session's diagnostics and its hooks' logs.

Diagnostics: JSONL records of what the engine decided and why (transitions, gate verdicts,
assessments, agent runs, hook runs), written only when diagnostics are on, under the
control plane's `diagnostics/`: out of the agents' reach, so `session diagnose` shows what
the engine saw, and local to the machine that runs the session on either backend (as the
iterations' files are; a fleet's other machines see none). One write, no fsync: a view for
a human, not a commit point. A hook's output goes to the work area's `hooks/`, the human's
to read as an agent run's logs are. Stdlib only."""
from __future__ import annotations

import json
import os

from ._atomic import DIR_MODE, FILE_MODE, disk

FOLDER, FILE, HOOK_LOGS = "diagnostics", "diagnostics.jsonl", "hooks"


def hook_log(work_dir: str, name: str, now) -> str:
    """A hook run's log: its time and the hook, made safe for a file name."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80]
    return os.path.join(work_dir, HOOK_LOGS, f"{now:%Y%m%dT%H%M%S.%f}-{safe}.log")


def append(session_dir: str, records: list[dict]) -> None:
    folder = os.path.join(session_dir, FOLDER)
    path = os.path.join(folder, FILE)
    data = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
    with disk(path):
        os.makedirs(folder, DIR_MODE, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, FILE_MODE)
        try:
            os.write(fd, data.encode("utf-8"))
        finally:
            os.close(fd)


def read(session_dir: str) -> list[dict]:
    try:
        with open(os.path.join(session_dir, FOLDER, FILE), "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:   # torn by a crash mid-write
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
