"""Peak memory per device of a training plan, before it waits hours in a queue: the workload's
model (resources.memory_model, a name in the registry, mmm_orch/models/) sizes a step by its own
rule (its folder's memory.py says what it counts and how close it comes), on the layout the
run's options make: the data-, tensor-, pipeline- and context-parallel degrees, the
micro-batch, activation checkpointing, the compute dtype and the loss's chunks. A plan above the
device's memory is refused with the changes that fit; the trainer's rules for the global batch,
a pipeline and a context split are checked here too, before the queue.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from mmm_orch import models
from mmm_orch.errors import InvalidValue, MmmError
from mmm_orch.limits import MAX_GLOBAL_BATCH
from mmm_orch.models.layout import (
    DEFAULT_LOSS_CHUNK,
    PIPELINE_SCHEDULES,
    context_fault,
    micro_batches,
    pipeline_fault,
    stage_layers,
    tensor_fault,
)
from mmm_orch.models.spec import GIB, Model, Preset, Shape
from mmm_orch.planning.checks import bounded
from mmm_orch.planning.model import MemoryPlan

# The most a size option may be (a trillion tokens, layers, samples): past every real run, and low
# enough that the estimate's products stay finite floats (2^40 cubed is far below 10^308).
MAX_SIZE = 1 << 40


def fixes(model: Model, shape: Shape, limit: float, nodes: int, ranks_per_node: int) -> list[str]:
    """Changes that bring `model`'s estimate under `limit`, each with its estimate: more nodes,
    checkpointing, a smaller batch, more tensor parallelism (inside a node), pipeline stages,
    context parallel."""
    tried = []
    for factor in (2, 4, 8):
        tried.append((f"-N {nodes * factor}", replace(shape, dp=shape.dp * factor)))
    for ac in ("every_other", "full"):
        if ac != shape.ac and (shape.ac, ac) != ("full", "every_other"):
            tried.append((f"--set ac={ac}", replace(shape, ac=ac)))
    if shape.batch > 1:
        tried.append(("--set batch_size=1", replace(shape, batch=1)))
    for tp in (2, 4, 8):
        if tp > shape.tp and ranks_per_node % tp == 0 and not tensor_fault(tp, *heads(shape.model)):
            tried.append((f"--set tp={tp}", replace(shape, tp=tp, dp=shape.dp * shape.tp // tp)))
    for pp in (2, 4, 8, 16):
        grown = pp * shape.pp
        stages = grown * PIPELINE_SCHEDULES[shape.schedule]
        if shape.model.n_layers % stages == 0 and shape.dp % pp == 0:
            dp = shape.dp // pp
            microbatches = max(shape.microbatches * pp, grown)  # at least a micro-batch a stage
            change = f"--set pp={grown}"
            if microbatches > shape.microbatches * pp:
                change += f" --set global_batch={microbatches * shape.batch * dp}"
            tried.append((change, replace(shape, pp=grown, dp=dp, microbatches=microbatches)))
    for cp in (2, 4, 8):
        grown = cp * shape.cp
        if shape.seq % (2 * grown) == 0 and shape.dp % cp == 0:
            tried.append((f"--set cp={grown}", replace(shape, cp=grown, dp=shape.dp // cp)))
    return [
        f"{change} ({model.memory(option).total / GIB:.0f} GiB)"
        for change, option in tried
        if model.memory(option).total <= limit
    ]


def sized(machine, workload, args: dict, layout):
    """The plan's memory section for a workload with a memory model, or None; MmmError when the
    estimate is above the device's memory (MMM_ORCH_MEMORY_CHECK=0: said, not refused), when a
    size is past MAX_SIZE, or when the trainer would refuse the global batch."""
    if not workload.resources.memory_model:
        return None
    arg, size = _readers(workload, args)
    model, (preset, model_args) = model_of(workload, args)
    tp, pp, cp = size("tp") or 1, size("pp") or 1, size("cp") or 1
    accelerator = machine.node.gpus > 0
    batch = size("batch_size") or preset.batch_size
    dp = max(1, layout.ranks // (tp * pp * cp))
    global_batch = size("global_batch", 0) or 0
    shape = Shape(
        model_args,
        batch=batch,
        seq=size("seq_len") or preset.seq_len,
        dp=dp,
        tp=tp,
        ac=arg("ac") or preset.ac,
        value_bytes=2 if compute_dtype(machine, workload, args) == "bf16" else 4,
        loss_chunk=_or(size("loss_chunk", 0), DEFAULT_LOSS_CHUNK) if tp == 1 else 0,
        attention_matrix=machine.node.attention_kernel == "math",
        pp=pp,
        schedule=arg("pp_schedule") or "1f1b",
        microbatches=micro_batches(global_batch, batch, dp) or 1,
        cp=cp,
    )
    check_global_batch(global_batch, shape)
    check_layout(shape)
    found = model.memory(shape)
    device = machine.node.gpu_memory_gib if accelerator else None
    plan = MemoryPlan({k: v / GIB for k, v in found.parts.items()}, device, split(shape))
    if device and found.total > device * GIB and os.environ.get("MMM_ORCH_MEMORY_CHECK") != "0":
        better = fixes(model, shape, device * GIB, layout.nodes, layout.ranks_per_node)
        raise MmmError(
            f"memory: {workload.name} needs an estimated {found.describe()} per device, above "
            f"the {device:g} GiB of one {machine.node.device} device; "
            + (
                f"it fits with {', or '.join(better)}"
                if better
                else "no single change fits it: combine more nodes, tp and ac=full"
            )
            + " (the estimate is within 25%; MMM_ORCH_MEMORY_CHECK=0 submits it anyway)"
        )
    return plan


def compute_dtype(machine, workload, args: dict) -> str:
    """What the trainer computes in on `machine`: bf16 on an accelerator unless the run asks
    for fp32, fp32 on CPUs (the trainer's rule, runtime/loop.py's param_dtype)."""
    asked = _readers(workload, args)[0]("dtype")
    return "bf16" if machine.node.gpus > 0 and asked != "fp32" else "fp32"


def _readers(workload, args: dict):
    """(arg, size): an option's value (given, else the workload's default), and a size
    option's, bounded."""

    def arg(name: str):
        option = workload.options.get(name)
        return args.get(name, option.default if option else None)

    def size(name: str, least: int = 1) -> int | None:
        value = arg(name)
        return (
            None
            if value is None
            else bounded(
                name,
                value,
                least,
                MAX_SIZE,
                f"a whole number from {least} to {MAX_SIZE}",
                whole=True,
            )
        )

    return arg, size


