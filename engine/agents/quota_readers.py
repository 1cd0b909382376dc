"""What the agent CLIs say of their account's usage windows as a run streams (Claude Code's
`rate_limit_event`; Codex's `exec --json` says none, Gemini CLI only an exhausted quota,
as an error: docs/quota.md). Nothing here trusts the output: an agent prints what it likes.
"""
from __future__ import annotations

import glob
import os

from ralph.session_store import WINDOW_NAME

from .preset import QuotaSeen, RunEnd, as_dict, json_lines
from .resets import aware, epoch

MAX_WINDOWS = 8   # of one account, as a run tells them: more is garbage


def claude_quota(end: RunEnd) -> tuple[QuotaSeen, ...]:
    """stream-json's `rate_limit_event` lines (a subscriber's: none with an API key):
    `rate_limit_info` {status, resetsAt (epoch s), rateLimitType, utilization (0..1, said
    at a warning or a rejection), unifiedWindows: {window: {utilization, resetsAt,
    status}}}. The latest word on each window wins; a window whose use is not said is none
    (a rejection is 100 %). Untrusted: a name that is no window's, a share out of 0..1, a
    reset implausibly far are clamped or dropped."""
    now = aware(end.now)
    seen: dict[str, QuotaSeen] = {}

    def said(window, info: dict) -> None:
        if not isinstance(window, str) or not WINDOW_NAME.fullmatch(window) or \
                window not in seen and len(seen) >= MAX_WINDOWS:
            return
        used = info.get("utilization")
        if isinstance(used, bool) or not isinstance(used, (int, float)) or used != used:
            if info.get("status") != "rejected":
                return
            used = 1.0
        seen[window] = QuotaSeen(window, round(min(max(float(used), 0.0), 1.0) * 100, 1),
                                 epoch(info.get("resetsAt"), now))

    # only the lines that can be one are decoded (a run's log is mostly other lines)
    said_lines = "\n".join(line for line in end.stdout.splitlines() if "rate_limit_event" in line)
    for event in json_lines(said_lines):
        if event.get("type") != "rate_limit_event":
            continue
        info = as_dict(event.get("rate_limit_info"))
        said(info.get("rateLimitType"), info)
        windows = as_dict(info.get("unifiedWindows"))
        for window in list(windows)[:MAX_WINDOWS]:
            said(window, as_dict(windows[window]))
    return tuple(seen.values())


CODEX_WINDOWS = {300: "five_hour", 10080: "seven_day"}   # minutes: the names Claude's use
ROLLOUT_TAIL = 1 << 20    # the end of a rollout file read: its last token_count is there


def codex_quota(thread: str | None, now) -> tuple[QuotaSeen, ...]:
    """`codex exec --json` prints no usage window; Codex keeps them (from its API's
    `x-codex-primary-*` / `-secondary-*` headers) in its rollout file,
    $CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl, as `token_count`
    events: {"rate_limits": {"primary": {"used_percent", "window_minutes", "resets_at"},
    "secondary": ...}}. The last of them, read from the file's end (a file the run could
    write: clamped as stdout is)."""
    if thread is None:
        return ()
    home = os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    days = sorted(glob.glob(os.path.join(glob.escape(home), "sessions", "*", "*", "*")))[-3:]
    found = [p for day in days for p in glob.glob(os.path.join(
        glob.escape(day), f"rollout-*-{glob.escape(thread)}.jsonl"))]
    if not found:
        return ()
    try:
        fd = os.open(found[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - ROLLOUT_TAIL))
            text = f.read(ROLLOUT_TAIL).decode("utf-8", errors="replace")
    except OSError:
        return ()
    limits: dict = {}
    for event in json_lines(text):
        payload = as_dict(event.get("payload"))
        if payload.get("type") == "token_count" and isinstance(payload.get("rate_limits"),
                                                               dict):
            limits = payload["rate_limits"]
    seen = []
    for slot in ("primary", "secondary"):
        window = as_dict(limits.get(slot))
        used, minutes = window.get("used_percent"), window.get("window_minutes")
        if isinstance(used, bool) or not isinstance(used, (int, float)) or used != used:
            continue
        name = CODEX_WINDOWS.get(minutes, slot) if isinstance(minutes, int) else slot
        seen.append(QuotaSeen(name, round(min(max(float(used), 0.0), 100.0), 1),
                              epoch(window.get("resets_at"), aware(now))))
    return tuple(seen)
