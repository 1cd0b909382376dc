"""Bench 19: what reading the usage windows costs a run (engine/policy/quota.py, issue 34).

Per agent run the engine now reads its output for the windows (Claude Code's
`rate_limit_event`: `claude_quota`), and before each run reads the account's readings
(`Session.quota`); a run whose window changed writes one (`record_quota`, a flock and a
durable write in the state directory). Figures: the parse of a 1 MiB stream-json log
(the most the engine keeps of a run's stdout in view: session_store/_runlog.py) against
the parse the preset already made of it (`Claude.report`, the baseline); the pace check
(read + rule) and a recorded reading, on the file store. Median of N each.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from datetime import datetime, timezone

from _common import Row, median, ms, ratio, say


def _log(size: int) -> str:
    """A stream-json log of about `size` bytes: assistant lines, a rate_limit_event every
    50 lines, a result line."""
    reset = int(time.time()) + 3600
    lines, n = [], 0
    while sum(map(len, lines)) < size:
        n += 1
        if n % 50 == 0:
            lines.append(json.dumps({"type": "rate_limit_event", "rate_limit_info": {
                "status": "allowed_warning", "resetsAt": reset, "rateLimitType": "five_hour",
                "utilization": 0.9 + n / 1e7, "surpassedThreshold": 0.9}}))
        else:
            lines.append(json.dumps({"type": "assistant", "message": {
                "id": f"m{n}", "content": [{"type": "text", "text": "x" * 300}],
                "usage": {"input_tokens": 10, "output_tokens": 5}}}))
    lines.append(json.dumps({"type": "result", "result": "done", "usage": {}}))
    return "\n".join(lines)


def _timed(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return median(times)


def run(base: str, runs: int = 50) -> list[Row]:
    from ralph.engine.agents.preset import RunEnd
    from ralph.engine.agents.presets import Claude
    from ralph.engine.agents.quota_readers import claude_quota
    from ralph.engine.config_types import Quota
    from ralph.engine.policy.quota import blocking
    from ralph.session_store import QuotaReading
    from ralph.session_store._quota import read_account, record_reading

    say(f"quota: the windows read from a 1 MiB log, the pace check and a recorded reading, "
        f"median of {runs}")
    stdout = _log(1 << 20)
    now = datetime.now(timezone.utc)
    end = RunEnd(stdout, "", 0, now)
    assert claude_quota(end), "the log says no window"
    parse = _timed(lambda: claude_quota(end), runs)
    report = _timed(lambda: Claude().report(stdout), runs)
    state = tempfile.mkdtemp(prefix="ralph-bench-quota-", dir=base)
    old = os.environ.get("RALPH_STATE_DIR")
    os.environ["RALPH_STATE_DIR"] = state
    try:
        seen = claude_quota(end)[0]
        counter = iter(range(10**9))

        def record():
            record_reading("bench", QuotaReading(
                window=seen.window, percent=seen.percent, resets_at=seen.resets_at,
                seen_at=datetime.fromtimestamp(now.timestamp() + next(counter), timezone.utc),
                agent="claude"))
        record()
        recorded = _timed(record, runs)
        pace = _timed(lambda: blocking(read_account("bench"), Quota(), now), runs)
    finally:
        if old is None:
            os.environ.pop("RALPH_STATE_DIR", None)
        else:
            os.environ["RALPH_STATE_DIR"] = old
    return [
        Row("quota", "windows read from a 1 MiB run log (per run)", ms(parse, 2), ms(report, 2),
            ratio(parse, report), "baseline: the preset's parse of the same log "
            "(tokens, cost, final text)"),
        Row("quota", "pace check before a run (read the account, the rule)", ms(pace, 3)),
        Row("quota", "a changed window recorded (flock, durable write)", ms(recorded, 3)),
    ]
