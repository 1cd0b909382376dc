"""Issue 31: the engine's memory is flat in an agent's output, and a run's logs are bounded.

The attack: an agent prints 300 MB on its stdout; the engine read each run's logs whole
(976 MB of memory for 300 MB, 5.1 GiB for 1 GiB) and kept them whole on disk. Now it reads
a bounded head and tail (session_store/_runlog.py) and keeps only those once the run is
over; every preset still reads what it needs there (its first lines and its last).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from ralph.engine.agents.presets import Claude, Codex, Demo, Gemini, RunEnd
from ralph.session_store import MAX_LOG_BYTES, keep_bounded
from ralph.session_store._runlog import HEAD_BYTES, TAIL_BYTES
from support import base_env, metadata, run_logs, session_dir
from test_limits_presets import (GEMINI_SESSION, NOW, PLUS, SESSION, THREAD, claude_subscriber,
                                 codex_output, gemini_stderr)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _loud_agent  # noqa: E402

NOISE = json.dumps({"type": "assistant", "message": {"id": "m-noise", "content": [
    {"type": "text", "text": "noise " * 100}]}}) + "\n"


def loud(first: str, last: str, size: int = 8 << 20) -> str:
    """A CLI's first lines, `size` bytes of its chatter, its last lines."""
    return first + "\n" + NOISE * (size // len(NOISE)) + last + "\n"


def kept(tmp_path: Path, text: str, name: str = "run.stdout") -> tuple[str, Path]:
    """`text` as a run's log in a work area, read back and kept as the engine does."""
    path = tmp_path / "logs" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    fd = os.open(path, os.O_RDONLY)
    try:
        return keep_bounded(str(tmp_path), str(path), fd).decode(), path
    finally:
        os.close(fd)


def test_a_log_past_the_bound_keeps_its_head_and_tail_in_whole_lines(tmp_path):
    lines = [f"line {i:09d}\n" for i in range(1_000_000)]    # 15 MB
    text, path = kept(tmp_path, "".join(lines))
    assert path.stat().st_size == len(text.encode()) <= MAX_LOG_BYTES
    head, cut, tail = text.partition("\n[ralph: ")
    cut = cut + tail.split("\n", 1)[0]
    assert head.startswith("line 000000000\n") and head.endswith("\n")
    assert tail.split("\n", 1)[1].endswith("line 000999999\n")
    kept_lines = head.splitlines() + tail.split("\n", 1)[1].splitlines()
    assert set(kept_lines) <= {line.rstrip("\n") for line in lines}   # no half line
    cut_bytes = int(cut.split("[ralph: ")[1].split()[0])
    assert cut_bytes == 15_000_000 - len(head) - len(tail.split("\n", 1)[1])
    assert len(head) <= HEAD_BYTES and len(tail.split("\n", 1)[1]) <= TAIL_BYTES


def test_a_log_within_the_bound_is_read_and_kept_whole(tmp_path):
    text = "x" * (HEAD_BYTES + TAIL_BYTES - 1) + "\n"
    read, path = kept(tmp_path, text)
    assert read == text and path.read_text() == text


def test_something_planted_at_the_logs_place_is_left_and_the_run_still_read(tmp_path):
    """The agent swapped its log for a directory: the engine reads the file it opened,
    bounded, and leaves the directory (no crash)."""
    path = tmp_path / "logs" / "run.stdout"
    path.parent.mkdir()
    path.write_text(NOISE * (4 << 20 // len(NOISE)))
    fd = os.open(path, os.O_RDONLY)
    try:
        path.unlink()
        path.mkdir()
        data = keep_bounded(str(tmp_path), str(path), fd)
    finally:
        os.close(fd)
    assert len(data) <= MAX_LOG_BYTES and path.is_dir()
    assert [p.name for p in path.parent.iterdir()] == ["run.stdout"]   # no temp file left


def end(stdout: str = "", stderr: str = "", exit_code: int | None = 0) -> RunEnd:
    return RunEnd(stdout, stderr, exit_code, NOW)


def test_claude_reads_its_init_line_and_its_result_through_the_bound(tmp_path):
    """stream-json: the conversation's id on the first line, the cost on the last."""
    init = json.dumps({"type": "system", "subtype": "init", "session_id": SESSION,
                       "tools": ["Bash"] * 2000})
    result = json.dumps({"type": "result", "subtype": "success", "is_error": False,
                         "result": "all done\nLOOP_COMPLETE", "session_id": SESSION,
                         "total_cost_usd": 1.25,
                         "usage": {"input_tokens": 10, "output_tokens": 20}})
    stdout, _ = kept(tmp_path, loud(init, result))
    assert Claude().conversation(end(stdout)) == SESSION
    report = Claude().report(stdout)
    assert (report.text, report.cost_usd, report.input_tokens, report.output_tokens) == \
        ("all done\nLOOP_COMPLETE", 1.25, 10, 20)
    limited, _ = kept(tmp_path, loud(*claude_subscriber().split("\n", 1)), "limited.stdout")
    assert Claude().limit(end(limited)).until is not None
    assert Claude().conversation(end(limited)) == SESSION


def test_codex_reads_its_thread_and_its_last_turn_through_the_bound(tmp_path):
    first, rest = codex_output(PLUS).split("\n", 1)
    stdout, _ = kept(tmp_path, loud(first, rest))
    assert Codex().conversation(end(stdout)) == THREAD
    assert Codex().limit(end(stdout)).text == PLUS
    said = "\n".join(json.dumps(e) for e in (
        {"type": "item.completed", "item": {"type": "agent_message", "text": "done"}},
        {"type": "turn.completed", "usage": {"input_tokens": 7, "output_tokens": 3}}))
    stdout, _ = kept(tmp_path, loud(first, said), "done.stdout")
    report = Codex().report(stdout)
    assert (report.text, report.input_tokens, report.output_tokens) == ("done", 7, 3)


def test_gemini_reads_its_last_document_through_the_bound(tmp_path):
    message = "Resource has been exhausted (e.g. check quota).\nSuggested retry after 400s."
    stderr, _ = kept(tmp_path, loud("YOLO mode is enabled.", gemini_stderr(message)),
                     "run.stderr")
    assert Gemini().limit(end(stderr=stderr, exit_code=173)).text == message
    doc = json.dumps({"session_id": GEMINI_SESSION, "response": "done", "stats": {"models": {
        "m": {"tokens": {"prompt": 5, "candidates": 6}}}}}, indent=2)
    stdout, _ = kept(tmp_path, doc)
    report = Gemini().report(stdout)
    assert (report.text, report.input_tokens, report.output_tokens) == ("done", 5, 6)


def test_the_demo_agent_reads_its_conversation_through_the_bound(tmp_path):
    first = json.dumps({"type": "conversation", "id": "c-1"})
    limit = json.dumps({"type": "usage_limit", "message": "limit", "resets_at": 1795731404})
    stdout, _ = kept(tmp_path, loud(first, limit))
    demo = Demo(["demo"])
    assert demo.conversation(end(stdout)) == "c-1"
    assert demo.limit(end(stdout)).text == "limit"


@pytest.mark.slow
def test_300_mb_of_agent_output_leave_the_engines_memory_flat(tmp_path):
    """The attack as filed: a `command` agent prints 300 MB on its stdout. The session
    completes; the engine's own peak RSS (VmHWM of the `ralph session start` process, not
    its agents') stays within 20 MB of a quiet twin's (on main: 981 MB against 34 MB);
    the run's log on disk is its bounded head and tail."""
    peaks = {}
    for name, size in (("quiet", 0), ("loud", 300_000_000)):
        ws = tmp_path / name
        ws.mkdir()
        (ws / "ralph.yml").write_text(yaml.safe_dump(_loud_agent.loud_config()))
        done, peaks[name] = _loud_agent.engine_measured(
            str(ws), ["session", "start", "print a lot", "--id", "s"],
            base_env(LOUD_BYTES=size), str(tmp_path / f"{name}.peak"))
        assert done.returncode == 0, done.stdout + done.stderr
        assert metadata(session_dir(ws, "s"))["status"] == "completed"
    assert peaks["loud"] - peaks["quiet"] < 20e6, peaks
    log = run_logs(session_dir(tmp_path / "loud", "s"), "0001-planner.stdout")[0]
    assert log.stat().st_size <= MAX_LOG_BYTES
    text = log.read_text()
    assert "bytes of this log were cut here" in text and text.endswith("emitted plan.ready\n")
