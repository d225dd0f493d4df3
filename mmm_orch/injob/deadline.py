"""When the walltime is up: the one place that decides it. The watchdog asks the trainers to
save and stop before it (stop_due), failover starts no new attempt once too little is left
(spent), and the local executor's supervisor ends the job at it (passed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Less than this left (or the margin, if larger): no new attempt could reach a first step.
LEAST_FOR_AN_ATTEMPT = 30.0


@dataclass(frozen=True)
class Deadline:
    end: float  # on `clock`: the job's start plus its walltime
    margin: float = 0.0  # seconds before the end the trainers are asked to save and stop
    clock: Callable[[], float] = field(default=time.time, compare=False)

    @classmethod
    def after(
        cls, seconds: float, margin: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> Deadline:
        return cls(clock() + seconds, margin, clock)

    def left(self) -> float:
        return self.end - self.clock()

    def stop_margin(self, longest_save: float) -> float:
        """The margin, raised to twice the longest save seen: the scheduler's own SIGTERM comes
        only seconds before its SIGKILL, too late for a save."""
        return max(self.margin, 2 * longest_save)

    def stop_due(self, longest_save: float) -> bool:
        return self.left() <= self.stop_margin(longest_save)

    def spent(self) -> bool:
        return self.left() <= max(self.margin, LEAST_FOR_AN_ATTEMPT)

    def passed(self) -> bool:
        return self.left() <= 0
