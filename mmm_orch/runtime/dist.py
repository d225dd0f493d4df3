"""Process-group setup and teardown for every trainer."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from mmm_orch.injob.launch_env import LaunchEnv, LaunchEnvError, detect, host_name
from mmm_orch.runtime import device as device_mod


@dataclass(frozen=True)
class Runtime:
    launch: LaunchEnv
    device: device_mod.Device
    hostname: str

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def is_main(self) -> bool:
        return self.launch.rank == 0


def _use_ezpz() -> bool:
    if os.environ.get("MMM_USE_EZPZ", "") not in ("1", "true", "yes"):
        return False
    try:
        import ezpz  # noqa: F401 - optional: only with MMM_USE_EZPZ
    except ImportError:
        print(
            "[runtime] MMM_USE_EZPZ is set but ezpz is not importable; using mmm_orch.runtime",
            file=sys.stderr,
        )
        return False
    return True


def _init_mpi_for_oneccl(is_reporter: bool) -> None:
    """With CCL_KVS_MODE=mpi, oneCCL needs MPI initialised by the application before the process
    group is made, and `import mpi4py` does it (ALCF-UG aurora/data-science/frameworks/
    frameworks.md, Known issues, read 2026-11-28). Nothing happens under any other KVS mode."""
    if os.environ.get("CCL_KVS_MODE") != "mpi":
        return
    try:
        from mpi4py import MPI  # MPI_Init at import (mpi4py.rc.initialize)
    except (ImportError, RuntimeError) as exc:  # no mpi4py, or no MPI library for it to load;
        # every rank finds the same: all stop, one says why
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if is_reporter:
            print(
                f"[runtime] error: CCL_KVS_MODE=mpi needs MPI initialised before the process "
                f"group, by mpi4py, which cannot start here ({reason}): install mpi4py and an "
                "MPI library in the job environment, or run without CCL_KVS_MODE=mpi",
                file=sys.stderr,
                flush=True,
            )
        raise SystemExit(2) from None
    if is_reporter:
        print(
            f"[runtime] MPI initialised before the process group (CCL_KVS_MODE=mpi): "
            f"{MPI.Is_initialized()}",
            file=sys.stderr,
            flush=True,
        )


def setup(timeout_s: float = 600) -> Runtime:
    """Find rank and device, pin the device, then join the process group (in that order: NCCL and
    xccl pick the device at init)."""
    try:
        launch = detect()
    except LaunchEnvError as exc:
        sys.exit(f"[runtime] error: {exc}")
    try:
        device = device_mod.select(launch.local_rank)
    except device_mod.DeviceError as exc:  # every rank of a node finds the same: all stop
        if launch.local_rank == 0:
            print(f"[runtime] error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if device.type == "cuda":
        torch.cuda.set_device(device.index)
    elif device.type == "xpu":
        torch.xpu.set_device(device.index)
    if not dist.is_initialized():
        _init_mpi_for_oneccl(launch.rank == 0)
        if launch.world_size > 1 and _use_ezpz():
            import ezpz  # optional: found importable by _use_ezpz

            ezpz.setup_torch(backend=device.backend)
        else:
            # One process still gets a group (meshes and FSDP need one), on an in-memory store
            # so that it never competes for a port.
            rendezvous = (
                {"store": dist.HashStore()}
                if launch.world_size == 1
                else {"init_method": f"tcp://{_bracket(launch.master_addr)}:{launch.master_port}"}
            )
            dist.init_process_group(
                backend=device.backend,
                rank=launch.rank,
                world_size=launch.world_size,
                timeout=timedelta(seconds=timeout_s),
                device_id=device.torch if device.type in ("cuda", "xpu") else None,
                **rendezvous,
            )
    return Runtime(
        launch=launch,
        device=device,
        hostname=host_name(),
    )


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def teardown() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


_ON_EXIT: list[Callable[[], None]] = []


def on_exit(action: Callable[[], None]) -> None:
    """Run `action` as the process leaves, by exit_process (which skips atexit) or otherwise."""
    _ON_EXIT.append(action)
    atexit.register(action)


def exit_process(code: int) -> NoReturn:
    """Leave without interpreter finalization. After the process group is gone, C++ destructors
    of gloo's transport run at finalization and sometimes abort ("terminate called without an
    active exception", about 1 run in 10 on a loaded 2-core host), which turns a finished run into
    a SIGABRT. Everything the run writes is flushed first, and on_exit's actions run."""
    for action in _ON_EXIT:
        action()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def refuse(is_main: bool, trainer: str, message: str) -> NoReturn:
    """Stop every rank with exit 2 over what they all found wrong (options, data, a run's
    files); the main rank says what."""
    if is_main:
        print(f"[{trainer}] error: {message}", file=sys.stderr, flush=True)
    if dist.is_initialized():  # no rank exits, and has the launcher stop the main one, before
        dist.barrier()  # the main one said why
    raise SystemExit(2)


def refuse_if_main_says(rt: Runtime, trainer: str, problem: str) -> None:
    """Rank 0's `problem` (what it alone checked: its files, its directories; "" for none) on
    every rank, and every rank stops with exit 2 on one, as refuse()."""
    verdict = [problem if rt.is_main else ""]
    if dist.is_initialized():
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0]:
        refuse(rt.is_main, trainer, verdict[0])


def run_main(main: Callable[[], int]) -> NoReturn:
    """A trainer's entry point: its exit code, including a SystemExit raised on the way (bad
    options, a run that cannot resume), leaves through exit_process."""
    try:
        code = main()
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    exit_process(code)
