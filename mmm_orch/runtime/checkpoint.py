"""Distributed checkpoints with torch.distributed.checkpoint (DCP): every N steps, and when the
scheduler warns of the end (SIGTERM, or SIGUSR1 from `--signal`/`#PBS -l ...`), then resume.

Layout: <run_dir>/checkpoints/step-<N>/ (DCP shards of model and optimizer, plus train.json with
the step, the LR scheduler and anything else the trainer needs) and a `latest` file naming the
newest complete one. A checkpoint is renamed into place only once every rank has written it.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from mmm_orch.injob import protocol, runfiles
from mmm_orch.injob.protocol import CHECKPOINT_EVENT, EXIT_CHECKPOINTED
from mmm_orch.injob.runfiles import RunFileError
from mmm_orch.pretrained.dcp_reader import CheckedReader
from mmm_orch.runtime import stop
from mmm_orch.runtime.dist import refuse

# The optimizer's state and settings keyed by parameter name ("state.layers.0.wq.weight.exp_avg",
# "param_groups.layers.0.wq.weight.lr"), not as lists of the rank's own parameters: a rank of a
# pipeline holds some layers, and a run saved on one layout loads on another.
BY_NAME = StateDictOptions(flatten_optimizer_state_dict=True)
# Checkpoints written before (mmm-orch up to 0.1.0 of 2026-11-26) hold the lists.
AS_LISTS = StateDictOptions()


class Checkpointer:
    def __init__(
        self,
        run_dir: Path,
        every: int,
        device: torch.device,
        is_main: bool,
        keep: int = 0,
        async_save: bool = False,
    ):
        """`async_save`: the periodic saves write in the background while training goes on
        (the stop signal's save, and the last, are waited for)."""
        self.run_dir = run_dir
        self.root = run_dir / protocol.CHECKPOINTS_DIR
        self.every, self.device, self.is_main, self.keep = every, device, is_main, keep
        self.stopped = False
        self.last_save_s = 0.0
        self.pending: _Pending | None = None  # an async save still writing
        # A group of its own: the background writer's collectives never meet training's.
        self.writers = dist.new_group(backend="gloo") if async_save else None
        stop.catch()  # the trainers' entry points catch earlier; this covers any other caller

    def stop_requested(self) -> bool:
        """True on every rank once any rank got a stop signal (one tiny all-reduce per step)."""
        flag = torch.tensor([1 if stop.received() else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        train_state: dict[str, Any],
        wait: bool = True,
    ) -> _Pending:
        """Write step `step`'s checkpoint; unless `wait` (and with async saves), return while
        it is still being written: `complete` renames it into place once every rank is done."""
        self.wait_pending()
        started = time.perf_counter()
        final = self.root / protocol.checkpoint_name(step)
        staging = self.root / f".{final.name}.partial"
        if self.is_main:
            shutil.rmtree(staging, ignore_errors=True)
        dist.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer, options=BY_NAME)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        background = self.writers is not None and not wait
        future = _async_save(state, staging, self.writers) if background else None
        pending = _Pending(step, staging, final, started, 0.0, future)
        if future is not None:  # the write's own end, not the step at which it is found done
            future.add_done_callback(lambda _: setattr(pending, "written_at", time.perf_counter()))
        else:
            dcp.save(state, checkpoint_id=str(staging))
        # Each rank's random state (dropout masks), so that a resumed run draws what the run
        # would have drawn had it not stopped.
        staging.mkdir(parents=True, exist_ok=True)
        torch.save(_rng_state(), staging / f"rng-{dist.get_rank()}.pt")
        if self.is_main:
            (staging / "train.json").write_text(json.dumps({"step": step, **train_state}))
        pending.blocking_s = time.perf_counter() - started
        return pending

    def complete(self, pending: _Pending) -> Path:
        """Every rank's part written (waited for): the checkpoint renamed into place and named
        the latest, older ones pruned."""
        if pending.future is not None:
            pending.future.result()
        written = pending.written_at or time.perf_counter()
        dist.barrier()
        if self.is_main:
            shutil.rmtree(pending.final, ignore_errors=True)
            pending.staging.rename(pending.final)
            protocol.point_latest(self.run_dir, pending.step)
            self._prune(pending.step)
        dist.barrier()
        # The whole save: its write, and for a waited one the renaming; the margin learns it.
        self.last_save_s = (
            written if pending.future is not None else time.perf_counter()
        ) - pending.started
        return pending.final

    def wait_pending(self, logger: Any = None) -> None:
        """Finish the async save in flight, if any (before another save, and at the end)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._completed(pending, logger)

    def _completed(self, pending: _Pending, logger: Any) -> None:
        path = self.complete(pending)
        if logger is not None:
            # save_s, the whole save: the watchdog keeps its pre-walltime margin at least twice
            # the last one; blocking_s: what training waited for.
            logger.event(
                CHECKPOINT_EVENT,
                step=pending.step,
                path=str(path),
                save_s=self.last_save_s,
                blocking_s=pending.blocking_s,
                reason=pending.reason,
            )

    def _prune(self, newest: int) -> None:
        """Keep the newest `keep` complete checkpoints (`latest` names the newest: never pruned)."""
        for stale in self.root.glob(".step-*.partial"):  # a save a crash cut short
            shutil.rmtree(stale, ignore_errors=True)
        if self.keep <= 0:
            return
        steps = sorted(
            step
            for path in self.root.iterdir()
            if (step := protocol.checkpoint_step(path.name)) is not None
        )
        for step in steps[: -self.keep]:
            if step != newest:
                shutil.rmtree(self.root / protocol.checkpoint_name(step), ignore_errors=True)

    def after_step(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        train_state: dict[str, Any],
        logger: Any,
    ) -> bool:
        """Save when due or when a stop signal arrived; True when the run must stop now. An
        async save is completed once every rank has written its part (asked each step)."""
        stop = self.stop_requested()
        # (the same answers on every rank, so _all_written's collective runs on all or none)
        if self.pending is not None and (self.due(step) or stop or self._all_written()):
            self.wait_pending(logger)
        if self.due(step) or stop:
            pending = self.save(step, model, optimizer, train_state, wait=stop)
            pending.reason = "signal" if stop else "every"
            if pending.future is None:
                self._completed(pending, logger)
            else:
                self.pending = pending
        self.stopped = stop
        return stop

    def _all_written(self) -> bool:
        assert self.pending is not None and self.pending.future is not None
        done = torch.tensor([1 if self.pending.future.done() else 0], device=self.device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        return bool(done.item())

    def exit_code(self, step: int, last_step: int) -> int:
        """0 when the run reached its last step; EXIT_CHECKPOINTED when it stopped on a signal
        before that, having saved (the job can be continued with --resume)."""
        return EXIT_CHECKPOINTED if self.stopped and step < last_step else 0

    def restore(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        resume: bool,
        allow_fresh: bool,
    ) -> dict[str, Any] | None:
        """With `resume`, the latest checkpoint's train state (model and optimizer restored in
        place); a run asked to resume that has nothing to resume from stops with exit 2, unless
        `allow_fresh` lets it start from step 0."""
        if not resume:
            return None
        try:
            state = self.load_latest(model, optimizer)
        except RunFileError as exc:  # every rank reads the same `latest`
            refuse(self.is_main, "runtime", f"--resume: {exc}")
        if state is None and not allow_fresh:
            refuse(
                self.is_main,
                "runtime",
                f"--resume: no checkpoint in {self.root}; name the "
                "run to continue with --run-name, or pass --allow-fresh to start from step 0",
            )
        return state

    def load_latest(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any] | None:
        """Restore model and optimizer in place; returns train.json's content, or None.
        RunFileError when `latest` names no complete checkpoint of the run."""
        step = runfiles.latest_step(self.run_dir)
        if step is None:
            return None
        path = self.root / protocol.checkpoint_name(step)
        train = runfiles.read_small(path / "train.json", 1 << 20)
        if train is None:
            raise RunFileError(f"{path} has no train.json: not a complete checkpoint")
        train_state = _train_state(path / "train.json", train)
        reader = CheckedReader(path)
        saved = reader.read_metadata().state_dict_metadata
        options = AS_LISTS if "optim.param_groups.0.params" in saved else BY_NAME
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, storage_reader=reader)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=options,
        )
        rng = path / f"rng-{dist.get_rank()}.pt"
        if rng.exists():  # a run resumed on another number of ranks starts its draws afresh
            _set_rng_state(torch.load(rng, weights_only=True))
        return train_state


def _train_state(file: Path, text: bytes) -> dict[str, Any]:
    """train.json's object, whose step is a step; RunFileError (one line) for anything else."""
    try:
        state = json.loads(text)
    except (ValueError, RecursionError):
        state = None
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise RunFileError(f"{file} is not the train state the trainer writes (a step and more)")
    return state


