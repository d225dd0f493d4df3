"""Where the step time goes: torch.profiler over a window of steps on chosen ranks
(`--profile torch`), or a facility's profiler around them (`--profile nsys`, `unitrace`,
`rocprof`: the job starts the chosen ranks under it, injob/facility_profiler.py, and the trainer opens
and closes its collection at the window's first and last step), and named ranges around the
parts of a step (data, forward, backward, optimizer) that every trainer marks the same way:
record_function ranges in torch.profiler's trace, NVTX ranges on CUDA and ROCm (Nsight Systems
and rocprof see them; torch sends NVTX to roctx on ROCm), ITT ranges on XPU (unitrace, VTune).

Off, the default, costs one test per range and per step: no profiler is started."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mmm_orch.injob import protocol
from mmm_orch.injob.windows import Window, ranks, window


class StepProfiler:
    """A run's profiling: `begin(step)` and `end(step)` around each step run torch.profiler
    over the window and write the trace after its last step, on the chosen ranks (or, with a
    facility's profiler, `tool_window` names how its collection opens and closes); inside the
    window, `open_step()` and `close_step()` mark the step's time (the trainers' StepTimer calls
    them where it starts and stops the step's clock, so the trace's step is the logged one)."""

    def __init__(
        self, chosen: Window, here: bool, trace: Path, device_type: str, tool_window: str = ""
    ):
        self.window, self.here, self.trace = chosen, here, trace
        self.device_type, self.tool_window = device_type, tool_window
        self._profile: Any = None
        self._close_tool: Callable[[], None] | None = None
        self._step = 0  # the step in the window now running (0: none)
        self._open: contextlib.ExitStack | None = None

    def begin(self, step: int) -> None:
        """Before step `step`. The profiler starts a step before the window where there is
        one: that step's events are dropped (torch.profiler's warm-up), and with them the cost
        of starting it."""
        global _recording
        if not self.here:
            return
        if self.tool_window:
            if step == self.window.first and self._close_tool is None:
                self._close_tool = _open_tool_window(self.tool_window)
                _recording = self
        elif self._profile is None and step == max(1, self.window.first - 1):
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
        if self._close_tool is not None and step == self.window.last:
            _recording = None
            self._close_tool()
            self._close_tool = None
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
    run does not have, or a facility's profiler outside a job that starts the ranks under it."""
    if tool == "off":
        return None
    tool_window = "" if tool == "torch" else os.environ.get(protocol.PROFILE_WINDOW_VAR, "")
    if tool != "torch" and tool_window not in protocol.PROFILE_WINDOWS:
        raise ValueError(
            f"--profile {tool!r}: off, torch, or a machine's profiler in a job mmm-orch rendered "
            f"for it (the job starts the ranks under the profiler and sets "
            f"{protocol.PROFILE_WINDOW_VAR}; `mmm-orch show machine NAME` lists its profilers)"
        )
    chosen = window(steps, last_step)
    named = ranks(profiled_ranks, rt.world_size)
    here = rt.launch.local_rank == 0 if named is None else rt.rank in named
    trace = run_dir / protocol.PROFILE_DIR / protocol.profile_trace_name(rt.hostname, rt.rank)
    return StepProfiler(chosen, here, trace, rt.device.type, tool_window)


def step_opened() -> None:
    """The step's clock started (StepTimer.start): its range opens, in the window."""
    if _recording is not None:
        _recording.open_step()


def step_closed() -> None:
    """The step's clock stopped (StepTimer.stop): its range closes."""
    if _recording is not None:
        _recording.close_step()


def region(name: str) -> contextlib.AbstractContextManager[None]:
    """A named part of a step (protocol.PROFILE_PHASES, or your own name): a range in the trace
    while the window is open on this rank; nothing otherwise (one shared empty context, not a
    generator made per call)."""
    if _recording is None:
        return _NOTHING
    return _named(name, _recording.device_type)


_NOTHING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


@contextlib.contextmanager
def _named(name: str, device_type: str) -> Iterator[None]:
    import torch

    label = protocol.PROFILE_RANGE + name
    ranges = {"cuda": torch.cuda.nvtx, "xpu": torch.profiler.itt}.get(device_type)
    with torch.profiler.record_function(label):
        if ranges is None:
            yield
            return
        ranges.range_push(label)  # NVTX on CUDA and ROCm (roctx under HIP), ITT on XPU
        try:
            yield
        finally:
            ranges.range_pop()


def _open_tool_window(kind: str) -> Callable[[], None]:
    """Open a facility profiler's collection (protocol.PROFILE_WINDOWS); what closes it."""
    import torch

    opened = contextlib.ExitStack()
    if kind == "cuda-profiler-api":  # nsys --capture-range=cudaProfilerApi
        torch.cuda.profiler.start()
        opened.callback(torch.cuda.profiler.stop)
    elif kind == "pti-collection":  # unitrace --conditional-collection reads it at each event
        opened.enter_context(torch.autograd.profiler.emit_itt(record_shapes=False))  # operators
        os.environ["PTI_ENABLE_COLLECTION"] = "1"
        opened.callback(os.environ.__setitem__, "PTI_ENABLE_COLLECTION", "0")
    elif kind == "roctx":  # rocprofv3 --selected-regions
        import ctypes

        roctx = _roctx()
        thread = ctypes.c_uint64()
        roctx.roctxGetThreadId(ctypes.byref(thread))
        roctx.roctxProfilerResume(thread)
        opened.callback(roctx.roctxProfilerPause, thread)
    return opened.close  # "none": nothing to close, the profiler collects the whole run


def _roctx() -> Any:
    """ROCm's roctx library: rocprofiler-sdk's, else the older roctx64."""
    import ctypes
    import ctypes.util

    for name in ("rocprofiler-sdk-roctx", "roctx64"):
        found = ctypes.util.find_library(name)
        if found:
            return ctypes.CDLL(found)
    raise RuntimeError(
        "--profile with a roctx window: neither librocprofiler-sdk-roctx nor libroctx64 is "
        "on the library path (module load rocm)"
    )


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
