"""Which device and collective backend this rank uses: CUDA/ROCm (nccl/rccl), XPU (xccl, or
oneCCL's ccl on older stacks), MPS, CPU (gloo). MMM_DEVICE / MMM_BACKEND override the choice; the
job scripts mmm-orch renders set both from the machine profile."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mmm_orch.injob import protocol

_BACKENDS = {"cuda": "nccl", "xpu": "xccl", "mps": "gloo", "cpu": "gloo"}
# What MMM_BACKEND may name: torch's collective backends (ROCm's RCCL is behind nccl), and
# oneCCL's ccl.
_ALLOWED_BACKENDS = ("nccl", "gloo", "xccl", "ccl", "mpi", "ucc")


class DeviceError(RuntimeError):
    """MMM_DEVICE / MMM_BACKEND name what this process cannot use (one line, says which)."""


@dataclass(frozen=True)
class Device:
    type: str  # torch device type: cuda (also ROCm), xpu, mps, cpu
    index: int | None  # None for cpu and mps
    backend: str

    @property
    def torch(self) -> torch.device:
        return (
            torch.device(self.type) if self.index is None else torch.device(self.type, self.index)
        )

    @property
    def supports_bf16(self) -> bool:
        if self.type == "cuda":
            return torch.cuda.is_bf16_supported()
        if self.type == "cpu":
            return _cpu_has_bf16()
        return self.type == "xpu"

    def synchronize(self) -> None:
        if self.type == "cuda":
            torch.cuda.synchronize(self.index)
        elif self.type == "xpu":
            torch.xpu.synchronize(self.index)

    def memory_gib(self) -> float | None:
        """Peak allocated memory on the accelerator since the last reset."""
        if self.type == "cuda":
            return torch.cuda.max_memory_allocated(self.index) / 2**30
        if self.type == "xpu":
            return torch.xpu.max_memory_allocated(self.index) / 2**30
        return None

    def name(self) -> str:
        if self.type == "cuda":
            return torch.cuda.get_device_name(self.index)
        if self.type == "xpu":
            return torch.xpu.get_device_name(self.index)
        return self.type


def _cpu_has_bf16() -> bool:
    """bf16 pays on a CPU only with native bf16 math (AVX512-BF16 or AMX); elsewhere it is
    emulated and several times slower than fp32 (7x for the MNIST CNN on an AVX2 host)."""
    cpu = torch.cpu
    return any(
        getattr(cpu, probe, lambda: False)()
        for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )


def _auto_type() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _count(device_type: str) -> int:
    if device_type == "cuda":
        return torch.cuda.device_count()
    if device_type == "xpu":
        return torch.xpu.device_count()
    return 1


def _xpu_backend() -> str:
    """xccl ships with torch >= 2.8 XPU builds; older stacks need oneCCL's bindings and 'ccl'."""
    if getattr(dist, "is_xccl_available", lambda: False)():
        return "xccl"
    return _registered("ccl")


def _registered(backend: str) -> str:
    """`backend`, its bindings imported first when torch does not ship it: 'ccl' exists only once
    oneccl_bindings_for_pytorch is imported, however it was chosen (MMM_BACKEND or the default)."""
    if backend != "ccl":
        return backend
    try:
        # Optional dependency, so imported here; importing it registers the 'ccl' backend.
        import oneccl_bindings_for_pytorch  # noqa: F401
    except ImportError:
        raise DeviceError(
            "backend ccl needs oneccl_bindings_for_pytorch, which this Python "
            "cannot import (on torch >= 2.8 XPU builds, use xccl)"
        ) from None
    return backend


def select(local_rank: int, env: Mapping[str, str] | None = None) -> Device:
    """The device for this rank: local rank modulo the visible devices (with --gpus-per-task=1
    each rank sees one device, so every rank gets index 0)."""
    if env is None:
        env = os.environ
    device_type = env.get(protocol.DEVICE_VAR) or _auto_type()
    if device_type == "rocm":
        device_type = "cuda"  # ROCm builds of torch use the cuda device type
    if device_type not in _BACKENDS:
        raise DeviceError(f"MMM_DEVICE={device_type!r}: expected cuda, rocm, xpu, mps or cpu")
    chosen = env.get(protocol.BACKEND_VAR)
    if chosen and chosen not in _ALLOWED_BACKENDS:
        raise DeviceError(f"MMM_BACKEND={chosen!r}: expected {', '.join(_ALLOWED_BACKENDS)}")
    backend = (
        _registered(chosen)
        if chosen
        else _xpu_backend()
        if device_type == "xpu"
        else _BACKENDS[device_type]
    )
    if device_type in ("cpu", "mps"):
        return Device(device_type, None, backend)
    count = _count(device_type)
    if count == 0:
        raise DeviceError(
            f"MMM_DEVICE={device_type} but torch sees no {device_type} device "
            f"(torch {torch.__version__})"
        )
    return Device(device_type, local_rank % count, backend)
