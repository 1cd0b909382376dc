"""Readers of what a session left on disk, as plain data (tests read files, not the
store's objects, so a store that writes the wrong thing is caught)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml


def session_dirs(ws: Path) -> list[Path]:
    root = ws / ".ralph-sessions"
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.exists() else []


def only_session(ws: Path) -> Path:
    dirs = session_dirs(ws)
    assert len(dirs) == 1, dirs
    return dirs[0]


def events(session_dir: Path) -> list[dict]:
    """Every whole record of events.jsonl (a torn or garbage line is skipped)."""
    out = []
    for line in (Path(session_dir) / "events.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def topics(session_dir: Path) -> list[str]:
    return [e["topic"] for e in events(session_dir)]


def transitions(session_dir: Path) -> list[dict]:
    """The payloads of the engine's session.transition records, in order."""
    return [e["payload"] for e in events(session_dir) if e["topic"] == "session.transition"]


def metadata(session_dir: Path) -> dict:
    return yaml.safe_load((Path(session_dir) / "metadata.yaml").read_text())


def progress_markers(session_dir: Path) -> dict[str, dict[str, str]]:
    """{iteration: {task_id: marker}} from every iterations/<N>/progress.md."""
    out = {}
    for it in sorted((Path(session_dir) / "iterations").iterdir(), key=lambda p: int(p.name)):
        pm = it / "progress.md"
        if pm.exists():
            marks = {}
            for line in pm.read_text().splitlines():
                if line.startswith("- ["):
                    marks[line[6:].split(":")[0]] = line[3]
            out[it.name] = marks
    return out


def prompts(sd: Path, role: str, task: str | None = None, iteration: int = 1) -> list[str]:
    """The prompts `role` (on `task`) was given in `iteration`, in invocation order."""
    name = f"{role}-{task}" if task else role
    logs = Path(sd) / "iterations" / str(iteration) / "logs"
    return [p.read_text() for p in sorted(logs.glob(f"*-{name}.prompt.md"))]


def question_files(sd: Path) -> list[dict]:
    """Every questions/<QID>.yaml, in name order."""
    return [yaml.safe_load(p.read_text()) for p in sorted((Path(sd) / "questions").glob("*.yaml"))]


def signal_files(sd: Path, where: str) -> dict[str, dict]:
    """signals/<where>/ (inputs, processed, rejected): {file name: its fields}, without
    the `.taken` marks of signals taken and not yet marked, nor the directories that
    took a signal's place (kept in rejected/ as `<name>.<random>.dir`)."""
    folder = Path(sd) / "signals" / where
    return {p.name: yaml.safe_load(p.read_bytes()) for p in sorted(folder.iterdir())
            if not p.name.startswith(".") and not p.name.endswith(".taken")
            and not p.is_dir()}


def taken_marks(sd: Path) -> list[str]:
    """Signals taken but not marked handled yet (`processed/<name>.taken`)."""
    return sorted(p.name[:-len(".taken")] for p in (Path(sd) / "signals" / "processed").iterdir()
                  if p.name.endswith(".taken"))
