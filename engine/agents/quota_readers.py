"""What the agent CLIs say of their account's usage windows as a run streams (Claude Code's
`rate_limit_event`; Codex's `exec --json` says none, Gemini CLI only an exhausted quota,
as an error: docs/quota.md). Nothing here trusts the output: an agent prints what it likes.
"""
from __future__ import annotations

from session_store import WINDOW_NAME

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

    for event in json_lines(end.stdout):
        if event.get("type") != "rate_limit_event":
            continue
        info = as_dict(event.get("rate_limit_info"))
        said(info.get("rateLimitType"), info)
        windows = as_dict(info.get("unifiedWindows"))
        for window in list(windows)[:MAX_WINDOWS]:
            said(window, as_dict(windows[window]))
    return tuple(seen.values())
