"""The engine's side of the signals mailbox (seed 001 §2-§4, DESIGN §6).

`poll(engine, mode)` consumes what the engine owns right now, oldest first:
  - transition / checkpoint: everything but APPROVE/SKIP outside KNOWLEDGE_APPROVAL;
  - agent (an agent is running): only PAUSE and ABORT, which stop it, and a priority
    STEER, which stops it to run it again at once with the message;
  - resume: like transition, but a PAUSE that waited while paused is void;
  - knowledge (waiting in KNOWLEDGE_APPROVAL): APPROVE and SKIP too.
PAUSE and ABORT preempt the current work (raise Preempted, or return the Next in agent
mode); the signal is marked handled once the transition they caused is persisted,
which records the signal's name so a crash in between never applies it twice.
"""
from __future__ import annotations

import threading

from session_store import PauseKind, signals
from states import State

from .driver_types import Next, Preempted

HANDLED_BY = "Ralph-Orchestrator"
RERUN = "rerun"   # not a machine trigger: the agent run under way starts over


def poll(engine, mode: str) -> Next | None:
    d, now = engine.session.dir, engine.clock.now
    guidance = []  # STEER/INFO taken in this poll, applied together before anything else
    for name in signals.waiting(d):
        signal, reason, raw = signals.read(d, name)
        if signal is None:
            if reason:
                signals.reject(d, name, reason, raw, now=now())
            continue
        if signal.type in ("APPROVE", "SKIP"):
            if mode != "knowledge" or engine.current is not State.KNOWLEDGE_APPROVAL:
                continue  # state-specific: they wait in inputs/
            if signal.iteration is not None and signal.iteration != engine.metadata.iteration:
                signals.reject(d, name, f"stale: for iteration {signal.iteration}, the session "
                               f"is in iteration {engine.metadata.iteration}", raw, now=now())
                continue
        elif signal.type in ("STEER", "INFO") and mode == "agent" and not signal.priority:
            continue  # the agent may take these itself; the engine does at the next boundary
        if not signals.take(d, name):
            continue  # another consumer won the rename
        if signal.type in ("STEER", "INFO") and not (signal.priority and mode == "agent"):
            guidance.append(signal)
            continue
        queue_guidance(engine, guidance)  # in arrival order, before what comes next
        guidance = []
        nxt = handle(engine, signal, mode)
        if nxt is not None:
            if mode == "agent":
                return nxt
            raise Preempted(nxt)
    queue_guidance(engine, guidance)
    return None


def handle(engine, signal, mode: str) -> Next | None:
    """Act on a taken signal. PAUSE/ABORT return the Next to fire (marked after it);
    the others are applied and marked here. Idempotent by signal name."""
    d, now = engine.session.dir, engine.clock.now()
    if signal.type == "PAUSE" and (mode == "resume" or engine.current is State.PAUSED):
        action = "ignored: the session was paused already and is being resumed"
    elif signal.type in ("PAUSE", "ABORT"):
        if engine.current is State.COMPLETE:
            action = "ignored: the session is complete"
        else:
            trigger = "pause" if signal.type == "PAUSE" else "abort"
            return Next(trigger, signal.message or f"{signal.type} signal",
                        PauseKind.SIGNAL if trigger == "pause" else None, signal)
    elif signal.type == "STEER" and signal.priority and mode == "agent":
        # seed 004's priority message: stop the agent (it saves its partial work on
        # SIGTERM) and run the task again at once, with the message in its prompt
        queue_guidance(engine, [signal], action="interrupted the running agent to re-run "
                                                "it with the message")
        return Next(RERUN, signal.message)
    elif signal.type in ("STEER", "INFO"):
        queue_guidance(engine, [signal])
        return None
    else:
        action = decide_knowledge(engine, signal)
    signals.mark_handled(d, signal, handled_by=HANDLED_BY, action=action, now=now)
    return None


