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
import os
import threading
from typing import Callable, NamedTuple

from session_store import PauseKind, Session, State, signals
from states import Next, Trigger

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
    def _dir(self) -> str:
        return self.session.dir

    def poll(self, mode: Mode) -> Next | Rerun | None:
        d, now = self._dir, self.clock.now
        iteration = self.session.metadata.iteration
        guidance = []  # STEER/INFO taken in this poll, queued together before anything else
        for name in signals.waiting(d):
            signal, reason, raw = signals.read(d, name)
            if signal is None:
                if reason:
                    signals.reject(d, name, reason, raw, now=now())
                continue
            if signal.type in ("APPROVE", "SKIP"):
                if mode is not Mode.KNOWLEDGE or self._state() is not State.KNOWLEDGE_APPROVAL:
                    continue  # state-specific: they wait in inputs/
                if signal.iteration is not None and signal.iteration != iteration:
                    signals.reject(d, name, f"stale: for iteration {signal.iteration}, the "
                                   f"session is in iteration {iteration}", raw, now=now())
                    continue
            elif signal.type in ("STEER", "INFO") and mode is Mode.AGENT and not signal.priority:
                continue  # the agent may take these itself; the engine does at the next boundary
            if not signals.take(d, name):
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
        signals.mark_handled(self._dir, signal, handled_by=HANDLED_BY, action=action,
                             now=self.clock.now())
        return None

    def mark_applied(self, signal, trigger: Trigger) -> None:
        signals.mark_handled(self._dir, signal, handled_by=HANDLED_BY,
                             action="paused the session" if trigger is Trigger.PAUSE
                             else "aborted the session", now=self.clock.now())

    def recover(self) -> Next | None:
        """Finish what a crash interrupted: rejections, and signals taken but not marked."""
        d = self._dir
        signals.finish_rejections(d, self.clock.now())
        pending = None
        for name in signals.taken_unmarked(d):
            signal = signals.read_taken(d, name)
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
        d, taken, stops = self._dir, [], []
        for name in signals.waiting(d):
            signal, _reason, _raw = signals.read(d, name)
            if signal is None:
                continue   # the engine's next poll rejects it
            if signal.type in ("PAUSE", "ABORT"):
                stops.append({"type": signal.type, "message": signal.message, "file": name})
            elif signal.type in ("STEER", "INFO") and signal.role in (None, role) \
                    and signal.target != "Orchestrator" and signals.take(d, name):
                signals.mark_handled(d, signal, handled_by=f"Ralph-{role.capitalize()}",
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
        d, now = self._dir, self.clock.now()

        def who(signal):
            return signal.role.capitalize() if signal.role else "the next invocation of any role"
        signals.queue_guidance(d, *({"id": s.name, "type": s.type, "target": s.role or "all",
                                     "message": s.message, "at": now.isoformat()} for s in taken))
        self.session.append_scratchpad(*(
            (f"- {now.isoformat(timespec='seconds')} {s.type} for {who(s)}: {s.message} "
             f"({s.name})", s.name) for s in taken))
        for s in taken:
            signals.mark_handled(d, s, handled_by=HANDLED_BY, now=now,
                                 action=action or f"queued for {who(s)}")

    def queue_event(self, item_id: str, topic: str, payload: dict, *, role: str | None = None,
                    task: str | None = None) -> None:
        """An engine event (a human's response, a timeout) for the next prompt: of any
        role, or of `role` (on `task`) only."""
        signals.queue_guidance(self._dir, {"id": item_id, "type": "EVENT", "topic": topic,
                                           "target": role or "all", "task": task,
                                           "message": payload,
                                           "at": self.clock.now().isoformat()})

    def queue_note(self, item_id: str, text: str) -> None:
        """A note for the next prompt of any role, under ROBOT GUIDANCE."""
        signals.queue_guidance(self._dir, {"id": item_id, "type": "INFO", "target": "all",
                                           "message": text, "at": self.clock.now().isoformat()})

    def guidance_for(self, role: str, task: str | None, unit: str) -> list[dict]:
        """Queued STEER/INFO (and human responses) for this role or for all, not delivered
        yet, or delivered to an earlier run of this same unit of work: a run a crash cut
        short, or whose outcome a crash lost, gets them again. They leave the queue at the
        next transition (forget_delivered)."""
        return [g for g in signals.guidance(self._dir) if g["target"] in ("all", role)
                and g.get("task") in (None, task) and g.get("delivered_to") in (None, unit)]

    def delivered(self, ids: list[str], unit: str) -> None:
        signals.delivered(self._dir, ids, to=unit)

    def forget_delivered(self) -> None:
        signals.forget_delivered(self._dir)

    def add_message(self, text: str) -> None:
        """`resume --message`: an INFO signal for the next run."""
        signals.drop(self._dir, "INFO", text, now=self.clock.now())


def watch(paths: list[str], wakeup: threading.Event | None, trees: list[str] = (),
          notify: Callable[[str], None] | None = None, files: list[str] = ()) -> "Watching":
    """Wake the engine when a file lands in one of `paths`, or anywhere under `trees`
    (inotify through watchdog; a polling observer where no watcher works), or when one
    of `files` is written (inotify on the file alone; its directory where that fails).
    `notify`, if given, is called with every changed path (both of a move), from the
    watcher's thread. Returns a function that stops it (and whose `add` watches one more
    directory).

    A file renamed out of a watched directory into an unwatched one leaves watchdog
    holding the move half-paired for 0.5 s, and every event behind it too: so the
    mailbox is watched as the whole `signals/` tree, where a take is one paired move."""
    import logging

    from watchdog import events as ev
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    # watchdog logs a harmless race at shutdown as an error; nothing of it is ours to show
    logging.getLogger("watchdog").setLevel(logging.CRITICAL)

    # what wakes a watcher: writes. Opens and reads are left out at the kernel (inotify's
    # mask): waking on them made a waiting engine wake itself with its own reads, at a
    # full core, and even ignored they cost a trip through watchdog's threads each
    writes = [ev.FileCreatedEvent, ev.FileModifiedEvent, ev.FileDeletedEvent, ev.FileMovedEvent,
              ev.FileClosedEvent, ev.DirCreatedEvent, ev.DirModifiedEvent, ev.DirDeletedEvent,
              ev.DirMovedEvent]

    class Wake(ev.FileSystemEventHandler):
        def on_any_event(self, event):
            if notify is not None:
                notify(event.src_path)
                if event.dest_path:
                    notify(event.dest_path)
            if wakeup is not None:
                wakeup.set()

    file_watches, paths = [], list(paths)
    for path in files:
        file_watch = None
        if wakeup is not None and notify is None:   # paths to notify come from watchdog
            from .inotify import FileWatch
            try:
                file_watch = FileWatch(path, wakeup)
            except OSError:
                pass
        if file_watch is None:
            paths.append(os.path.dirname(path))   # every write beside it wakes too
            continue
        file_watch.start()
        file_watches.append(file_watch)
    problems = []
    for make in (Observer, lambda: PollingObserver(timeout=0.1)):
        observer = None
        try:
            observer = make()
            for path in paths:
                observer.schedule(Wake(), path, recursive=False, event_filter=writes)
            for path in trees:
                observer.schedule(Wake(), path, recursive=True, event_filter=writes)
            observer.start()
        except Exception as e:  # noqa: BLE001 - no watcher: say so, and poll instead
            problems.append(f"{type(e).__name__}: {e}")
            if observer is not None:   # what it started (inotify descriptors, threads)
                try:
                    observer.unschedule_all()
                    observer.stop()
                except Exception:  # noqa: BLE001
                    pass
            continue
        # inotify failing is said too, though watchdog's polling observer carries on
        return Watching(observer, Wake(), writes, file_watches,
                        failed="; ".join(problems) + " (watchdog polls instead)"
                        if problems else None)
    # never no wakeups: every second, as if everything watched had changed
    ticker = _Ticker([*paths, *trees], wakeup, notify)
    ticker.start()
    return Watching(ticker, None, writes, file_watches, failed="; ".join(problems))


class _Ticker(threading.Thread):
    """The fallback when no file-system watcher works: a wakeup every POLL_SECONDS."""

    POLL_SECONDS = 1.0

    def __init__(self, paths, wakeup, notify):
        super().__init__(name="watch-poll", daemon=True)
        self._paths, self._wakeup, self._notify = list(paths), wakeup, notify
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.POLL_SECONDS):
            for path in self._paths:
                if self._notify is not None:
                    self._notify(path)
            if self._wakeup is not None:
                self._wakeup.set()

    def schedule(self, handler, path, recursive=False, event_filter=None) -> None:
        self._paths.append(path)

    def stop(self) -> None:
        self._stopping.set()


class Watching:
    """A running watcher: calling it stops it; `add(path)` watches one more directory
    (not recursively), e.g. a session that appeared after it started."""

    def __init__(self, observer, handler, events, file_watches=(), failed: str | None = None):
        self._observer, self._handler, self._events = observer, handler, events
        self._file_watches = list(file_watches)
        self.failed = failed   # why no watcher works (then it polls every second)

    def add(self, path: str) -> None:
        if self._observer is not None:
            self._observer.schedule(self._handler, path, recursive=False,
                                    event_filter=self._events)

    def __call__(self) -> None:
        for file_watch in self._file_watches:
            file_watch.stop()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
