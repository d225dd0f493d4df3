"""The runtime for your own training code: what mmm-orch's trainers use, as a small stable API.
Import it as `from mmm_orch import runtime`; nothing here imports torch before `setup()`.

    from mmm_orch import runtime

    rt = runtime.setup()                      # torch.distributed from any launcher, the device
    start = 0
    if (ckpt := runtime.latest_checkpoint()):  # set when this run resumes (a chain, a failover)
        start = load(ckpt.path)                # your own loading
    for step in range(start + 1, steps + 1):
        loss = train_one_step()
        runtime.report_step(step, loss=loss)   # the log line and metrics the watchdog reads
        if runtime.stop_requested():           # the walltime is near, a cancel, a lost node
            save(runtime.checkpoint_path(step)); runtime.checkpoint_saved(step)
            runtime.finish(runtime.EXIT_CHECKPOINTED)
    runtime.finish(0)

Where the step time goes, as the trainers profile (`mmm-orch profile JOB` reads it): the job's
MMM_ORCH_PROFILE=torch (with MMM_ORCH_PROFILE_STEPS=A:B, MMM_ORCH_PROFILE_RANKS=0,4) turns it on.

    runtime.profile_window(steps)              # after setup(): which steps, on which ranks
    for step in ...:
        with runtime.profiled_step(step):
            with runtime.region("data"): batch = next(loader)
            with runtime.region("forward"): loss = model(batch)
            ...

The contract (docs/runtime.md says it in full): on the stop signal, save and exit 75; when the
job says resume, go on from the latest checkpoint. Code that keeps it gets chains, failover and
the stop before the walltime exactly as the in-repo trainers do.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from mmm_orch.injob import launch_env, protocol, runfiles
from mmm_orch.runtime import stop
from mmm_orch.runtime.metrics import MetricLogger

if TYPE_CHECKING:
    from mmm_orch.runtime.dist import Runtime

EXIT_CHECKPOINTED = protocol.EXIT_CHECKPOINTED  # saved on a stop signal: the job resumes later
_state: dict[str, Any] = {"runtime": None, "logger": None}


@dataclass(frozen=True)
class Checkpoint:
    """A saved step of this run (`latest_checkpoint()`)."""

    step: int
    path: Path  # the directory checkpoint_path(step) gave when it was saved


def setup(timeout_s: float = 600) -> Runtime:
    """Catch the stop signals, then start torch.distributed with the machine's device and
    backend from whichever launcher started this process (mpiexec, srun, torchrun, or none: a
    group of one). Returns rank, world size, device (`.device.torch`) and host."""
    stop.catch()
    from mmm_orch.runtime import dist  # torch: `from mmm_orch import runtime` loads none

    _state["runtime"] = dist.setup(timeout_s)
    return _state["runtime"]


def rank() -> int:
    """This process's global rank (0 outside any launcher); needs no setup()."""
    return launch_env.detect().rank


def run_dir() -> Path:
    """Where this run keeps its metrics and checkpoints: the job's run directory, the same for
    every link of a chain and every failover attempt; ./outputs/run outside mmm-orch."""
    return Path(os.environ.get(protocol.RUN_DIR_VAR) or Path("outputs") / "run")


def should_resume() -> bool:
    """The job asks this launch to go on from the run's latest checkpoint."""
    return os.environ.get(protocol.RESUME_VAR) == "1"


def latest_checkpoint() -> Checkpoint | None:
    """The checkpoint to go on from when should_resume(), else None. Asked to resume with no
    checkpoint (a chain link after one that saved nothing): exit 2, unless the job allows a
    fresh start (a failover attempt before the first save). A `latest` that names no checkpoint
    directory of the run (damaged, not a file, a link out of the run): exit 2, on every rank."""
    if not should_resume():
        return None
    try:
        step = runfiles.latest_step(run_dir())
    except runfiles.RunFileError as exc:
        _refuse(f"cannot resume: {exc}")
    if step is not None:
        return Checkpoint(step, runfiles.step_dir(run_dir(), step))
    if os.environ.get(protocol.ALLOW_FRESH_VAR) == "1":
        return None
    _refuse(f"asked to resume, but {run_dir() / protocol.CHECKPOINTS_DIR} holds no checkpoint")


def _refuse(message: str) -> NoReturn:
    """Exit 2; rank 0 says why."""
    if rank() == 0:
        print(f"[runtime] error: {message}", file=sys.stderr, flush=True)
    finish(2)


