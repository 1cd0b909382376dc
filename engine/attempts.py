"""Running a role until it reaches an outcome (seed 002's loop for one piece of work).

A blocked outcome (the agent's own, or a gate's rewrite) goes back to the same role
with the reason; three in a row abandon the work (thrashing). A run that emits no
outcome gets a `task.resume` retry; after three retries without progress (four runs)
the work ends without one.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

MAX_BLOCKED = 3
MAX_RESUMES = 3


class Verdict(NamedTuple):
    kind: str              # done | failed | thrashing | no_progress | timed_out
    event: dict | None     # the outcome event, when there is one
    reason: str | None


class Streaks(NamedTuple):
    blocked: int = 0
    empty: int = 0


def run_until_outcome(engine, role: str, task, pending: list[dict], *, done: tuple[str, ...],
                      failed: tuple[str, ...] = (), blocked: str | None = None,
                      streaks: Streaks = Streaks(),
                      after_each: Callable | None = None) -> Verdict:
    """Run `role` until an outcome; `after_each(run, attempt_outcome)` records each attempt
    (attempt_outcome: done | failed | blocked | empty | asked | timed_out)."""
    blocked_streak, empty_streak = streaks
    while True:
        run = engine.run_role(role, task, pending)
        final = run.last(*done, *failed, *((blocked,) if blocked else ()))
        if final is None and run.outcome.timed_out:
            verdict, attempt = Verdict("timed_out", None, f"the {role} timed out"), "timed_out"
        elif final is None and run.last("human.interact"):
            # it asked a human: the answer (or the timeout) is its next prompt's news
            verdict, attempt, pending = None, "asked", []
        elif final is None:
            empty_streak, blocked_streak, attempt = empty_streak + 1, 0, "empty"
            verdict = None
            if empty_streak > MAX_RESUMES:
                exit_note = f" (last exit code {run.outcome.exit_code})" if run.outcome.exit_code \
                    else ""
                verdict = Verdict("no_progress", None, f"no outcome after {MAX_RESUMES} "
                                  f"task.resume retries{exit_note}")
            else:
                pending = [engine.publish("task.resume", {
                    "role": role, "task": task.id if task else None, "retry": empty_streak,
                    "why": f"the {role}'s run emitted no outcome "
                           f"({' / '.join(done + failed)})"})]
        elif final["topic"] in done:
            verdict, attempt = Verdict("done", final, None), "done"
        elif final["topic"] in failed:
            verdict, attempt = Verdict("failed", final, f"{final['topic']}: "
                                       f"{_reason(final)}"), "failed"
        else:
            blocked_streak, empty_streak, attempt = blocked_streak + 1, 0, "blocked"
            verdict = None
            if blocked_streak >= MAX_BLOCKED:
                verdict = Verdict("thrashing", final, f"abandoned after {MAX_BLOCKED} "
                                  f"consecutive {blocked}: {_reason(final)}")
            else:
                pending = [final]
        if after_each:
            after_each(run, attempt)
        if verdict is not None:
            return verdict


def _reason(event: dict) -> str:
    payload = event.get("payload")
    if isinstance(payload, dict) and "reason" in payload:
        return str(payload["reason"])
    return str(payload)
