"""Readers of what a session left on disk, as plain data (tests read files, not the
store's objects, so a store that writes the wrong thing is caught)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from ralph.session_store import control_root, work_root


def session_dirs(ws: Path) -> list[Path]:
    """The control planes of the workspace's sessions (in the state directory)."""
    root = Path(control_root(str(ws)))
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.exists() else []


def session_dir(ws: Path, sid: str) -> Path:
    """The control plane of session `sid` of workspace `ws` (in the state directory)."""
    return Path(control_root(str(ws))) / sid


def work_dir(sd: Path) -> Path:
    """The work area (in the workspace) of the session whose control plane is `sd`."""
    ws = (Path(sd).parent.parent / "workspace").read_text().strip()
    return Path(work_root(ws)) / Path(sd).name


def run_logs(sd: Path, pattern: str = "*", iteration: int | str = "*") -> list[Path]:
    """The agent runs' log files matching `pattern` (`*-executor-t1.stdout`,
    `*.prompt.md`) in the work area's iterations/<iteration>/logs/, in run order (their
    names begin with the run's number); none before the session exists."""
    if not Path(sd).exists():
        return []
    return sorted(work_dir(sd).glob(f"iterations/{iteration}/logs/{pattern}"),
                  key=lambda p: p.name)


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


def append_raw(session_dir: Path, *lines: bytes) -> None:
    """Append lines to the bus as they are, past the store's checks (what a writer with
    access to the file can put there)."""
    with open(Path(session_dir) / "events.jsonl", "ab") as bus:
        bus.write(b"".join(line + b"\n" for line in lines))


def topics(session_dir: Path) -> list[str]:
    return [e["topic"] for e in events(session_dir)]


def transitions(session_dir: Path) -> list[dict]:
    """The payloads of the engine's session.transition records, in order."""
    return [e["payload"] for e in events(session_dir) if e["topic"] == "session.transition"]


def metadata(session_dir: Path) -> dict:
    return yaml.safe_load((Path(session_dir) / "metadata.yaml").read_text())


def progress_markers(session_dir: Path) -> dict[str, dict[str, str]]:
    """{iteration: {task_id: marker}}: the markers each planned iteration's metadata
    records (the truth; progress.md is their view: `progress_view_markers`)."""
    out = {}
    for it in sorted((Path(session_dir) / "iterations").iterdir(), key=lambda p: int(p.name)):
        meta = it / "metadata.yaml"
        im = yaml.safe_load(meta.read_text()) if meta.exists() else {}
        if im.get("tasks_defined"):
            marks = im.get("progress", {})
            out[it.name] = {t["id"]: marks.get(t["id"], {}).get("marker", " ")
                            for t in im["tasks_defined"]}
    return out


def progress_view_markers(session_dir: Path) -> dict[str, dict[str, str]]:
    """{iteration: {task_id: marker}} as every iterations/<N>/progress.md shows them."""
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
    return [p.read_text() for p in run_logs(sd, f"*-{name}.prompt.md", iteration)]


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
