"""Stragglers while a run trains: every few steps each rank times a short matrix product on its own
device and the ranks gather the figures. A rank below a fraction of the others' median for a
number of checks in a row is named: `[mmm-orch] straggler:` in the log (rank, node, how much
slower), and STRAGGLERS_FILE in the run's directory, which `mmm-orch status` reads.

Not the step time: in a synchronous step the collectives make every rank wait for the slowest, so
every rank's step takes as long, and the step time says that the job is slow but not which rank
is. Each rank's own product, timed alone, says which.

With `leave` (and a spare to take its place), the ranks save a checkpoint and stop together
(every rank reaches the same verdict from the same gathered figures), and failover relaunches
without that node from the checkpoint. The job script sets the watch up (STRAGGLERS_VAR):
"EVERY,CHECKS,OF_MEDIAN,ACTION".
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from mmm_orch.injob import protocol
from mmm_orch.runtime.dist import Runtime

PROBE_S = 0.05  # each window of a check's products on each rank
WINDOWS = 2  # the check's figure is its best window: a moment a busy host starved it is no slowness
SIZE = {"cpu": 128}  # the product's side; a device's: 1024 (bf16)


@dataclasses.dataclass(frozen=True)
class Settings:
    every: int  # steps between two checks
    checks: int  # below the threshold this many checks in a row: a straggler
    of_median: float
    leave: bool  # checkpoint and stop so that failover relaunches without it

    @classmethod
    def from_env(cls) -> Settings | None:
        text = os.environ.get(protocol.STRAGGLERS_VAR, "")
        try:
            every, checks, of_median, action = text.split(",")
            return cls(int(every), int(checks), float(of_median), action == "leave")
        except ValueError:
            return None  # not set (one node, off, a run outside mmm-orch's jobs)


def probe(device: torch.device, seconds: float = PROBE_S) -> float:
    """GFLOP/s of this rank's matrix products over `seconds`."""
    n = SIZE.get(device.type, 1024)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    a = torch.full((n, n), 0.5, device=device, dtype=dtype)  # (no random draw: the run's own
    # random state, which a resumed run's losses depend on, stays untouched)
    products, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        b = a @ a
        products += 1
        if device.type != "cpu":
            b.sum().item()  # (synchronises: the product has run)
    return 2 * n**3 * products / elapsed / 1e9


class Strikes:
    """Each rank's checks in a row below the threshold: the verdict, from the gathered figures."""

    def __init__(self, world: int, settings: Settings):
        self.settings = settings
        self.strikes = [0] * world
        self.since: list[int | None] = [None] * world  # the first check of the current run

    def add(self, figures: list[float], step: int) -> tuple[int, float] | None:
        """A rank that has now been below the threshold for `checks` checks in a row, with its
        figure over the others' median (None: none)."""
        found = None
        for rank, figure in enumerate(figures):
            others = statistics.median(f for r, f in enumerate(figures) if r != rank)
            if others > 0 and figure < self.settings.of_median * others:
                self.strikes[rank] += 1
                self.since[rank] = self.since[rank] or step
            else:
                self.strikes[rank], self.since[rank] = 0, None
            if found is None and self.strikes[rank] == self.settings.checks:
                found = (rank, figure / others)
        return found


class Watch:
    """The checks of one run, on every rank alike."""

    def __init__(self, rt: Runtime, settings: Settings, run_dir: Path):
        self.rt, self.settings, self.run_dir = rt, settings, run_dir
        nodes: list[str] = [""] * rt.world_size
        dist.all_gather_object(nodes, rt.hostname)
        self.nodes = nodes
        self.strikes = Strikes(rt.world_size, settings)

    def after(self, step: int) -> str | None:
        """At a check's step: the node of a rank found a straggler now (None: none, or no
        check); every rank returns the same."""
        if step % self.settings.every:
            return None
        best = max(probe(self.rt.device.torch) for _ in range(WINDOWS))
        mine = torch.tensor([best], device=self.rt.device.torch)
        gathered = [torch.zeros_like(mine) for _ in range(self.rt.world_size)]
        dist.all_gather(gathered, mine)
        found = self.strikes.add([float(t.item()) for t in gathered], step)
        if found is None:
            return None
        rank, ratio = found
        if self.rt.is_main:
            self._say(rank, ratio, step)
        return self.nodes[rank]

    def _say(self, rank: int, ratio: float, step: int) -> None:
        node, since = self.nodes[rank], self.strikes.since[rank]
        text = (
            f" rank {rank} on {node}: its matrix products at {ratio:.1%} of the other ranks' "
            f"median for {self.settings.checks} checks (steps {since}-{step})"
        )
        if self.settings.leave:
            text += f"; {protocol.STRAGGLER_LEAVING} {node}: saving, then relaunching without it"
        print(protocol.STRAGGLER + text, flush=True)
        found = {"rank": rank, "node": node, "of_median": ratio, "since": since, "step": step}
        protocol.write_atomically(
            self.run_dir / protocol.STRAGGLERS_FILE, json.dumps({"stragglers": [found]})
        )
