"""The driver: run the current state's work, fire the trigger it returns, repeat until
COMPLETE or PAUSED. The Engine is the machine's model, so hooks reach it as event.model.
"""
from __future__ import annotations

import json
import os
import sys
import threading

import attrs

from session_store import (IterationMetadata, PauseKind, PlannedTask, Session, Status,
                           progress, read_events, signals)
from states import State, work_for

from . import blockers, fallback, gates, hooks, humans, mailbox, prompt, telegram_bot
from .agents import Invocation, Outcome, make_agent
from .clock import SystemClock
from .console import Console
from .config import Config
from .driver_types import Next, Preempted
from .machine import build_machine

__all__ = ["Engine", "Next", "Preempted", "RoleRun"]


@attrs.define
class RoleRun:
    """One agent invocation as the engine saw it: how the process ended, what it emitted."""
    role: str
    outcome: Outcome
    events: list[dict]

    def last(self, *topics: str) -> dict | None:
        for e in reversed(self.events):
            if e["topic"] in topics:
                return e
        return None


class Engine:
    def __init__(self, session: Session, config: Config, *, clock=None, agent_for=None,
                 out=None):
        self.session = session
        self.config = config
        self.clock = clock or SystemClock()
        self.agent_for = agent_for or (lambda role: make_agent(config.agent_for(role)))
        self.console = Console(out or sys.stdout, self.clock, status=self.status_line)
        self._activity = ""
        self._last_mono = self.clock.monotonic()
        self._bus_offset = 0
        self._iteration: tuple[int, IterationMetadata, list] | None = None
        self.wakeup = threading.Event()   # set by the mailbox watcher and by agents exiting
        self._stopping: Next | None = None
        self._last_run_ended: float | None = None
        self.skip_cooldown = False   # set when a human answered: the next run starts at once
        self._gate_notes: dict[str, list[dict]] = {}   # role -> what the gates did to its run
        self.current_task: PlannedTask | None = None     # the task an agent works on now
        self.latest_outcome: str | None = None           # the last build/verify evidence seen
        self.question_states: dict[str, str] = {}  # qid -> settled | timed_out (humans.py)
        build_machine(self, session.metadata.orchestrator.state,
                      before_state_change=hooks.BEFORE_STATE_CHANGE,
                      after_state_change=hooks.AFTER_STATE_CHANGE,
                      paused_from=lambda event: event.model.metadata.orchestrator.previous_state)

    # --- the loop ---

    @property
    def metadata(self):
        return self.session.metadata

    @property
    def current(self) -> State:
        return State(self.state)  # `state` is set by the transitions Machine

    def run(self, resume: bool = False) -> int:
        self.console.start()
        stop_watching = mailbox.watch([os.path.join(self.session.dir, "answers"),
                                       os.path.join(self.session.dir, "questions")], self.wakeup,
                                      trees=[os.path.join(self.session.dir, "signals")])
        stop_bot = telegram_bot.start_for_engine(self)   # a no-op unless Telegram is on
        try:
            self.reconcile()
            humans.recover(self)
            pending = mailbox.recover(self)
            if pending is not None:
                self.fire(pending)
            elif resume and self.current is State.PAUSED:
                humans.note_resumed(self)
                self._fire_preemptible(Next("resume", "ralph session resume"))
            while self.current not in (State.COMPLETE, State.PAUSED):
                limit = self.limit_reached()
                if limit:
                    self.fire(Next("pause", limit, PauseKind.LIMIT))
                    break
                try:
                    nxt = work_for(self.current)(self)
                except Preempted as p:
                    nxt = p.next
                self._fire_preemptible(nxt)
            work_for(self.current)(self)  # PAUSED / COMPLETE: their closing work
        finally:
            stop_bot()
            stop_watching()
            self.console.stop()
        return self.exit_code()

    def _fire_preemptible(self, nxt: Next) -> None:
        """Fire, unless the transition's hooks take a PAUSE or ABORT: then fire that."""
        try:
            self.fire(nxt)
        except Preempted as p:
            self.fire(p.next)

    def fire(self, nxt: Next) -> None:
        kwargs = {"reason": nxt.reason, "signal": nxt.signal}
        if nxt.kind is not None:
            kwargs["kind"] = nxt.kind
        before = self.current
        self.trigger(nxt.trigger, **kwargs)
        if nxt.signal is not None:
            mailbox.mark_applied(self, nxt.signal, nxt.trigger)
        self.say(f"{before} -> {self.current} ({nxt.trigger}"
                 f"{': ' + nxt.reason if nxt.reason else ''})")

    def exit_code(self) -> int:
        m = self.metadata
        if m.status is Status.ABORTED:
            return 4
        if m.status is Status.PAUSED:
            return 5 if m.orchestrator.pause_kind is PauseKind.LIMIT else 3
        return 0

    def limit_reached(self) -> str | None:
        m, limits = self.metadata, self.metadata.limits
        if self.current is State.PLANNING and m.iteration > limits.max_iterations:
            return f"max_iterations reached ({limits.max_iterations})"
        if m.usage.runtime_seconds >= limits.max_runtime_seconds:
            return f"max_runtime_seconds reached ({limits.max_runtime_seconds:g})"
        if limits.max_cost_usd is not None and m.usage.cost_usd >= limits.max_cost_usd:
            return f"max_cost_usd reached ({limits.max_cost_usd:g})"
        return None

    # --- persistence ---

    def save(self) -> None:
        """Persist metadata: usage, the session's task counts, a new revision."""
        mono = self.clock.monotonic()
        self.metadata.usage.runtime_seconds = round(
            self.metadata.usage.runtime_seconds + (mono - self._last_mono), 3)
        self._last_mono = mono
        if self._iteration is not None and self._iteration[0] == self.metadata.iteration:
            self._count_tasks()
        self.session.save(self.clock.now())

    def _count_tasks(self) -> None:
        _, meta, lines = self._iteration
        counts = self.metadata.tasks
        before = meta.tasks_before
        done = sum(t.marker == progress.DONE for t in lines)
        failed = sum(t.marker == progress.FAILED for t in lines)
        counts.total = before.total + len(lines)
        counts.completed = before.completed + done
        counts.failed = before.failed + failed
        counts.pending = before.pending + sum(t.marker not in progress.FINISHED for t in lines)

    def record_transition(self, lt) -> None:
        self.session.append_event(
            "session.transition",
            {"n": lt.n, "from": lt.source.value, "to": lt.dest.value, "trigger": lt.trigger,
             "reason": lt.reason, "at": lt.at.isoformat()},
            ts=lt.at.isoformat())
        # the state's work is recorded: guidance delivered to it is done with
        signals.forget_delivered(self.session.dir)

    def reconcile(self) -> None:
        """After a crash between persisting metadata and recording the transition, the
        record is missing: append it, once. Also moves the bus offset to its end."""
        records, self._bus_offset = read_events(self.session.dir, 0)
        lt = self.metadata.orchestrator.last_transition
        recorded = max((r["payload"].get("n", 0) for r in records
                        if r["topic"] == "session.transition" and isinstance(r["payload"], dict)),
                       default=0)
        if lt is not None and recorded < lt.n:
            self.record_transition(lt)
            self._read_new_events()

    def _read_new_events(self) -> list[dict]:
        records, self._bus_offset = read_events(self.session.dir, self._bus_offset)
        return records

    # --- the current iteration ---

    def iteration(self):
        """(Iteration files, its metadata): created on first use, cached while current."""
        number = self.metadata.iteration
        it = self.session.iteration(number)
        if self._iteration is None or self._iteration[0] != number:
            if it.exists():
                meta = it.load()
            else:
                # tasks_before goes in the creating write: a crash between two writes
                # left an iteration whose session counts restarted from zero
                meta = it.create(self.clock.now(), tasks_before=attrs.evolve(self.metadata.tasks))
            self._iteration = (number, meta, it.progress())
        return it, self._iteration[1]

    def save_iteration(self, meta: IterationMetadata) -> None:
        it, _ = self.iteration()
        it.save(meta)

    def tasks(self) -> list:
        self.iteration()
        return self._iteration[2]

    def marker(self, task_id: str) -> str:
        return next((t.marker for t in self.tasks() if t.id == task_id), progress.TODO)

    def record_plan(self, tasks: list[PlannedTask], plan_text: str) -> None:
        it, meta = self.iteration()
        for t in tasks:
            it.write(f"tasks/{t.id}.md", f"# {t.id}: {t.title}\n\nBatch {t.batch}\n\n"
                                         f"{t.description}\n", "task")
        it.write("plan.md", plan_text, "plan")
        lines = [progress.TaskLine(t.id, t.title, t.batch) for t in tasks]
        it.save_progress(lines)
        self._iteration = (self._iteration[0], meta, lines)
        meta.tasks_defined = tasks
        meta.planning_completed_at = self.clock.now()
        it.save(meta)  # the commit point: planning is done once this is on disk
        self.save()

    def set_marker(self, task_id: str, marker: str, note: str | None = None) -> None:
        it, _ = self.iteration()
        for t in self.tasks():
            if t.id == task_id:
                t.marker, t.note = marker, note
        it.save_progress(self.tasks())
        if marker == progress.DONE:
            fallback.task_completed(self)
        self.save()

    def finish_iteration(self) -> None:
        it, meta = self.iteration()
        if meta.completed_at is None:
            meta.completed_at = self.clock.now()
            it.save(meta)

    # --- agents ---

    def run_role(self, role: str, task: PlannedTask | None = None,
                 pending: list[dict] | None = None) -> RoleRun:
        """One agent invocation. Its events come back gated (engine/gates.py)."""
        limit = self.limit_reached()
        if limit:
            raise Preempted(Next("pause", limit, PauseKind.LIMIT))
        self.hold_for_human()  # no agent runs while the loop waits for a human
        self._cool_down()
        self.current_task = task
        it, _ = self.iteration()
        self._read_new_events()
        self.metadata.usage.agent_invocations += 1
        self.save()  # durable before the run, so log names never collide after a crash
        seq = self.metadata.usage.agent_invocations
        name = f"{role}-{task.id}" if task else role
        attempt = 1 + sum(1 for f in os.listdir(it.path("logs"))
                          if f.endswith(f"-{name}.stdout"))
        env = {k: v for k, v in os.environ.items()   # agents never see the bot token
               if not k.startswith("RALPH_TEST_") and k != telegram_bot.TOKEN_ENV}
        env.update({
            "RALPH_WORKSPACE": self.session.workspace, "RALPH_SESSION_ID": self.session.id,
            "RALPH_SESSION_DIR": self.session.dir, "RALPH_ROLE": role,
            "RALPH_ITERATION": str(it.number), "RALPH_ITERATION_DIR": it.dir,
            "RALPH_STATE": self.current.value, "RALPH_ATTEMPT": str(attempt)})
        if task:
            env["RALPH_TASK_ID"] = task.id
        else:
            env.pop("RALPH_TASK_ID", None)
        role_config = getattr(self.config.roles, role)
        unit = f"{it.number}/{role}/{task.id if task else ''}"
        guidance = self.guidance_for(role, unit)
        pending = list(pending or [])
        carried = [e for e in self._gate_notes.pop(role, []) if e not in pending]
        human_events = [{"topic": g["topic"], "payload": g["message"]}
                        for g in guidance if g.get("topic")]
        text = prompt.build(self.metadata.objective, role, role_config.instructions,
                            guidance=[g["message"] for g in guidance if not g.get("topic")],
                            pending_events=human_events + carried + pending)
        inv = Invocation(role=role, prompt=text, env=env, cwd=self.session.workspace,
                         log_base=it.path("logs", f"{seq:04d}-{name}"),
                         timeout=self.config.agent_for(role).timeout_seconds)
        it.write(os.path.relpath(inv.log_base + ".prompt.md", it.dir), text, "prompt")
        self._activity = f"{role}{' ' + task.id if task else ''} (attempt {attempt})"
        self.say(f"{self.current} iteration {it.number}: {self._activity}")
        self._stopping = None
        outcome = self.agent_for(role).run(inv, self.wakeup, self._stop_requested)
        self._last_run_ended = self.clock.monotonic()
        if outcome.stopped and self._stopping.trigger == mailbox.RERUN:
            self.say(f"priority STEER: {role}{' ' + task.id if task else ''} runs again now")
            self.skip_cooldown = True
            return self.run_role(role, task, pending)
        if outcome.stopped:
            raise Preempted(self._stopping)
        signals.delivered(self.session.dir, [g["id"] for g in guidance], to=unit)
        emitted = [e for e in self._read_new_events() if e.get("source") != "engine"]
        if gates.COMPLETION not in {e["topic"] for e in emitted} and any(
                line.strip() == gates.COMPLETION for line in outcome.stdout.splitlines()):
            # a LOOP_COMPLETE line on stdout counts as the event, emitted last
            emitted.append(self.session.append_event(gates.COMPLETION, "stdout", source=role))
        self._account_cost(emitted, outcome.stdout)
        judged = self._gate(emitted, role, task)
        fallback.observe_run(self, emitted, judged, outcome)
        self.latest_outcome = next((f"{e['topic']}: {e['payload']}" for e in reversed(judged)
                                    if e["topic"].startswith(("build.", "verify."))),
                                   self.latest_outcome)
        self.save()
        blockers.record(self, emitted)
        interact = next((e for e in reversed(emitted) if e["topic"] == "human.interact"), None)
        if interact is not None:
            humans.ask_from_event(self, interact, role, task)
        return RoleRun(role, outcome, judged)

    def publish(self, topic: str, payload, source: str = "engine") -> dict:
        """An event the engine injects: through the same gate as an agent's."""
        gated, reason, _warning = gates.judge(topic, payload)
        if reason:
            payload = {"reason": reason, "rewritten_from": topic, "payload": payload}
        record = self.session.append_event(gated, payload, source=source)
        self._read_new_events()
        return record

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
            self._read_new_events()
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
            self.metadata.usage.cost_usd = round(self.metadata.usage.cost_usd + spent, 6)
            self.save()

    def _cool_down(self) -> None:
        """cooldown_delay_seconds between agent runs, skipped right after a human answer;
        the mailbox is still heard meanwhile."""
        delay = self.config.event_loop.cooldown_delay_seconds
        if self._last_run_ended is None or delay <= 0 or self.skip_cooldown:
            self.skip_cooldown = False
            return
        end = self._last_run_ended + delay
        while (left := end - self.clock.monotonic()) > 0:
            self.wakeup.wait(left)
            self.wakeup.clear()
            self.checkpoint()

    # --- signals (DESIGN §6) ---

    def poll_signals(self, requested: str) -> None:
        mailbox.poll(self, "resume" if requested == "resume" else "transition")

    def checkpoint(self, mode: str = "checkpoint") -> None:
        """Between tasks, between reviews, while waiting: take what the mailbox holds."""
        mailbox.poll(self, mode)

    def _stop_requested(self) -> str | None:
        self._stopping = mailbox.poll(self, "agent")
        return self._stopping.reason if self._stopping else None

    def guidance_for(self, role: str, unit: str | None = None) -> list[dict]:
        """Queued STEER/INFO (and human responses) for this role or for all, not delivered
        yet, or delivered to an earlier run of this same unit of work: a run a crash cut
        short, or whose outcome a crash lost, gets them again. They leave the queue at the
        next transition (signals.forget_delivered)."""
        return [g for g in signals.guidance(self.session.dir) if g["target"] in ("all", role)
                and g.get("delivered_to") in (None, unit)]

    def add_resume_message(self, text: str) -> None:
        signals.drop(self.session.dir, "INFO", text, now=self.clock.now())

    def wait(self, deadline) -> None:
        """Sleep until `deadline` (a datetime) or until the watcher wakes us."""
        seconds = (deadline - self.clock.now()).total_seconds()
        if seconds > 0:
            self.wakeup.wait(seconds)
        self.wakeup.clear()

    # --- humans (DESIGN §7) ---

    def hold_for_human(self) -> None:
        """Hold while the loop's human question is pending (DESIGN §7)."""
        humans.hold(self)

    def assess_confidence(self) -> None:
        """Seed 004's assessor; when a trigger fires it asks the human for help."""
        fallback.check(self)

    def abort_cleanup(self) -> None:
        """Seed 001 §3.4: [/] tasks become [F], the iteration gets completed_at; nothing is
        reverted."""
        self._mark_in_progress(progress.FAILED, "Aborted by signal")
        self.finish_iteration()

    def note_in_progress(self, note: str) -> None:
        """A PAUSE leaves [/] tasks as they are (they run again on resume), with a note."""
        self._mark_in_progress(progress.IN_PROGRESS, note)

    def _mark_in_progress(self, marker: str, note: str) -> None:
        it, _ = self.iteration()
        changed = [t for t in self.tasks() if t.marker == progress.IN_PROGRESS]
        for t in changed:
            t.marker, t.note = marker, note
        if changed:
            it.save_progress(self.tasks())

    # --- output ---

    def say(self, text: str) -> None:
        self.console.say(text)

    def status_line(self) -> str:
        m = self.metadata
        tasks = self._iteration[2] if self._iteration else []
        finished = sum(t.marker in progress.FINISHED for t in tasks)
        return (f"{self.current} · iteration {m.iteration} · task {finished} of {len(tasks)} done"
                f"{' · ' + self._activity if self._activity else ''}")


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