def stop_requested() -> bool:
    """A stop signal reached any rank (the walltime is near, a cancel, a node lost). With a
    process group every rank must call it at the same step: it is one tiny all-reduce."""
    asked = stop.received() is not None
    runtime = _state["runtime"]
    if runtime is None or runtime.world_size == 1:
        return asked
    # torch: `from mmm_orch import runtime` loads none (setup() has loaded it by now).
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if asked else 0], device=runtime.device.torch)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def report_step(step: int, **metrics: Any) -> None:
    """On rank 0: print `step=N key=value ...` (the line the watchdog, timeline and report read,
    with the first-step marker before the first) and append it to run_dir()/metrics.jsonl.
    Other ranks: nothing. Throughput fields are per device (`tokens_per_s`, `samples_per_s`)."""
    _logger().step(step, **metrics)


def checkpoint_path(step: int) -> Path:
    """The directory to save step `step`'s checkpoint in (made on first use); ValueError for a
    step that is no int >= 0, or where something else than a directory stands in its place."""
    path = runfiles.step_dir(run_dir(), step)
    if runfiles.kind(path) == "missing":
        path.mkdir(parents=True, exist_ok=True)  # exist_ok: other ranks make it at once
    return runfiles.existing_step_dir(run_dir(), step)


def checkpoint_saved(step: int, save_s: float | None = None) -> None:
    """Call on every rank once all of them wrote step `step` into checkpoint_path(step): rank 0
    names it the latest (what chains and failover resume from) and logs it; `save_s`, the
    time the save took, lets the watchdog stop early enough for the next one. ValueError (on
    rank 0) when there is no checkpoint_path(step) to name."""
    if rank() != 0:
        return
    path = runfiles.existing_step_dir(run_dir(), step)
    protocol.point_latest(run_dir(), step)
    _logger().event(
        protocol.CHECKPOINT_EVENT,
        step=step,
        path=str(path),
        save_s=save_s if save_s is not None else 0.0,
    )


def finish(code: int = 0) -> NoReturn:
    """Leave the process group and exit with `code` (0 done, EXIT_CHECKPOINTED stopped and
    saved, anything else failed), without the teardown crashes of interpreter exit."""
    logger = _state["logger"]
    if logger is not None:
        logger.close()
    if _state["runtime"] is not None and code in (0, EXIT_CHECKPOINTED):
        from mmm_orch.runtime.dist import teardown  # torch: see setup()

        teardown()  # every rank ends here together; on a failure the others may not
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def profile_window(
    last_step: int, tool: str | None = None, steps: str | None = None, ranks: str | None = None
) -> None:
    """Profile a window of this run's steps as the trainers' --profile does: `tool` ("torch",
    "off", or the machine's profiler the job runs this rank under), `steps` ("A:B") and `ranks`
    ("0,4") default to the job's MMM_ORCH_PROFILE, MMM_ORCH_PROFILE_STEPS and
    MMM_ORCH_PROFILE_RANKS; torch.profiler's traces go to run_dir()/profile. A window or rank
    the run does not have: exit 2 on every rank. Call after setup()."""
    from mmm_orch.runtime import profiling

    runtime = _state["runtime"]
    if runtime is None:
        raise RuntimeError("profile_window() needs setup() first")
    tool = tool or os.environ.get(protocol.PROFILE_VAR) or "off"
    try:
        _state["profiler"] = profiling.profiler(
            tool,
            steps if steps is not None else os.environ.get(protocol.PROFILE_STEPS_VAR, ""),
            ranks if ranks is not None else os.environ.get(protocol.PROFILE_RANKS_VAR, ""),
            last_step,
            run_dir(),
            runtime,
        )
    except ValueError as exc:
        _refuse(str(exc))


@contextlib.contextmanager
def profiled_step(step: int) -> Iterator[None]:
    """Around step `step` of your loop: the profiler's window opens and closes with it."""
    profiler = _state.get("profiler")
    if profiler is None:
        yield
        return
    profiler.begin(step)
    profiler.open_step()
    try:
        yield
    finally:
        profiler.end(step)


def region(name: str) -> contextlib.AbstractContextManager[None]:
    """A named part of a step (data, forward, backward, optimizer, or your own): a range in the
    trace while the window is open; nothing otherwise."""
    from mmm_orch.runtime import profiling

    return profiling.region(name)


def _logger() -> MetricLogger:
    if _state["logger"] is None:
        resumed = latest_checkpoint()
        try:
            _state["logger"] = MetricLogger(
                run_dir(),
                {"argv": sys.argv, "started": time.time()},
                enabled=rank() == 0,
                resumed_from=resumed.step if resumed else 0,
            )
        except runfiles.RunFileError as exc:  # rank 0's alone: the launcher stops the others
            _refuse(str(exc))
    return _state["logger"]
