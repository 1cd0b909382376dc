"""The agents' side of a request that waits for the engine's reply (a question, a poll,
an approval): a line in the run's outbox, then the reply the engine writes in the run's
inbox, which is only read here (it may be read-only to the run). Stdlib and the outbox
only: agents call it at every step boundary."""
from __future__ import annotations

import threading
import time

from ralph.session_store import RunOver, outbox

from .emit import hidden_run, run_id

ENGINE_CHECK_SECONDS = 5.0   # how often a wait makes sure an engine is there to reply


class Waiting:
    """A wait for a reply that another thread may end (the MCP server's: its call was
    cancelled, or the server is stopping)."""

    def __init__(self):
        self.woken = threading.Event()
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.woken.set()


def request(work_dir: str, kind: str, fields: dict, *, waiting: Waiting | None = None,
            patience: float | None = None) -> dict:
    """Send a request of this run to the engine and wait for its reply. RunOver when the
    engine will not take it (the run is over, no engine runs), refuses it, goes away, or
    gives no reply within `patience` seconds; KeyboardInterrupt when `waiting` is
    cancelled."""
    rid = outbox.new_request_id()
    run = run_id() or hidden_run()
    waiting = waiting or Waiting()
    if run is None:
        raise RunOver(f"{kind} refused: it names no run: requests come from agent runs only "
                      f"(RALPH_RUN_ID)")
    watch = outbox.inbox_watch(work_dir, run, waiting.woken)
    try:
        why = outbox.post(work_dir, {"kind": kind, "id": rid, "run": run, **fields})
        if why:
            raise RunOver(f"{kind} refused: {why}")
        give_up = None if patience is None else time.monotonic() + patience
        while True:
            reply = outbox.read_reply(work_dir, run, rid)
            if reply is not None:
                if "refused" in reply:
                    raise RunOver(f"{kind} refused: {reply['refused']}")
                return reply
            if waiting.cancelled:
                raise KeyboardInterrupt
            left = None if give_up is None else give_up - time.monotonic()
            if left is not None and left <= 0:
                raise RunOver(f"{kind}: the engine gave no reply in {patience:g} s")
            if not outbox.engine_alive(work_dir):
                raise RunOver(f"{kind}: no engine runs this session any more")
            step = ENGINE_CHECK_SECONDS if watch is not None else 0.05
            waiting.woken.wait(step if left is None else min(step, left))
            waiting.woken.clear()
    except KeyboardInterrupt:
        if kind == "ask":   # the asker stopped waiting (its call was cancelled, its run
            _forget(work_dir, rid, run)   # is being stopped): the question stays answerable
        raise
    finally:
        if watch is not None:
            watch.stop()


def _forget(work_dir: str, request_id: str, run: str | None) -> None:
    """Its answer goes to the next run of this unit of work."""
    try:
        outbox.post(work_dir, {"kind": "ask.gone", "id": request_id, "run": run})
    except OSError:
        pass
