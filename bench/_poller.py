"""The baseline of bench 3: the engine's own mailbox handling (Mailbox.poll at a checkpoint), woken
by a fixed 250 ms poll instead of file-system events. Run as a subprocess by
signal_latency.py: `python _poller.py WORKSPACE SESSION_ID INTERVAL`; stop it with SIGTERM.
"""
from __future__ import annotations

import io
import sys
import time


def main(workspace: str, session_id: str, interval: float) -> None:
    from ralph import session_store
    from ralph.engine.config import Config
    from ralph.engine.driver import Engine
    from ralph.engine.mailbox import Mode

    session = session_store.load(workspace, session_id)
    engine = Engine(session, Config(), agent_for=lambda role: None, out=io.StringIO())
    print("ready", flush=True)
    tick = time.monotonic()
    while True:
        engine.mailbox.poll(Mode.CHECKPOINT)
        tick += interval
        delay = tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            tick = time.monotonic()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
