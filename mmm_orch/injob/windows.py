"""Which steps and ranks a run profiles (`--profile-steps A:B`, `--profile-ranks 0,4`): read
the same way by the trainers and user code (runtime/profiling.py) and by planning, which
refuses a window or a rank the run does not have before the queue. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SKIP = 2  # steps left out first by default (start-up, compile, the first gathers)
DEFAULT_STEPS = 3  # steps profiled by default


@dataclass(frozen=True)
class Window:
    first: int
    last: int

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step <= self.last


def window(text: str, last_step: int) -> Window:
    """The steps `--profile-steps A:B` names (both included), or by default 3 steps after the
    first 2 (fewer in a shorter run). ValueError naming the value and what it may be."""
    if not text:
        first = min(DEFAULT_SKIP + 1, last_step)
        return Window(first, min(first + DEFAULT_STEPS - 1, last_step))
    start, sep, end = text.partition(":")
    try:
        chosen = Window(int(start), int(end)) if sep else Window(int(start), int(start))
    except ValueError:
        chosen = None
    if chosen is None or not 1 <= chosen.first <= chosen.last <= last_step:
        raise ValueError(
            f"--profile-steps {text!r}: expected A:B, steps of this run with "
            f"1 <= A <= B <= {last_step}"
        )
    return chosen


def ranks(text: str, world_size: int) -> frozenset[int] | None:
    """The ranks `--profile-ranks` names (comma-separated), or None: local rank 0 of each node.
    ValueError for a rank the run does not have, or one named twice."""
    if not text:
        return None
    words = text.split(",")
    # ASCII digits only: int() would also read " 1", "+1", "1_0" and other scripts' digits
    chosen = frozenset(int(w) for w in words if w.isascii() and w.isdigit() and len(w) <= 9)
    if len(chosen) != len(words) or max(chosen) >= world_size:
        raise ValueError(
            f"--profile-ranks {text!r}: expected ranks of this run, comma-separated, each once, "
            f"from 0 to {world_size - 1}"
        )
    return chosen