@dataclass
class _Pending:
    """A save begun: where it is written, when it began, how long training waited for it."""

    step: int
    staging: Path
    final: Path
    started: float
    blocking_s: float
    future: Future[Any] | None  # dcp.async_save's; None for a save waited for
    reason: str = "every"
    written_at: float = 0.0  # when the background write ended (perf_counter)


def _async_save(
    state: dict[str, Any], staging: Path, group: dist.ProcessGroup | None
) -> Future[Any]:
    """dcp.async_save's future. Without an async_stager (none is passed) it is a plain Future;
    its AsyncSaveResponse comes only with one."""
    future = dcp.async_save(state, checkpoint_id=str(staging), process_group=group)
    assert isinstance(future, Future)
    return future


_ACCELERATORS = ("cuda", "xpu")  # the device types whose generators draw dropout masks there


def _rng_state() -> dict[str, torch.Tensor]:
    """The CPU generator's state and that of every accelerator in use (CUDA/ROCm, XPU)."""
    state = {"cpu": torch.get_rng_state()}
    for kind in _ACCELERATORS:
        module = getattr(torch, kind, None)
        if module is not None and module.is_available() and module.is_initialized():
            state[kind] = module.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    for kind in _ACCELERATORS:
        module = getattr(torch, kind, None)
        if kind in state and module is not None and module.is_available():
            module.set_rng_state(state[kind])
