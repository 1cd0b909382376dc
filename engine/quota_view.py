"""Usage windows in `status` (CLI, --json, the web page's data, Telegram): the latest
reading of each window of the session's accounts, and each role's and task's share."""
from __future__ import annotations

from datetime import datetime, timezone

from .safe_text import field, printable


def at_utc(t: datetime) -> str:
    t = t.astimezone(timezone.utc)
    return t.strftime("%H:%M UTC") if t.second == 0 else t.strftime("%H:%M:%S UTC")


WINDOWS = {"five_hour": "5-hour", "seven_day": "weekly", "seven_day_opus": "weekly Opus",
           "seven_day_sonnet": "weekly Sonnet"}


def window_name(window: str) -> str:
    """A usage window's name as people say it ("5-hour", "weekly")."""
    return WINDOWS.get(window, window.replace("_", " "))


def describe_reading(window: str, percent: float, resets_at: datetime | None) -> str:
    """"5-hour window 95 %, resets 14:00 UTC"."""
    resets = f", resets {at_utc(resets_at)}" if resets_at else ""
    return f"{window_name(window)} window {percent:g} %{resets}"


def quota_view(session, m) -> list[dict]:
    """The latest reading of each window of the session's accounts (whichever session on
    the account read it)."""
    now = datetime.now(timezone.utc)
    shown = []
    for account in m.accounts:
        for r in session.quota(account).values():
            current = r.resets_at is None or r.resets_at > now
            shown.append({"account": account, "agent": r.agent, "window": r.window,
                          "percent": r.percent, "current": current,
                          "resets_at": r.resets_at.isoformat() if r.resets_at else None,
                          "seen_at": r.seen_at.isoformat(), "seen_by": r.session,
                          "text": describe_reading(r.window, r.percent, r.resets_at)
                          + ("" if current else " (reset since)")})
    return shown


def quota_lines(v: dict) -> list[str]:
    """The status text's lines: "quota: claude-alice 5-hour window 95 %, resets 14:00 UTC",
    "window share (points): executor 5-hour 12.5, task t1 5-hour 12.5"."""
    lines: list[str] = []
    u = v["usage"]
    for q in v.get("quota", ()):
        lines.append(f"quota: {field(q['account'])} {printable(q['text'])}")
    points = {role: r["quota_points"] for role, r in u["by_role"].items()
              if r.get("quota_points")}
    if points or u.get("quota_by_task"):
        lines.append("window share (points): " + ", ".join(
            [f"{field(role)} " + " ".join(f"{window_name(w)} {p:g}" for w, p in ws.items())
             for role, ws in points.items()]
            + [f"task {field(t)} " + " ".join(f"{window_name(w)} {p:g}" for w, p in ws.items())
               for t, ws in u.get("quota_by_task", {}).items()]))
    return lines
