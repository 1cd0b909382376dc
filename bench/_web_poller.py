"""The web latency bench's baseline: the same `ralph web` server (engine.channels.web.serve),
woken by a fixed-interval poll instead of the file-system watcher.

    python bench/_web_poller.py WORKSPACE INTERVAL_SECONDS

Prints the server's first line (its URL), then serves until SIGTERM.
"""
from __future__ import annotations

import sys
import threading


def ticker(interval: float):
    """A stand-in for engine.mailbox.watch with its signature: it sets the wakeup every
    `interval` seconds whatever happened, and returns a function that stops it."""
    def watch(_paths, wakeup, _trees=()):
        stop = threading.Event()

        def tick():
            while not stop.wait(interval):
                wakeup.set()
        threading.Thread(target=tick, daemon=True).start()
        return stop.set
    return watch


def main() -> int:
    import signal

    from ralph.engine.channels.web import serve
    workspace, interval = sys.argv[1], float(sys.argv[2])
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return serve(workspace, "127.0.0.1", 0, watch=ticker(interval))


if __name__ == "__main__":
    sys.exit(main())
