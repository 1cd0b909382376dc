"""Running a role until it reaches an outcome (seed 002's loop for one piece of work).

A blocked outcome (the agent's own, or a gate's rewrite, even to a topic the role may
emit as its failure: a failing verify.passed becomes verify.failed) goes back to the
same role with the reason; three in a row abandon the work (thrashing). A run that emits no
outcome gets a `task.resume` retry; after three retries without progress (four runs)
the work ends without one.
"""
from __future__ import annotations

from ralph.states import Next
from ralph.states.context import AfterEach, Streaks, Verdict

MAX_BLOCKED = 3
MAX_RESUMES = 3


def run_until_outcome(runner, role: str, task, pending: list[dict], *, done: tuple[str, ...],
                      failed: tuple[str, ...] = (), blocked: str | None = None,
                      streaks: Streaks = Streaks(),
                      after_each: AfterEach | None = None) -> Verdict | Next:
    """Run `role` until an outcome; `after_each(run, attempt_outcome)` records each attempt
    (attempt_outcome: done | failed | blocked | empty | asked | timed_out). A decision that
    stops the work (a PAUSE, a limit) comes back as its Next."""
    blocked_streak, empty_streak = streaks
    while True:
        run = runner.run(role, task, pending)
        if isinstance(run, Next):
            return run
        final = run.last(*done, *failed, *((blocked,) if blocked else ()))
        if final is None and run.timed_out:
            verdict, attempt = Verdict("timed_out", None, f"the {role} timed out"), "timed_out"
        elif final is None and run.last("human.interact"):
            # it asked a human: the answer (or the timeout) is its next prompt's news
            verdict, attempt, pending = None, "asked", []
        elif final is None:
            empty_streak, blocked_streak, attempt = empty_streak + 1, 0, "empty"
            verdict = None
            if empty_streak > MAX_RESUMES:
                exit_note = f" (last exit code {run.exit_code}" + \
                    (f": {run.stderr_tail})" if run.stderr_tail else ")") if run.exit_code else ""
                verdict = Verdict("no_progress", None, f"no outcome after {MAX_RESUMES} "
                                  f"task.resume retries{exit_note}")
            else:
                pending = [runner.publish("task.resume", {
                    "role": role, "task": task.id if task else None, "retry": empty_streak,
                    "why": f"the {role}'s run emitted no outcome "
                           f"({' / '.join(done + failed)})"})]
        elif final["topic"] in done:
            verdict, attempt = Verdict("done", final, None), "done"
        elif final["topic"] in failed and "rewritten_from" not in final.get("gate", {}):
            verdict, attempt = Verdict("failed", final, f"{final['topic']}: "
                                       f"{_reason(final)}"), "failed"
        else:
            blocked_streak, empty_streak, attempt = blocked_streak + 1, 0, "blocked"
            verdict = None
            if blocked_streak >= MAX_BLOCKED:
                verdict = Verdict("thrashing", final, f"abandoned after {MAX_BLOCKED} "
                                  f"consecutive {final['topic']}: {_reason(final)}")
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