def model_of(workload, args: dict) -> tuple[Model, tuple[Preset, Any]]:
    """The workload's model (its memory_model, by name) and the preset and shape its options
    build (the trainer's rule: the model's own build)."""
    model = models.get(workload.resources.memory_model, "memory_model")
    arg, size = _readers(workload, args)
    return model, model.build(
        arg("config"), bool(arg("tiny")), size("n_layers"), size("vocab_size"), size("seq_len")
    )


def check_global_batch(global_batch: int, shape: Shape) -> None:
    """The trainer's rule (runtime/data.py, GlobalBatch.of): a step accumulates micro-batches of
    batch_size samples on each data-parallel rank, so a global batch (0: one micro-batch a rank)
    is a multiple of batch_size x dp. Refused here, not in the job after its wait in the queue."""
    per_forward = shape.batch * shape.dp
    if global_batch > MAX_GLOBAL_BATCH:
        raise InvalidValue("global_batch", global_batch, f"0 to {MAX_GLOBAL_BATCH} samples a step")
    if micro_batches(global_batch, shape.batch, shape.dp) is None:
        raise InvalidValue(
            "global_batch",
            global_batch,
            f"0 or a multiple of batch_size "
            f"{shape.batch} x {shape.dp} data-parallel ranks = {per_forward}, "
            "the samples one forward pass takes on all ranks",
        )


def split(shape: Shape) -> str:
    """How the trainer splits the model into the pipeline's stages ('' without one)."""
    if shape.pp == 1:
        return ""
    stages = stage_layers(shape.model.n_layers, shape.pp * PIPELINE_SCHEDULES[shape.schedule])
    named = []
    for index, layers in enumerate(stages):
        parts = [f"layers {layers[0]}-{layers[-1]}"]
        if index == 0:
            parts.insert(0, "the embedding")
        if index == len(stages) - 1:
            parts.append("the norm and output")
        named.append(f"stage {index} {' + '.join(parts)} on pp rank {index % shape.pp}")
    return (
        f"{len(stages)} stages ({shape.schedule}), {shape.microbatches} micro-batches a step, "
        f"{shape.in_flight:g} in flight on the busiest: " + "; ".join(named)
    )


def check_layout(shape: Shape) -> None:
    """The trainer's rules for a pipeline, a context and a tensor-parallel split (models/layout.py's
    pipeline_fault, context_fault and tensor_fault), before the queue."""
    m = shape.model
    fault = (
        pipeline_fault(
            m.n_layers, shape.pp, shape.schedule, shape.microbatches, shape.batch, shape.dp
        )
        or context_fault(shape.seq, shape.cp)
        or tensor_fault(shape.tp, *heads(m))
    )
    if fault is not None:
        raise InvalidValue(*fault)


def heads(model: Any) -> tuple[int, int]:
    """A model's attention heads and key-value heads; (1, 1) for a model without them, which
    tensor parallelism splits by no heads."""
    found = getattr(model, "n_heads", 1)
    return found, getattr(model, "n_kv_heads", found)


def _or(value, default):
    """`value`, or `default` where it is None (0 means something: the whole sequence)."""
    return default if value is None else value
