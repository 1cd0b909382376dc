"""The one in-process agent of the tests: it plays scripted steps (sending their events
through the session's outbox, as `ralph emit` does) and records every invocation it got.

    agent = RecordingAgent([
        {"role": "planner", "emit": [("plan.ready", {"tasks": [{"id": "t1", "title": "T"}]})]},
        {"role": "executor", "task": "t1", "emit": [("build.done", "done!")]},
        {"role": "planner", "text": "all done\nLOOP_COMPLETE"},
    ], otherwise=SUCCEED)
    engine = Engine(session, Config(), agent_for=lambda role: agent, clock=clock,
                    out=io.StringIO())

A step (a dict; every key optional):
    role, task       which invocation plays it: the first unplayed step whose role (and
                     task, if given) match; a step without a role matches any role
    emit             [(topic, payload)] or [{"topic", "payload"}], appended in order
    write_iteration  {path: text} written under the run's iteration directory
    during           a callable(inv) run in the middle of the run (drop a signal, answer)
    stdout, text     what it printed, and its last words (RunReport.text)
    exit_code, stderr_tail, timed_out
    tokens           (input, output) it reports; cost_usd: the cost its CLI reports
    limit            a UsageLimit: the run ends on its CLI's usage limit (exit 1)
An invocation no step matches plays `otherwise`: EMPTY (nothing emitted, exit 0) or
SUCCEED (each role's success: planner LOOP_COMPLETE, executor build.done with evidence,
reviewer review.done; nothing for the others).

Before it returns, a run asks `should_stop()` once, as a backend does when it wakes: a
PAUSE or ABORT in the mailbox stops it (the outcome says so).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable


from ralph.engine.agents import Invocation, Outcome, RunReport
from ralph.engine.tools.emit import publish

from .scenarios import EVIDENCE, REVIEW_OK

EMPTY = "empty"
SUCCEED = "succeed"
SUCCESS = {"planner": [("LOOP_COMPLETE", "nothing left")],
           "executor": [("build.done", EVIDENCE)],
           "reviewer": [("review.done", REVIEW_OK)]}


@dataclass(slots=True)
class Played:
    """One invocation as the agent got it, and the step it played (None: `otherwise`)."""
    invocation: Invocation
    step: dict | None

    @property
    def role(self) -> str:
        return self.invocation.role

    @property
    def task(self) -> str | None:
        return self.invocation.env.get("RALPH_TASK_ID")

    @property
    def prompt(self) -> str:
        return self.invocation.prompt


class RecordingAgent:
    def __init__(self, steps=(), otherwise: str = EMPTY):
        self.steps: list[dict] = [dict(s) for s in steps]
        self.otherwise = otherwise
        self.played: list[Played] = []
        self._left = list(range(len(self.steps)))

    # --- what the tests read ---

    @property
    def invocations(self) -> list[Invocation]:
        return [p.invocation for p in self.played]

    def runs(self, role: str | None = None, task: str | None = None) -> list[Played]:
        return [p for p in self.played if role in (None, p.role) and task in (None, p.task)]

    def prompts(self, role: str | None = None, task: str | None = None) -> list[str]:
        return [p.prompt for p in self.runs(role, task)]

    @property
    def unplayed(self) -> list[dict]:
        return [self.steps[i] for i in self._left]

    # --- the agent ---

    def run(self, inv: Invocation, wakeup=None,
            should_stop: Callable[[], "str | None"] | None = None) -> Outcome:
        env = inv.env
        step = self._take(inv.role, env.get("RALPH_TASK_ID"))
        self.played.append(Played(inv, step))
        if step is None:
            step = {"emit": SUCCESS.get(inv.role, []) if self.otherwise == SUCCEED else []}
        for path, text in (step.get("write_iteration") or {}).items():
            target = os.path.join(env["RALPH_ITERATION_DIR"], path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as f:
                f.write(text)
        if step.get("during"):
            step["during"](inv)
        for item in step.get("emit") or []:
            topic, payload = (item["topic"], item.get("payload")) if isinstance(item, dict) \
                else item
            publish(env["RALPH_SESSION_DIR"], topic, payload, run=env["RALPH_RUN_ID"])
        stopped = should_stop() if should_stop is not None else None
        tokens = step.get("tokens", (0, 0))
        limit = step.get("limit")
        return Outcome(exit_code=None if stopped else 1 if limit else step.get("exit_code", 0),
                       timed_out=step.get("timed_out", False), stopped=stopped,
                       stdout=step.get("stdout", ""), stderr_tail=step.get("stderr_tail", ""),
                       report=RunReport(text=step.get("text", ""), input_tokens=tokens[0],
                                        output_tokens=tokens[1],
                                        cost_usd=step.get("cost_usd")),
                       limit=limit)

    def _take(self, role: str, task: str | None) -> dict | None:
        for n, i in enumerate(self._left):
            step = self.steps[i]
            if step.get("role") in (None, role) and step.get("task") in (None, task):
                del self._left[n]
                return step
        return None
