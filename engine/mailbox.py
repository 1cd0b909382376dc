"""The engine's side of the signals mailbox (seed 001 §2-§4, DESIGN §6).

`Mailbox.poll(mode)` consumes what the engine owns right now, oldest first:
  - TRANSITION / CHECKPOINT: everything but APPROVE/SKIP outside KNOWLEDGE_APPROVAL;
  - AGENT (an agent is running): only PAUSE and ABORT, which stop it, and a priority
    STEER, which stops it to run it again at once with the message;
  - RESUME: like TRANSITION, but a PAUSE that waited while paused is void;
  - KNOWLEDGE (waiting in KNOWLEDGE_APPROVAL): APPROVE and SKIP too.
PAUSE and ABORT come back as the Next to fire: the signal is marked handled once the
transition it caused is persisted, which records the signal's name, so a crash in between
never applies it twice. STEER/INFO wait for their role's next prompt (guidance).
"""
from __future__ import annotations

import enum
from typing import Callable, NamedTuple

from ralph.session_store import PauseKind, Session, SessionSignals, State, signals
from ralph.states import Next, Trigger

HANDLED_BY = "Ralph-Orchestrator"


class Mode(enum.Enum):
    TRANSITION = "transition"
    CHECKPOINT = "checkpoint"
    AGENT = "agent"
    RESUME = "resume"
    KNOWLEDGE = "knowledge"


class Rerun(NamedTuple):
    """A priority STEER: the agent run under way starts over, with the message."""
    reason: str


