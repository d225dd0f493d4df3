"""The one training loop every trainer runs (torchtitan's shape: a trainer builds its config, its
model and its parallelism, then hands them here). It restores the run's latest checkpoint when
asked to resume, runs the steps until the last one or a stop signal, logs each step, saves
checkpoints when due, and returns the exit code the job reads (0, or EXIT_CHECKPOINTED when
stopped before the last step, having saved)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mmm_orch.options.run import RunOptions
from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime import profiling, stop, stragglers
from mmm_orch.runtime.checkpoint import Checkpointer
from mmm_orch.runtime.dist import Runtime, refuse
from mmm_orch.runtime.loop import StepTimer
from mmm_orch.runtime.metrics import MetricLogger


class Training:
    """One run: its checkpoints, its metrics and its step timer, set up in that order. Built
    after the model and the optimizer (the checkpoint restores them in place): `step` is where
    the run goes on from, `restored` the rest of the saved train state ({} on a fresh run)."""

    def __init__(
        self,
        rt: Runtime,
        cfg: RunOptions,
        out: Path,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        async_save: bool = False,
        described: dict[str, Any] | None = None,
        *,
        last_step: int,
    ):
        """`described`: what the run's metrics header says beside its options and world size;
        `last_step`: the step the run ends at."""
        self.rt, self.model, self.optimizer, self.scheduler = rt, model, optimizer, scheduler
        self.last_step = last_step
        try:  # before anything of the run is written (every rank finds the same)
            self.profiler = profiling.profiler(
                cfg.profile, cfg.profile_steps, cfg.profile_ranks, last_step, out, rt
            )
        except ValueError as exc:
            refuse(rt.is_main, "runtime", str(exc))
        self.checkpointer = Checkpointer(
            out, cfg.checkpoint_every, rt.device.torch, rt.is_main, cfg.keep_checkpoints, async_save
        )
        self.restored = (
            self.checkpointer.restore(model, optimizer, cfg.resume, cfg.allow_fresh) or {}
        )
        self.step = self.restored.get("step", 0)
        if self.restored and scheduler is not None:
            scheduler.load_state_dict(self.restored["scheduler"])
        header = {**dataclasses.asdict(cfg), "world_size": rt.world_size, **(described or {})}
        self.logger = MetricLogger(out, header, enabled=rt.is_main, resumed_from=self.step)
        self.timer = StepTimer(rt)
        watching = stragglers.Settings.from_env() if rt.world_size > 1 else None
        self.stragglers = stragglers.Watch(rt, watching, out) if watching else None

    def run(
        self,
        train_step: Callable[[int], dict[str, Any]],
        train_state: Callable[[], dict[str, Any]] = dict,
        after_step: Callable[[int], None] = lambda step: None,
    ) -> int:
        """Steps up to the last: `train_step(N)` runs step N (starting the timer and
        stopping it) and returns what the step logs; `train_state()` is saved with each
        checkpoint beside the scheduler's; `after_step(N)` runs once step N is logged and the
        run goes on (a stop saves and ends the loop before it). The exit code."""
        profiler = self.profiler
        while self.step < self.last_step:
            self.step += 1
            if profiler is not None:
                profiler.begin(self.step)
            logged = train_step(self.step)
            if profiler is not None:
                profiler.end(self.step)
            self.logger.step(self.step, **logged)
            # (after() runs on every rank at every step: its checks are collectives)
            watch = self.stragglers
            if watch and watch.after(self.step) and watch.settings.leave:
                stop.request()  # save now and stop: failover goes on without that node
            state = {
                **({"scheduler": self.scheduler.state_dict()} if self.scheduler else {}),
                **train_state(),
            }
            if self.checkpointer.after_step(
                self.step, self.model, self.optimizer, state, self.logger
            ):
                break
            after_step(self.step)
        self.checkpointer.wait_pending(self.logger)
        self.logger.close()
        runtime_dist.teardown()
        return self.checkpointer.exit_code(self.step, self.last_step)