def queue_guidance(engine, taken: list, action: str | None = None) -> None:
    """STEER/INFO wait for their role's next prompt (guidance.yaml) and are noted in the
    scratchpad, a whole batch in one write of each; then each is marked handled. Both
    writes are idempotent by the signal's name, so a crash anywhere repeats nothing."""
    if not taken:
        return
    d, now = engine.session.dir, engine.clock.now()

    def who(signal):
        return signal.role.capitalize() if signal.role else "the next invocation of any role"
    signals.queue_guidance(d, *({"id": s.name, "type": s.type, "target": s.role or "all",
                                 "message": s.message, "at": now.isoformat()} for s in taken))
    engine.session.append_scratchpad(*(
        (f"- {now.isoformat(timespec='seconds')} {s.type} for {who(s)}: {s.message} ({s.name})",
         s.name) for s in taken))
    for s in taken:
        signals.mark_handled(d, s, handled_by=HANDLED_BY, now=now,
                             action=action or f"queued for {who(s)}")


def decide_knowledge(engine, signal) -> str:
    from states import knowledge_approval
    _it, meta = engine.iteration()
    if meta.knowledge_decided_by == signal.name:
        # it decided, then a crash came before it was marked: say what it did
        return _knowledge_action(meta)
    if engine.current is not State.KNOWLEDGE_APPROVAL or meta.knowledge_decision is not None:
        return "no effect: the knowledge of this iteration was decided already"
    if signal.type == "APPROVE":
        knowledge_approval.promote(engine, f"APPROVE signal: {signal.message}".rstrip(": "),
                                   by=signal.name)
    else:
        knowledge_approval.decide(engine, "skipped", by=signal.name)
    return _knowledge_action(meta)


def _knowledge_action(meta) -> str:
    if meta.knowledge_decision == "promoted":
        return f"promoted the staged knowledge of iteration {meta.iteration}"
    return f"kept the knowledge of iteration {meta.iteration} staged"


def mark_applied(engine, signal, trigger: str) -> None:
    signals.mark_handled(engine.session.dir, signal, handled_by=HANDLED_BY,
                         action="paused the session" if trigger == "pause"
                         else "aborted the session", now=engine.clock.now())


def recover(engine) -> Next | None:
    """Finish what a crash interrupted: rejections, and signals taken but not marked."""
    d = engine.session.dir
    signals.finish_rejections(d, engine.clock.now())
    pending = None
    for name in signals.taken_unmarked(d):
        signal = signals.read_taken(d, name)
        if signal is None:
            continue
        if signal.type in ("PAUSE", "ABORT") and engine.metadata.orchestrator.last_signal == name:
            mark_applied(engine, signal, "pause" if signal.type == "PAUSE" else "abort")
            continue
        nxt = handle(engine, signal, "knowledge")
        if nxt is not None and pending is None:
            pending = nxt
    return pending


def watch(paths: list[str], wakeup: threading.Event, trees: list[str] = ()):
    """Wake the engine when a file lands in one of `paths`, or anywhere under `trees`
    (inotify through watchdog; a polling observer where no watcher works). Returns a
    function that stops it.

    A file renamed out of a watched directory into an unwatched one leaves watchdog
    holding the move half-paired for 0.5 s, and every event behind it too: so the
    mailbox is watched as the whole `signals/` tree, where a take is one paired move."""
    import logging

    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    # watchdog logs a harmless race at shutdown as an error; nothing of it is ours to show
    logging.getLogger("watchdog").setLevel(logging.CRITICAL)

    class Wake(FileSystemEventHandler):
        def on_any_event(self, event):
            # watchdog also reports reads; waking on them made a waiting engine wake
            # itself with its own reads, at a full core
            if event.event_type not in ("opened", "closed_no_write"):
                wakeup.set()

    for make in (Observer, lambda: PollingObserver(timeout=0.1)):
        observer = make()
        try:
            for path in paths:
                observer.schedule(Wake(), path, recursive=False)
            for path in trees:
                observer.schedule(Wake(), path, recursive=True)
            observer.start()
        except Exception:
            continue
        def stop(observer=observer):
            observer.stop()
            observer.join(timeout=2)
        return stop
    return lambda: None