class Mailbox:
    def __init__(self, session: Session, clock, *, state: Callable[[], State],
                 decide_knowledge: Callable[[signals.Signal], str]):
        self.session = session
        self.clock = clock
        self._state = state
        self._decide_knowledge = decide_knowledge   # APPROVE/SKIP -> the action taken

    @property
    def _box(self) -> SessionSignals:
        return self.session.signals

    def poll(self, mode: Mode) -> Next | Rerun | None:
        box, now = self._box, self.clock.now
        iteration = self.session.metadata.iteration
        guidance = []  # STEER/INFO taken in this poll, queued together before anything else
        for name in box.waiting():
            signal, reason, raw = box.read(name)
            if signal is None:
                if reason:
                    box.reject(name, reason, raw, now=now())
                continue
            if signal.type in ("APPROVE", "SKIP"):
                if mode is not Mode.KNOWLEDGE or self._state() is not State.KNOWLEDGE_APPROVAL:
                    continue  # state-specific: they wait in inputs/
                if signal.iteration is not None and signal.iteration != iteration:
                    box.reject(name, f"stale: for iteration {signal.iteration}, the "
                               f"session is in iteration {iteration}", raw, now=now())
                    continue
            elif signal.type in ("STEER", "INFO") and mode is Mode.AGENT and not signal.priority:
                continue  # the agent may take these itself; the engine does at the next boundary
            if not box.take(name):
                continue  # another consumer won the rename
            if signal.type in ("STEER", "INFO") and not (signal.priority and mode is Mode.AGENT):
                guidance.append(signal)
                continue
            self.queue_guidance(guidance)  # in arrival order, before what comes next
            guidance = []
            decision = self.handle(signal, mode)
            if decision is not None:
                return decision
        self.queue_guidance(guidance)
        return None

    def handle(self, signal, mode: Mode) -> Next | Rerun | None:
        """Act on a taken signal. PAUSE/ABORT return the Next to fire (marked after it);
        the others are applied and marked here. Idempotent by signal name."""
        state = self._state()
        if signal.type == "PAUSE" and signal.message:
            # what the human said when pausing is for the run that resumes, like --message
            self.queue_note(f"pause-{signal.name}", signal.message)
            self.session.append_scratchpad((
                f"- {self.clock.now().isoformat(timespec='seconds')} PAUSE: {signal.message} "
                f"({signal.name})", signal.name))
        if signal.type == "PAUSE" and (mode is Mode.RESUME or state is State.PAUSED):
            action = "ignored: the session was paused already and is being resumed"
        elif signal.type in ("PAUSE", "ABORT"):
            if state is State.COMPLETE:
                action = "ignored: the session is complete"
            elif signal.type == "PAUSE":
                return Next(Trigger.PAUSE, signal.message or "PAUSE signal", PauseKind.SIGNAL,
                            signal)
            else:
                return Next(Trigger.ABORT, signal.message or "ABORT signal", None, signal)
        elif signal.type == "STEER" and signal.priority and mode is Mode.AGENT:
            # seed 004's priority message: stop the agent (it saves its partial work on
            # SIGTERM) and run the task again at once, with the message in its prompt
            self.queue_guidance([signal], action="interrupted the running agent to re-run "
                                                 "it with the message")
            return Rerun(signal.message)
        elif signal.type in ("STEER", "INFO"):
            self.queue_guidance([signal])
            return None
        else:
            action = self._decide_knowledge(signal)
        self._box.mark_handled(signal, handled_by=HANDLED_BY, action=action,
                               now=self.clock.now())
        return None

    def mark_applied(self, signal, trigger: Trigger) -> None:
        self._box.mark_handled(signal, handled_by=HANDLED_BY,
                               action="paused the session" if trigger is Trigger.PAUSE
                               else "aborted the session", now=self.clock.now())

    def recover(self) -> Next | None:
        """Finish what a crash interrupted: rejections, and signals taken but not marked."""
        # not the store's `once`: a signal's record is its own file moving inputs/ ->
        # processed/ (DESIGN §6, which channels read), idempotent by name at each rename
        box = self._box
        box.finish_rejections(self.clock.now())
        pending = None
        for name in box.taken_unmarked():
            signal = box.read_taken(name)
            if signal is None:
                continue
            if signal.type in ("PAUSE", "ABORT") and \
                    self.session.metadata.orchestrator.last_signal == name:
                self.mark_applied(signal, Trigger.PAUSE if signal.type == "PAUSE"
                                  else Trigger.ABORT)
                continue
            decision = self.handle(signal, Mode.KNOWLEDGE)
            if isinstance(decision, Next) and pending is None:
                pending = decision
        return pending

    def take_for_role(self, role: str) -> dict:
        """An agent's step-boundary poll (its run's role; what it claims is not asked):
        the STEER/INFO waiting for that role or for all are taken and marked handled by
        it, oldest first; the PAUSE/ABORT the engine will act on are listed."""
        box, taken, stops = self._box, [], []
        for name in box.waiting():
            signal, _reason, _raw = box.read(name)
            if signal is None:
                continue   # the engine's next poll rejects it
            if signal.type in ("PAUSE", "ABORT"):
                stops.append({"type": signal.type, "message": signal.message, "file": name})
            elif signal.type in ("STEER", "INFO") and signal.role in (None, role) \
                    and signal.target != "Orchestrator" and box.take(name):
                box.mark_handled(signal, handled_by=f"Ralph-{role.capitalize()}",
                                 action=f"taken by the {role} at a step boundary",
                                 now=self.clock.now())
                taken.append({"type": signal.type, "message": signal.message, "file": name})
        return {"signals": taken, "engine_will_act_on": stops}

    # --- guidance: STEER/INFO and human responses waiting for a role's next prompt ---

    def queue_guidance(self, taken: list, action: str | None = None) -> None:
        """STEER/INFO wait for their role's next prompt (guidance) and are noted in the
        scratchpad, a whole batch in one write of each; then each is marked handled. Both
        writes are idempotent by the signal's name, so a crash anywhere repeats nothing."""
        if not taken:
            return
        box, now = self._box, self.clock.now()

        def who(signal):
            return signal.role.capitalize() if signal.role else "the next invocation of any role"
        box.queue_guidance(*({"id": s.name, "type": s.type, "target": s.role or "all",
                              "message": s.message, "at": now.isoformat()} for s in taken))
        self.session.append_scratchpad(*(
            (f"- {now.isoformat(timespec='seconds')} {s.type} for {who(s)}: {s.message} "
             f"({s.name})", s.name) for s in taken))
        for s in taken:
            box.mark_handled(s, handled_by=HANDLED_BY, now=now,
                             action=action or f"queued for {who(s)}")

    def queue_event(self, item_id: str, topic: str, payload: dict, *, role: str | None = None,
                    task: str | None = None) -> None:
        """An engine event (a human's response, a timeout) for the next prompt: of any
        role, or of `role` (on `task`) only."""
        self._box.queue_guidance({"id": item_id, "type": "EVENT", "topic": topic,
                                  "target": role or "all", "task": task, "message": payload,
                                  "at": self.clock.now().isoformat()})

    def queue_note(self, item_id: str, text: str) -> None:
        """A note for the next prompt of any role, under ROBOT GUIDANCE."""
        self._box.queue_guidance({"id": item_id, "type": "INFO", "target": "all",
                                  "message": text, "at": self.clock.now().isoformat()})

    def guidance_for(self, role: str, task: str | None, unit: str) -> list[dict]:
        """Queued STEER/INFO (and human responses) for this role or for all, not delivered
        yet, or delivered to an earlier run of this same unit of work: a run a crash cut
        short, or whose outcome a crash lost, gets them again. They leave the queue at the
        next transition (forget_delivered)."""
        # not the store's `once`: `delivered_to` routes an item to a re-run of the same unit
        # (it is delivered again, on purpose), and the effect is the prompt an agent reads
        return [g for g in self._box.guidance() if g["target"] in ("all", role)
                and g.get("task") in (None, task) and g.get("delivered_to") in (None, unit)]

    def delivered(self, ids: list[str], unit: str) -> None:
        self._box.delivered(ids, to=unit)

    def forget_delivered(self) -> None:
        self._box.forget_delivered()

    def add_message(self, text: str) -> None:
        """`resume --message`: an INFO signal for the next run."""
        self._box.drop("INFO", text, now=self.clock.now())
