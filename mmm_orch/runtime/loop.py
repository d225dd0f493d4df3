"""Pieces every training loop uses: step timing, LR schedule, meshes, loss averaging, run dirs."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from mmm_orch.injob import protocol, runfiles
from mmm_orch.runtime import profiling, run_claim
from mmm_orch.runtime.dist import Runtime, on_exit, refuse, refuse_if_main_says
from mmm_orch.runtime.profiling import region


class StepTimer:
    """dt (whole step), dtf (forward + loss), dtb (backward + optimizer), device-synchronised so
    the split is real on accelerators."""

    def __init__(self, rt: Runtime):
        self.sync = rt.device.synchronize

    def start(self) -> None:
        self.sync()
        profiling.step_opened()
        self.t0 = time.perf_counter()

    def forward_done(self) -> None:
        self.sync()
        self.t1 = time.perf_counter()

    def stop(self) -> dict[str, float]:
        self.sync()
        t2 = time.perf_counter()
        profiling.step_closed()
        return {"dt": t2 - self.t0, "dtf": self.t1 - self.t0, "dtb": t2 - self.t1}


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup: int, total: int, min_ratio: float = 0.1
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup` steps, then cosine decay to `min_ratio` of the peak at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def classifier_loss(
    model: torch.nn.Module, rt: Runtime, dtype: str, images: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """The cross-entropy of `model` on a batch of labelled images, its forward under autocast
    where the run computes in bf16."""
    with autocast(rt, dtype):
        logits = model(images.to(rt.device.torch))
    return torch.nn.functional.cross_entropy(logits.float(), labels.to(rt.device.torch))


def classifier_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    timer: StepTimer,
    rt: Runtime,
    dtype: str,
    images: torch.Tensor,
    labels: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float | None]]:
    """Forward, cross-entropy, backward and optimizer step on one batch of labelled images, after
    the caller started `timer`; returns this rank's loss and what the step logs: the loss's mean
    over the ranks, the times, samples/s of this rank and its memory peak."""
    with region("forward"):
        loss = classifier_loss(model, rt, dtype, images, labels)
    timer.forward_done()
    with region("backward"):
        loss.backward()
    with region("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    times = timer.stop()
    return loss, {
        "loss": mean_across(loss),
        **times,
        "samples_per_s": len(labels) / times["dt"],
        "mem_gib": rt.device.memory_gib(),
    }


def adamw(params, rt: Runtime, **options) -> torch.optim.AdamW:
    """AdamW, fused into one kernel per step on CUDA (torchtitan's default there; the foreach
    form reads and writes every parameter, gradient and moment in several passes)."""
    return torch.optim.AdamW(params, fused=rt.device.type == "cuda", **options)


def draw_per_rank(seed: int, rank: int) -> None:
    """Once the model is built from the seed every rank shares: each rank its own random stream
    from here on, so dropout masks differ across ranks as they do across the samples of one
    large batch; reproducible from the seed and the rank (and saved in checkpoints)."""
    torch.manual_seed(draw_seed(seed, rank))


def draw_seed(seed: int, rank: int) -> int:
    return seed * 1_000_003 + rank + 1


def mesh(rt: Runtime, tp: int = 1, pp: int = 1, cp: int = 1) -> DeviceMesh:
    """The (pp, dp, cp, tp) mesh: TP groups are consecutive ranks (inside a node), a sequence's
    context-parallel ranks next (their gathers of keys and values each layer), dp across them,
    and the pipeline's stages outermost (across nodes: one activation a micro-batch crosses)."""
    if rt.world_size % (tp * pp * cp):
        refuse(
            rt.is_main,
            "runtime",
            f"--tp {tp} x --pp {pp} x --cp {cp}: expected a divisor of the world size "
            f"{rt.world_size}",
        )
    return init_device_mesh(
        rt.device.type,
        (pp, rt.world_size // (tp * pp * cp), cp, tp),
        mesh_dim_names=("pp", "dp", "cp", "tp"),
    )


def data_parallel(world: DeviceMesh) -> DeviceMesh:
    """The ranks a model's gradients are averaged over: dp, and under context parallel the cp
    ranks too (each holds part of the same samples' tokens, as many as the others)."""
    if world["cp"].size() == 1:
        return world["dp"]
    return world["dp", "cp"]._flatten("dp_cp")


def mean_across(value: torch.Tensor, group=None) -> float:
    """The mean of a scalar over a process group (SUM then divide: gloo has no AVG)."""
    value = value.detach().float().clone()
    dist.all_reduce(value, group=group)
    return value.item() / dist.get_world_size(group)


@functools.cache
def _bf16(rt: Runtime, dtype: str) -> bool:
    """Whether to compute in bf16: asked for, and native on this device (said once if not)."""
    if dtype != "bf16":
        return False
    if not rt.device.supports_bf16:
        if rt.is_main:
            print(
                f"[runtime] bf16 is not native on this {rt.device.type}: computing in fp32",
                flush=True,
            )
        return False
    return True


def autocast(rt: Runtime, dtype: str):
    """bf16 autocast where asked for and supported; a no-op context otherwise."""
    if _bf16(rt, dtype):
        return torch.autocast(rt.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def param_dtype(rt: Runtime, dtype: str) -> torch.dtype:
    return torch.bfloat16 if _bf16(rt, dtype) else torch.float32


def run_dir(output_dir: str, run_name: str, trainer: str, rt: Runtime) -> Path:
    """<output_dir>/<run_name>, the same on every rank. mmm-orch always names the run; started by
    hand, a run is named after its job id or, outside a job, the time rank 0 started. Rank 0 holds
    the directory for the whole run (runtime/run_claim.py: by flock and a claim file, or the claim
    alone where the file system refuses flock): two runs never write one directory at once. A
    directory in use, or one whose files are not what a run keeps there: exit 2 on every rank."""
    name = run_name
    if not name:
        from mmm_orch.schedulers import job_in

        job = job_in()[1].split(".")[0]  # (a PBS id ends in its server's name)
        picked = [job or time.strftime("%Y%m%d-%H%M%S")]
        dist.broadcast_object_list(picked, src=0)
        name = f"{trainer}-{picked[0]}"
    path = Path(output_dir) / name
    refuse_if_main_says(rt, "runtime", _claim(path) if rt.is_main else "")
    return path


def _claim(path: Path) -> str:
    """Rank 0: make the run directory and take it (runtime/run_claim.py); why the run cannot
    have it, or ""."""
    if os.path.lexists(path) and not path.is_dir():
        return (
            f"run directory {path} is {runfiles.kind(path)}, not a directory; give this run "
            "another --run-name"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot make the run directory {path}: {exc.strerror}"
    # What the run writes in it: a FIFO there would block it, a link would be written through.
    for entry, wanted in (
        (run_claim.LOCK_FILE, "a regular file"),
        (protocol.METRICS_FILE, "a regular file"),
        (protocol.CHECKPOINTS_DIR, "a directory"),
    ):
        if (found := runfiles.kind(path / entry)) not in ("missing", wanted):
            return (
                f"{path / entry} is {found}, not {wanted}: not a run directory this "
                "runtime wrote; give this run another --run-name"
            )
    # A relaunch after a failure waits this long for the ranks of the launch that ended,
    # which may take the scheduler's kill grace (Slurm's KillWait) to go.
    wait_s = float(os.environ.get(protocol.RUN_LOCK_WAIT_VAR, "0"))
    refused = run_claim.hold(
        path, run_claim.this_process(), wait_s, lambda text: print(text, flush=True)
    )
    if not refused:
        on_exit(run_claim.release)
    return refused
