"""The baseline of bench 6: `ralph session start ARGS...`, the whole engine as it is, except
that a pending question is waited on by a fixed 250 ms poll instead of file-system events:
Engine.wait_until (the hold's sleep) sleeps to the next tick of a 250 ms grid
and ignores the watcher's wakeups. Run by answer_latency.py and idle_cpu.py:

    python _answer_poller.py INTERVAL ralph-arguments...
"""
from __future__ import annotations

import sys
import time


def main(interval: float, argv: list[str]) -> int:
    from ralph.engine import cli
    from ralph.engine.driver import Engine

    def polling_wait(self, deadline) -> None:
        seconds = (deadline - self.clock.now()).total_seconds()
        if seconds > 0:
            now = time.monotonic()
            tick = (int(now / interval) + 1) * interval
            time.sleep(min(seconds, tick - now))
        self.wakeup.clear()

    Engine.wait_until = polling_wait
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), sys.argv[2:]))
