"""The baseline of bench 9: `ralph bot run ...`, the bot as it is, except with the old
cadences: its outbox looks at every session of the workspace on a fixed 200 ms poll
(instead of being woken by the file watcher), and getUpdates long-polls 1 s at a time
(instead of 25 s). Run by telegram_latency.py:

    python _telegram_poller.py INTERVAL ralph-arguments...
"""
from __future__ import annotations

import sys
import threading


def main(interval: float, argv: list[str]) -> int:
    from ralph.engine import cli
    from ralph.engine.channels.telegram import inbox, outbox
    from ralph.session_store import list_ids

    class Polling:
        """In place of the watcher: every `interval`, every session is to be looked at."""

        def __init__(self, box):
            self._stop = threading.Event()
            threading.Thread(target=self._tick, args=(box,), name="poll", daemon=True).start()

        def _tick(self, box):
            while not self._stop.wait(interval):
                box._loop.call_soon_threadsafe(box.note_sessions, list_ids(box.ws))

        def add(self, _path):
            pass

        def __call__(self):
            self._stop.set()

    outbox.Outbox._start_watching = lambda self, _sessions: Polling(self)
    inbox.POLL_TIMEOUT = 1
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), sys.argv[2:]))
