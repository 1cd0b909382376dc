"""The agent runner: one role invocation, as a pipeline of one concern per step.

  admit    -> no run past a limit, none while a human question is pending, the cooldown
  prepare  -> the run's environment, guidance, prompt and log files
  execute  -> the backend runs it; PAUSE/ABORT stop it; a priority STEER starts it over
  collect  -> what it emitted (gated), its completion line, its cost
  observe  -> the observers (assessor, blocker ledger, human desk) see the result; the
              first that returns a decision (a pause) stops the work

Agents never see the bot token or the tests' variables.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Callable

import attrs

from session_store import PauseKind, PlannedTask, RunFiles, Session
from states import COMPLETION, Next, Trigger
from states.context import RoleRun

from . import gates, prompt
from .agents import Invocation, Outcome
from .mailbox import Mailbox, Mode, Rerun
from .tracker import Tracker

SECRET_ENV = ("RALPH_TELEGRAM_BOT_TOKEN",)


@attrs.define
class RunResult:
    """What the observers see of a run."""
    role: str
    task: PlannedTask | None
    emitted: list[dict]        # as the agent emitted them
    judged: list[dict]         # as the gates took them
    outcome: Outcome


Observer = Callable[[RunResult], "Next | None"]


@attrs.define
class _Prepared:
    invocation: Invocation
    guidance_ids: list[str]
    unit: str


class AgentRunner:
    def __init__(self, session: Session, tracker: Tracker, config, mailbox: Mailbox, *,
                 agent_for, admit: Callable[[], "Next | None"], wakeup: threading.Event,
                 say: Callable[[str], None], clock):
        self.session = session
        self.tracker = tracker
        self.config = config
        self.mailbox = mailbox
        self._agent_for = agent_for
        self._admit = admit            # limits, then the hold for a pending human question
        self.wakeup = wakeup
        self._say = say
        self.clock = clock
        self.observers: list[Observer] = []
        self.run_ended: list[Callable[[str], None]] = []   # each gets the run's unit of work
        self.woken: list[Callable[[], None]] = []   # run on every wakeup while an agent runs
        self.skip_cooldown = False     # a human answered: the next run starts at once
        self.current_task: PlannedTask | None = None
        self.latest_outcome: str | None = None    # the last build/verify evidence seen
        self.activity = ""
        self._gate_notes: dict[str, list[dict]] = {}   # role -> what the gates did to its run
        self._last_run_ended: float | None = None
        self._stopping: Next | Rerun | None = None
        self._bus = session.events_after(None)
        # what every run inherits: the engine's environment, less the secrets and the
        # tests' hooks (read once: os.environ decodes every item on each look)
        self._base_env = {k: v for k, v in os.environ.items()
                          if not k.startswith("RALPH_TEST_") and k not in SECRET_ENV}

    def run(self, role: str, task: PlannedTask | None = None,
            pending: list[dict] | None = None) -> RoleRun | Next:
        """One agent invocation (again at once after a priority STEER). Its events come
        back gated."""
        if stop := self._admit() or self._cool_down():
            return stop
        self.current_task = task
        while True:
            prepared = self._prepare(role, task, list(pending or []))
            outcome = self._execute(role, prepared.invocation)
            for ended in self.run_ended:
                ended(prepared.unit)
            if not outcome.stopped:
                break
            if isinstance(self._stopping, Rerun):
                self._say(f"priority STEER: {role}{' ' + task.id if task else ''} runs again now")
                continue
            return self._stopping
        self.mailbox.delivered(prepared.guidance_ids, prepared.unit)
        result = self._collect(role, task, outcome)
        decision = next((d for observe in self.observers if (d := observe(result))), None)
        if decision is not None:
            return decision
        return RoleRun(role, result.judged, outcome.exit_code, outcome.timed_out,
                       outcome.duration, outcome.stdout)

    def publish(self, topic: str, payload, source: str = "engine") -> dict:
        """An event the engine injects: through the same gate as an agent's."""
        gated, reason, _warning = gates.judge(topic, payload)
        if reason:
            payload = {"reason": reason, "rewritten_from": topic, "payload": payload}
        record = self.session.append_event(gated, payload, source=source)
        self._bus.read_new()
        return record

    # --- the steps ---

    def _cool_down(self) -> Next | None:
        """cooldown_delay_seconds between agent runs, skipped right after a human answer;
        the mailbox is still heard meanwhile."""
        delay = self.config.event_loop.cooldown_delay_seconds
        if self._last_run_ended is None or delay <= 0 or self.skip_cooldown:
            self.skip_cooldown = False
            return None
        end = self._last_run_ended + delay
        while (left := end - self.clock.monotonic()) > 0:
            self.wakeup.wait(left)
            self.wakeup.clear()
            if (stop := self.mailbox.poll(Mode.CHECKPOINT)) is not None:
                return stop
        return None

    def _prepare(self, role: str, task: PlannedTask | None, pending: list[dict]) -> _Prepared:
        it, _ = self.tracker.iteration()
        self._bus.read_new()   # what came before this run is not its output
        self.tracker.metadata.usage.agent_invocations += 1   # names its logs (see Tracker)
        seq = self.tracker.metadata.usage.agent_invocations
        name = f"{role}-{task.id}" if task else role
        attempt = 1 + it.runs_of(name)
        env = dict(self._base_env)
        env.update({
            "RALPH_WORKSPACE": self.session.workspace, "RALPH_SESSION_ID": self.session.id,
            "RALPH_SESSION_DIR": self.session.dir, "RALPH_ROLE": role,
            "RALPH_ITERATION": str(it.number), "RALPH_ITERATION_DIR": it.dir,
            "RALPH_STATE": self.tracker.state.value, "RALPH_ATTEMPT": str(attempt)})
        if task:
            env["RALPH_TASK_ID"] = task.id
        else:
            env.pop("RALPH_TASK_ID", None)
        unit = f"{it.number}/{role}/{task.id if task else ''}"
        guidance = self.mailbox.guidance_for(role, task.id if task else None, unit)
        carried = [e for e in self._gate_notes.pop(role, []) if e not in pending]
        human_events = [{"topic": g["topic"], "payload": g["message"]}
                        for g in guidance if g.get("topic")]
        text = prompt.build(self.tracker.metadata.objective, role,
                            getattr(self.config.roles, role).instructions,
                            guidance=[g["message"] for g in guidance if not g.get("topic")],
                            pending_events=human_events + carried + pending)
        files: RunFiles = it.run_files(seq, name)
        it.write_prompt(files, text)
        self.activity = f"{role}{' ' + task.id if task else ''} (attempt {attempt})"
        self._say(f"{self.tracker.state} iteration {it.number}: {self.activity}")
        return _Prepared(Invocation(role=role, prompt=text, env=env, cwd=self.session.workspace,
                                    log_base=files.base,
                                    timeout=self.config.agent_for(role).timeout_seconds),
                         [g["id"] for g in guidance], unit)

    def _execute(self, role: str, inv: Invocation) -> Outcome:
        self._stopping = None
        outcome = self._agent_for(role).run(inv, self.wakeup, self._stop_requested)
        self._last_run_ended = self.clock.monotonic()
        if outcome.stopped and isinstance(self._stopping, Rerun):
            self.skip_cooldown = True
        return outcome

    def _stop_requested(self) -> str | None:
        """Asked by the backend whenever it wakes: PAUSE / ABORT / a priority STEER."""
        for woken in self.woken:
            woken()
        self._stopping = self.mailbox.poll(Mode.AGENT)
        return self._stopping.reason if self._stopping else None

    def _collect(self, role: str, task: PlannedTask | None, outcome: Outcome) -> RunResult:
        emitted = [e for e in self._bus.read_new() if e.get("source") != "engine"]
        if COMPLETION not in {e["topic"] for e in emitted} and any(
                line.strip() == COMPLETION for line in outcome.stdout.splitlines()):
            # a LOOP_COMPLETE line on stdout counts as the event, emitted last
            emitted.append(self.session.append_event(COMPLETION, "stdout", source=role))
            self._bus.read_new()
        self._account_cost(emitted, outcome.stdout)
        judged = self._gate(emitted, role, task)
        self.latest_outcome = next((f"{e['topic']}: {e['payload']}" for e in reversed(judged)
                                    if e["topic"].startswith(("build.", "verify."))),
                                   self.latest_outcome)
        return RunResult(role, task, emitted, judged, outcome)

    def _gate(self, emitted: list[dict], role: str, task: PlannedTask | None) -> list[dict]:
        """Judge a run's events. Each rewrite or note is recorded on the bus and reaches the
        same role's next prompt, so the agent learns why."""
        judged = gates.judge_run(emitted)
        notes = []
        for event in judged:
            gate = event.get("gate")
            if gate and "rewritten_from" in gate:
                record = self.session.append_event(event["topic"], {
                    "reason": gate["reason"], "rewritten_from": gate["rewritten_from"],
                    "original_seq": event["seq"], "task": task.id if task else None})
                event["payload"] = record["payload"]
                notes.append(event)
            elif gate:
                notes.append(self.session.append_event("gate.note", {
                    **gate, "topic": event["topic"], "original_seq": event["seq"]}))
        if notes:
            self._gate_notes[role] = notes
            self._bus.read_new()
        return [e for e in judged if "ignored" not in e.get("gate", {})]

    def _account_cost(self, emitted: list[dict], stdout: str) -> None:
        """Cost from `cost` events ({"usd": N}) and from agents that report it (Claude's
        result line carries total_cost_usd)."""
        spent = 0.0
        for e in emitted:
            usd = e["payload"].get("usd") if e["topic"] == "cost" and \
                isinstance(e["payload"], dict) else None
            spent += _usd(usd)
        for line in stdout.splitlines():
            if '"total_cost_usd"' in line:
                try:
                    result = json.loads(line)
                except ValueError:
                    continue
                usd = result.get("total_cost_usd") if isinstance(result, dict) else None
                spent += _usd(usd)
        if spent:
            usage = self.tracker.metadata.usage
            usage.cost_usd = round(usage.cost_usd + spent, 6)


def _usd(value) -> float:
    """A reported cost as a number to add: 0 for anything but a finite non-negative
    number (an agent may report 10**400, 1e308 twice, "12" or -1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        usd = float(value)
    except OverflowError:
        return 0.0
    return usd if 0 <= usd < 1e12 else 0.0


def limit_reached(tracker: Tracker) -> Next | None:
    """max_iterations (at PLANNING), max_runtime_seconds, max_cost_usd: a pause, exit 5."""
    tracker.tick()
    m, limits = tracker.metadata, tracker.metadata.limits
    reason = None
    if tracker.state.value == "PLANNING" and m.iteration > limits.max_iterations:
        reason = f"max_iterations reached ({limits.max_iterations})"
    elif m.usage.runtime_seconds >= limits.max_runtime_seconds:
        reason = f"max_runtime_seconds reached ({limits.max_runtime_seconds:g})"
    elif limits.max_cost_usd is not None and m.usage.cost_usd >= limits.max_cost_usd:
        reason = f"max_cost_usd reached ({limits.max_cost_usd:g})"
    return Next(Trigger.PAUSE, reason, PauseKind.LIMIT) if reason else None
