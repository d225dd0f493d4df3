"""The warning that a job must stop (SIGTERM from the scheduler or a cancel; SIGUSR1 from Slurm's
`--signal` or the watchdog before the walltime), caught from a trainer's first lines.

Python's default for both is to die. A warning that comes while the ranks still load torch or
build the model (seconds here, minutes at scale) would then end the job with nothing saved, and a
chain link that resumed would show no progress. Caught early, it is kept: the run does its first
step, saves and exits 75 like any stopped run. No torch here, so that catching comes first.
"""

from __future__ import annotations

import signal
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received: int | None = None


def catch() -> None:
    """Remember a stop signal from now on (again: harmless; a signal already kept stays)."""
    for signum in SIGNALS:
        signal.signal(signum, _remember)


def _remember(signum: int, _frame: Any) -> None:
    global _received
    _received = signum


def received() -> int | None:
    """The stop signal this process got, if any."""
    return _received


def request(signum: int = signal.SIGUSR1) -> None:
    """Stop as if the warning had come (the straggler watch leaving a node: save and stop)."""
    global _received
    _received = _received or signum
