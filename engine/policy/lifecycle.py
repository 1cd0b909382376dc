"""The engine's lifecycle events, each running its hooks (engine/policy/hooks.py) and saying what
a failure means for its step; docs/approvals-and-hooks.md has the table.

  session.start     each time an engine takes the session up (start, resume)
  iteration.start   before an iteration's first run, once per iteration
  plan.ready        pre: the planner's plan, judged as a gate would; post: accepted
  session.complete  pre: the planner's LOOP_COMPLETE, judged so; post: completed
  human.question    around the question's announcement (warn only)
  session.pause     before and after the session pauses (warn only)
  session.error     the engine stops on a fault: a disk, the store, an internal error
"""
from __future__ import annotations

from typing import Callable

from ralph.session_store import BadInput, PauseKind, Status
from ralph.states import COMPLETION, Next, Trigger

from ..config import OnError
from ..views import resume_command
from .hooks import Hooks


class LifecycleHooks:
    def __init__(self, hooks: Hooks, session, tracker, *, say: Callable[[str], None],
                 publish: Callable[[str, dict], dict]):
        self.hooks = hooks
        self.session = session
        self.tracker = tracker
        self._say = say
        self._publish = publish

    def start(self, resumed: bool) -> Next | None:
        """pre.session.start: a failing block hook refuses to run the session (exit 2, the
        session as it stood); a pause one pauses it. Then post.session.start."""
        payload = {"source": "resume" if resumed else "start"}
        failure = self.hooks.pre("session.start", payload)
        if failure is None:
            self.hooks.post("session.start", payload)
            return None
        if failure.on_error is OnError.BLOCK:
            raise BadInput(f"session {self.session.id} not run: refused by {failure.reason}; "
                           f"it is left as it stood: "
                           f"{resume_command(self.session.id, self.session.workspace)} "
                           f"once the hook passes")
        return Next(Trigger.PAUSE, failure.reason, PauseKind.HOOK)

    def iteration_start(self) -> Next | None:
        """pre.iteration.start before the iteration's first run (once per iteration, by
        its number), then post.iteration.start; a failing pause hook pauses first."""
        n = self.tracker.metadata.iteration
        failure = self.hooks.pre("iteration.start", {"iteration": n}, key=f"iteration:{n}")
        if failure is not None:
            return Next(Trigger.PAUSE, failure.reason, PauseKind.HOOK)
        self.hooks.post("iteration.start", {"iteration": n}, key=f"iteration:{n}")
        return None

    def judge_plan(self, result) -> Next | None:
        """pre.plan.ready and pre.session.complete judge the planner's outcome, as a gate
        does: block rewrites it to `plan.blocked` with the hook's reason (the planner plans
        again with it; three in a row pause the session), pause pauses the session."""
        if result.role != "planner":
            return None
        final = next((e for e in reversed(result.judged)
                      if e["topic"] in ("plan.ready", COMPLETION)), None)
        if final is None:
            return None
        event = "plan.ready" if final["topic"] == "plan.ready" else "session.complete"
        failure = self.hooks.pre(event, final.get("payload"), key=f"seq:{final['seq']}")
        if failure is None:
            return None
        if failure.on_error is OnError.PAUSE:
            return Next(Trigger.PAUSE, failure.reason, PauseKind.HOOK)
        record = self._publish("plan.blocked", {"reason": failure.reason,
                                               "rewritten_from": final["topic"],
                                               "original_seq": final["seq"]})
        final.update(topic=record["topic"], payload=record["payload"])
        return None

    def plan_accepted(self) -> None:
        """post.plan.ready: the plan is the iteration's, and its first batch is next."""
        if "post.plan.ready" not in self.hooks:
            return
        _, meta = self.tracker.iteration()
        tasks = [{"id": t.id, "title": t.title, "batch": t.batch} for t in meta.tasks_defined]
        self.hooks.post("plan.ready", {"iteration": meta.iteration, "tasks": tasks},
                        key=f"iteration:{self.tracker.metadata.iteration}")

    def question(self, phase: str, question) -> None:
        payload = {"id": question.id, "text": question.text, "kind": question.kind,
                   "options": list(question.options), "role": question.context.role,
                   "task": question.context.task, "deadline": question.deadline.isoformat()}
        run = self.hooks.pre if phase == "pre" else self.hooks.post
        run("human.question", payload, key=f"question:{question.id}")

    def pausing(self, nxt: Next) -> None:
        """pre.session.pause: the session is about to pause (warn only: a pause is never
        refused)."""
        self.hooks.pre("session.pause", {"reason": nxt.reason, "kind": (
            nxt.kind or PauseKind.SIGNAL).value, "from": self.tracker.state.value})

    def ended(self) -> None:
        """post.session.complete once the session completed, post.session.pause once per
        pause (by its transition's number)."""
        m, lt = self.tracker.metadata, self.tracker.metadata.orchestrator.last_transition
        if m.status is Status.COMPLETED:
            t = m.tasks
            self.hooks.post("session.complete", {
                "iterations": m.iteration, "tasks": {"total": t.total, "completed": t.completed,
                                                     "failed": t.failed}}, key="complete")
        elif m.status is Status.PAUSED and lt is not None:
            o = m.orchestrator
            self.hooks.post("session.pause", {"reason": o.pause_reason, "kind": (
                o.pause_kind.value if o.pause_kind else None),
                "from": o.previous_state.value if o.previous_state else None},
                key=f"transition:{lt.n}")

    def error(self, phase: str, why: str) -> None:
        """session.error: the engine stops on a fault (a disk, the store, an internal
        error); its hooks are told, as far as the fault lets them run and be recorded."""
        if f"{phase}.session.error" not in self.hooks:
            return
        try:
            (self.hooks.pre if phase == "pre" else self.hooks.post)("session.error",
                                                                      {"error": why})
        except Exception as e:   # the fault itself may stop them (a full disk)
            self._say(f"the {phase}.session.error hooks could not run: {e}")
