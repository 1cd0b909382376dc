"""PAUSED: nothing runs; the session waits, resumable, for `ralph session resume`."""
from __future__ import annotations


def run(engine) -> None:
    o = engine.metadata.orchestrator
    engine.say(f"paused in {o.previous_state}: {o.pause_reason}")
    engine.say(f"resume with: ralph session resume {engine.session.id}"
               + (" --max-iterations N (or --max-runtime S / --max-cost USD)"
                  if o.pause_kind and o.pause_kind.value == "limit" else ""))
