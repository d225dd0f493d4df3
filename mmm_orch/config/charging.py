"""How a facility charges a job to its allocation, and the tool that tells what an allocation has
left: the `charging:` section of a machine profile (planning/cost.py prices plans with it,
records/balance.py asks the tool)."""

from __future__ import annotations

import math
from typing import Literal

from mmm_orch.config.common import AccountTemplated, Flag, Number, Walltime, config


@config
class Balance:
    """The facility's tool that tells a project's allocation and what remains of it."""

    # Its words ({account}: the project, checked as a plain name before it gets here).
    command: list[AccountTemplated]
    parser: Literal["sbank", "showusage"]  # records/balance.py PARSERS
    # Seconds to wait for the tool.
    timeout_s: Number = 20.0
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""

    def __post_init__(self) -> None:
        if not self.command or not self.command[0]:
            raise ValueError(
                f"balance.command {self.command!r}: at least one word, the first naming the tool"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"balance.timeout_s {self.timeout_s!r}: seconds, more than 0")


@config
class Charging:
    """How the facility charges a job to its allocation (planning/cost.py prices plans with it)."""

    # What the allocation is counted in.
    unit: str = "node-hours"
    # The machine's charge factor (NERSC's "system charge factor"): allocation units per node-hour.
    factor: Number = 1.0
    # The time charged: what the job used (elapsed), or what it asked for (walltime).
    charged_for: Literal["elapsed", "walltime"] = "elapsed"
    # Each job that started is charged at least this long (None: no minimum).
    minimum: Walltime | None = None
    # Nodes are allocated whole: spare nodes held for failover are charged like active ones.
    whole_nodes: Flag = True
    # Where the facility says so: its page (and date), or the live server's setting.
    source: str = ""
    # What else a user should know about charging.
    notes: str = ""
    # The tool that tells what an allocation has left (`mmm-orch balance`).
    balance: Balance | None = None

    def __post_init__(self) -> None:
        check_factor("charging.factor", self.factor)


def check_factor(field: str, value: float) -> None:
    """A charge factor prices every plan: a finite number, 0 or more (a NaN would pass every
    budget)."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{field} {value!r}: a number, 0 or more")
