"""Where the step time goes: torch.profiler over a window of steps on chosen ranks
(`--profile torch`), and named ranges around the parts of a step (data, forward, backward,
optimizer) that every trainer marks the same way: record_function ranges in the trace, and NVTX
ranges on CUDA and ROCm (Nsight Systems and rocprof see them; torch sends NVTX to roctx on ROCm).

Off, the default, costs one test per range and per step: torch.profiler is never imported."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmm_orch.injob import protocol
from mmm_orch.injob.windows import Window, ranks, window


class StepProfiler:
    """A run's profiling: `begin(step)` and `end(step)` around each step run torch.profiler
    over the window and write the trace after its last step, on the chosen ranks; inside
    the window, `open_step()` and `close_step()` mark the step's time (the trainers' StepTimer
    calls them where it starts and stops the step's clock, so the trace's step is the logged
    one)."""

    def __init__(self, chosen: Window, here: bool, trace: Path, device_type: str):
        self.window, self.here, self.trace = chosen, here, trace
        self.device_type = device_type
        self._profile: Any = None
        self._step = 0  # the step in the window now running (0: none)
        self._open: contextlib.ExitStack | None = None

    def begin(self, step: int) -> None:
        """Before step `step`. The profiler starts a step before the window where there is
        one: that step's events are dropped (torch.profiler's warm-up), and with them the cost
        of starting it."""
        global _recording
        if not self.here:
            return
        if self._profile is None and step == max(1, self.window.first - 1):
            self.trace.parent.mkdir(parents=True, exist_ok=True)
            self._profile = _start_torch_profiler(
                self.device_type, self.window.first - step, self._length, self.trace
            )
            _recording = self
        self._step = step if step in self.window else 0

    def open_step(self) -> None:
        if self._step and self._open is None:
            self._open = contextlib.ExitStack()
            self._open.enter_context(_named(f"step#{self._step}", self.device_type))

    def close_step(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None

    def end(self, step: int) -> None:
        """After step `step`: the profiler steps on; after the window's last, the trace."""
        global _recording
        self.close_step()
        self._step = 0
        if self._profile is None:
            return
        self._profile.step()
        if step == self.window.last:
            _recording = None
            self._profile.stop()
            self._profile = None

    @property
    def _length(self) -> int:
        return self.window.last - self.window.first + 1


_recording: StepProfiler | None = None  # the profiler whose window is open, on this rank


def profiler(
    tool: str, steps: str, profiled_ranks: str, last_step: int, run_dir: Path, rt: Any
) -> StepProfiler | None:
    """The run's StepProfiler (None with --profile off); ValueError for a window or a rank the
    run does not have."""
    if tool == "off":
        return None
    chosen = window(steps, last_step)
    named = ranks(profiled_ranks, rt.world_size)
    here = rt.launch.local_rank == 0 if named is None else rt.rank in named
    trace = run_dir / protocol.PROFILE_DIR / protocol.profile_trace_name(rt.hostname, rt.rank)
    return StepProfiler(chosen, here, trace, rt.device.type)


def step_opened() -> None:
    """The step's clock started (StepTimer.start): its range opens, in the window."""
    if _recording is not None:
        _recording.open_step()


def step_closed() -> None:
    """The step's clock stopped (StepTimer.stop): its range closes."""
    if _recording is not None:
        _recording.close_step()


@contextlib.contextmanager
def region(name: str) -> Iterator[None]:
    """A named part of a step (protocol.PROFILE_PHASES, or your own name): a range in the trace
    while the window is open on this rank; nothing otherwise."""
    if _recording is None:
        yield
        return
    with _named(name, _recording.device_type):
        yield


@contextlib.contextmanager
def _named(name: str, device_type: str) -> Iterator[None]:
    import torch

    label = protocol.PROFILE_RANGE + name
    with torch.profiler.record_function(label):
        if device_type == "cuda":  # CUDA, and ROCm's HIP under the same name
            torch.cuda.nvtx.range_push(label)
            try:
                yield
            finally:
                torch.cuda.nvtx.range_pop()
        else:
            yield


def _start_torch_profiler(device_type: str, warmup: int, active: int, trace: Path) -> Any:
    """torch.profiler over the window: `warmup` steps recorded and dropped, then `active`
    steps, written to `trace` when the last of them ends."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device_type == "cuda" and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    elif device_type == "xpu":
        activities.append(ProfilerActivity.XPU)
    started = profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=warmup, active=active, repeat=1),
        on_trace_ready=lambda done: done.export_chrome_trace(str(trace)),
        record_shapes=False,
        with_stack=False,
    )
    started.start()
    return started
