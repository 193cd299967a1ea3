"""What a long command is doing, on stderr: the stage, how far it is, the time so far and an
estimate of the time left, from the first seconds. On a terminal one line rewritten in place;
elsewhere a line every few seconds. ``gdpo audit`` sets the fraction done; ``gdpo limits``
steps once per case of a table group (``progress(name, total)`` returns the step)."""

from __future__ import annotations

import sys
import time
from typing import Callable


class Progress:
    def __init__(self, enabled: bool = True, tool: str = "audit"):
        self.stream, self.enabled, self.tool = sys.stderr, enabled, tool
        self.live = enabled and self.stream.isatty()
        self.t0 = self.stage_t0 = time.monotonic()
        self.stage, self.last = "", 0.0

    def start(self, stage: str) -> None:
        self.stage, self.stage_t0 = stage, time.monotonic()
        self.update(0.0, force=True)

    def update(self, fraction: float, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < (0.5 if self.live else 5.0) and fraction < 1.0):
            return
        self.last, spent = now, now - self.stage_t0
        left = f", about {spent * (1 - fraction) / fraction:.0f} s left" if 0.0 < fraction < 1.0 and spent > 1 else ""
        self._write(f"[{self.tool}] {self.stage}: {100 * fraction:.0f}% ({now - self.t0:.0f} s in all{left})")

    def done(self) -> None:
        if self.enabled:
            self._write(f"[{self.tool}] done in {time.monotonic() - self.t0:.1f} s", end=True)

    def _write(self, line: str, end: bool = False) -> None:
        self.stream.write(("\r" + line.ljust(78) + ("\n" if end else "")) if self.live else line + "\n")
        self.stream.flush()

    def __call__(self, stage: str, total: int) -> Callable[[], None]:
        """Start ``stage`` of ``total`` steps; the function to call after each."""
        self.start(stage)
        done = [0]

        def step() -> None:
            done[0] += 1
            self.update(done[0] / max(total, 1), force=done[0] == total)
        return step
