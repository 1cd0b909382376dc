"""What a running engine shows: on a terminal, a live line (state, iteration, task i of n,
elapsed) redrawn in place under the log lines; elsewhere, plain timestamped lines.

Only the console starts a line at its left edge, with the time: a message of several
lines (a question, a reason an agent wrote with newlines in it) goes on under it,
indented, with every control character escaped (engine/safe_text.py). So nothing an
agent wrote drives the terminal or passes for a line of ralph's own."""
from __future__ import annotations

import threading
import time

from .safe_text import printable

_STAMP = "[00:00:00] "   # the width of a line's time stamp, under which a message goes on


class Console:
    def __init__(self, out, clock, status=None):
        self.out = out
        self.clock = clock
        self.live = hasattr(out, "isatty") and out.isatty()
        self._status = status          # a callable returning the live line's text
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = None

    def start(self) -> None:
        if self.live and self._status is not None:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
            with self._lock:
                self.out.write("\r\x1b[K")
                self.out.flush()

    def say(self, text: str) -> None:
        stamp = self.clock.now().astimezone().strftime("%H:%M:%S")
        text = printable(text, lines=True).replace("\n", "\n" + " " * len(_STAMP))
        with self._lock:
            if self.live:
                self.out.write("\r\x1b[K")
            self.out.write(f"[{stamp}] {text}\n")
            if self._ticker is not None:
                self._draw()
            self.out.flush()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                self._draw()
                self.out.flush()

    def _draw(self) -> None:
        elapsed = int(time.monotonic() - self._started)
        try:
            line = self._status()
        except Exception:  # the line is cosmetic: never let it break the engine
            return
        self.out.write(f"\r\x1b[K\x1b[1m{printable(line)}\x1b[0m"
                       f" · {elapsed // 60}m{elapsed % 60:02d}s")
