"""Peak memory per device of a Llama 3 training plan, before it waits hours in a queue.

The count follows what the trainer (trainers/llama3.py) keeps at the peak, the start of the
backward pass, in bytes per device, with d data-parallel and t tensor-parallel ranks, P
parameters, w bytes per computed value (2 in bf16, 4 in fp32):
- states, sharded over d x t: fp32 parameters, fp32 gradients and AdamW's two moments, 16 P/dt;
- gathered parameters: FSDP keeps the root's (embedding, output) whole through the step and two
  blocks at a time (the one computing, the one prefetched), with their gradients before the
  reduce-scatter: (2 V h + 2 B (w + 4) / w) w / t, B the parameters of a block; a world of
  one rank has no FSDP (trainers/parallelize.py) and computes in bf16 under autocast, whose
  cache holds every block's weights in bf16 to the end of the forward (L B w; none in fp32);
- activations a block saves for backward, per micro-batch of b samples of s tokens: the two
  norms' inputs and outputs (4 s b h; under TP with sequence parallelism 4 s b h / t plus the
  two gathered inputs, 2 s b h), attention's q, its output and wo's input (3 s b h / t) and k
  and v after RoPE (2 s b k / t, k the KV heads' width: the kernel shares them among the query
  heads), SwiGLU's four (4 s b f / t), and where the machine's attention
  kernel is the math one, the probabilities of its heads (b a s s / t); with checkpointing a
  block keeps only its input (s b h, / t under TP), and one block is recomputed at a time,
  after the loss's tensors are freed (the peak holds the larger of the two);
- the loss: the final norm's input and output, and the logits of a chunk of the sequence
  (loss_chunk tokens without TP, the whole sequence under TP, where each rank has V / t of the
  vocabulary) in w, with their log-softmax and its gradient in fp32 (and under TP two fp32
  buffers more, loss_parallel's); in chunks, the gradients made in forward wait for backward:
  the output layer's (V h w) and the final norm output's (s b h w).
With a pipeline of p stages (pp) the count is the busiest stage's: its L / p blocks' states and
activations, the embedding's or the output's states (the larger, V h), and the activations of
the micro-batches in flight at once, which the schedule sets: GPipe all M of a step, 1F1B at
most p on the first stage, interleaved 1F1B p (1 + (p - 1) / 2p) (two stages a rank, Narayanan
et al. 2021); the loss's logits are whole per micro-batch there (no chunks).
With context parallel over c ranks (cp) each rank holds s / c of a sequence's tokens, and every
count above is of those, but for k and v, which each block keeps whole (gathered from the c
ranks: 2 s b k / t) and the states, sharded over d x c x t.
The measured peak on CPU is within 25% of this for the layouts the tests run (dp, dp x tp,
cp, pp, checkpointing on and off; on an H200, one rank: 7-16% high); see
tests/test_memory_plan.py and benchmarks/README.md.
"""

from __future__ import annotations

import os
from dataclasses import field, replace

from mmm_orch.config.dataclass_code import dataclass
from mmm_orch.errors import InvalidValue, MmmError
from mmm_orch.limits import MAX_GLOBAL_BATCH
from mmm_orch.model_shapes import (
    DEFAULT_LOSS_CHUNK,
    PIPELINE_SCHEDULES,
    LlamaArgs,
    Preset,
    context_fault,
    micro_batches,
    pipeline_fault,
    run_model,
    stage_layers,
)
from mmm_orch.planning.checks import bounded
from mmm_orch.planning.model import MemoryPlan

GIB = 1 << 30
# The most a size option may be (a trillion tokens, layers, samples): past every real run, and low
# enough that the estimate's products stay finite floats (2^40 cubed is far below 10^308).
MAX_SIZE = 1 << 40


@dataclass(frozen=True)
class Shape:
    """What sizes a step: the model, the micro-batch and the parallel layout."""

    model: LlamaArgs
    batch: int
    seq: int
    dp: int
    tp: int
    ac: str  # none, every_other, full
    value_bytes: int  # 2 (bf16) or 4 (fp32)
    loss_chunk: int  # tokens of a sequence whose logits exist at once (0: all)
    # Under TP the logits are sharded over the vocabulary (loss_parallel); before that fix the
    # trainer replicated them: False sizes that older trainer.
    loss_sharded: bool = True
    # The math attention kernel saves each head's s x s probabilities (fused kernels do not).
    attention_matrix: bool = False
    pp: int = 1  # pipeline stages
    cp: int = 1  # context-parallel ranks a sequence is split over
    schedule: str = "1f1b"
    microbatches: int = 1  # a step's, on each data-parallel rank

    @property
    def in_flight(self) -> float:
        """Micro-batches whose activations the busiest stage holds at once."""
        if self.pp == 1:
            return 1
        if self.schedule == "gpipe":
            return self.microbatches
        held = min(self.pp, self.microbatches)
        return (
            held * (1 + (self.pp - 1) / (2 * self.pp)) if "interleaved" in self.schedule else held
        )


@dataclass(frozen=True)
class Estimate:
    parts: dict[str, float] = field(hash=False)  # bytes per device, by what holds them

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def describe(self) -> str:
        return (
            f"{self.total / GIB:.1f} GiB ("
            + ", ".join(f"{name} {value / GIB:.1f}" for name, value in self.parts.items())
            + ")"
        )


def estimate(shape: Shape) -> Estimate:
    m, w, t = shape.model, shape.value_bytes, shape.tp
    h, f, s, b, v = m.dim, m.ffn_dim, shape.seq, shape.batch, m.vocab_size
    layers = m.n_layers // shape.pp  # the busiest stage's
    held = m.params if shape.pp == 1 else layers * m.block_params + v * h + h
    states = held / (shape.dp * shape.cp * t)
    local = s // shape.cp  # a sequence's tokens on this rank
    tokens = local * b
    norms = 4 * h if t == 1 else 4 * h / t + 2 * h
    kv = m.n_kv_heads * m.head_dim
    # k and v are kept whole: gathered from the sequence's cp ranks (trainers/context.py)
    block = (tokens * (norms + 3 * h / t + 4 * f / t) + s * b * 2 * kv / t) * w
    if shape.attention_matrix:
        block += b * m.n_heads / t * local * s * w
    kept = tokens * h / t * w if t > 1 else tokens * h * w  # a checkpointed block's input
    # every_other checkpoints blocks 0, 2, 4, ... (trainers/parallelize.py)
    checkpointed = {"none": 0, "every_other": (layers + 1) // 2, "full": layers}[shape.ac]
    stored = ((layers - checkpointed) * block + checkpointed * kept) * shape.in_flight
    chunks = shape.loss_chunk and t == 1 and shape.pp == 1
    chunk = min(shape.loss_chunk, local) if chunks else local
    vocab_share = v / t if shape.loss_sharded else v
    # Per logit: its value, the fp32 log-softmax and its gradient; loss_parallel (TP) holds
    # two fp32 buffers more (its max- and sum-reduced exponentials).
    per_logit = w + (16 if t > 1 and shape.loss_sharded else 8)
    loss = 2 * tokens * h * w + b * chunk * vocab_share * per_logit
    if chunk < local:  # trainers/loss.py's gradients made in forward
        loss += (v * h + tokens * h) * w
    copies: dict[str, float]
    if shape.dp * shape.cp * t * shape.pp == 1:
        copies = {"autocast copies": m.n_layers * m.block_params * w if w < 4 else 0}
    else:
        gathered = (2 if shape.pp == 1 else 1) * v * h * w + 2 * m.block_params * (w + 4)
        copies = {"gathered": gathered / t}
    return Estimate(
        {
            "parameters": 4 * states,
            "gradients": 4 * states,
            "optimizer": 8 * states,
            **copies,
            "activations": stored,
            # The loss's tensors are gone by the time a checkpointed block is recomputed.
            "loss or recompute": max(loss, block if checkpointed else 0),
        }
    )


def fixes(shape: Shape, limit: float, nodes: int, ranks_per_node: int) -> list[str]:
    """Changes that bring the estimate under `limit`, each with its estimate: more nodes,
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
        if tp > shape.tp and ranks_per_node % tp == 0 and shape.model.n_heads % tp == 0:
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
        f"{change} ({estimate(option).total / GIB:.0f} GiB)"
        for change, option in tried
        if estimate(option).total <= limit
    ]


def sized(machine, workload, args: dict, layout):
    """The plan's memory section for a workload with a memory model, or None; MmmError when the
    estimate is above the device's memory (MMM_ORCH_MEMORY_CHECK=0: said, not refused), when a
    size is past MAX_SIZE, or when the trainer would refuse the global batch."""
    if workload.resources.memory_model != "llama3":
        return None
    arg, size = _readers(workload, args)
    preset, model = model_of(workload, args)
    tp, pp, cp = size("tp") or 1, size("pp") or 1, size("cp") or 1
    accelerator = machine.node.gpus > 0
    batch = size("batch_size") or preset.batch_size
    dp = max(1, layout.ranks // (tp * pp * cp))
    global_batch = size("global_batch", 0) or 0
    shape = Shape(
        model,
        batch=batch,
        seq=size("seq_len") or preset.seq_len,
        dp=dp,
        tp=tp,
        ac=arg("ac") or preset.ac,
        value_bytes=2 if accelerator and arg("dtype") != "fp32" else 4,
        loss_chunk=_or(size("loss_chunk", 0), DEFAULT_LOSS_CHUNK) if tp == 1 else 0,
        attention_matrix=machine.node.attention_kernel == "math",
        pp=pp,
        schedule=arg("pp_schedule") or "1f1b",
        microbatches=micro_batches(global_batch, batch, dp) or 1,
        cp=cp,
    )
    check_global_batch(global_batch, shape)
    check_layout(shape)
    found = estimate(shape)
    device = machine.node.gpu_memory_gib if accelerator else None
    plan = MemoryPlan({k: v / GIB for k, v in found.parts.items()}, device, split(shape))
    if device and found.total > device * GIB and os.environ.get("MMM_ORCH_MEMORY_CHECK") != "0":
        better = fixes(shape, device * GIB, layout.nodes, layout.ranks_per_node)
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


def model_of(workload, args: dict) -> tuple[Preset, LlamaArgs]:
    """The preset and the model a llama3 workload's options build (the trainer's rule,
    model_shapes.run_model)."""
    arg, size = _readers(workload, args)
    return run_model(
        arg("config") or "debug",
        bool(arg("tiny")),
        size("n_layers"),
        size("vocab_size"),
        size("seq_len"),
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
    """The trainer's rules for a pipeline and a context split (model_shapes' pipeline_fault and
    context_fault), before the queue."""
    fault = pipeline_fault(
        shape.model.n_layers, shape.pp, shape.schedule, shape.microbatches, shape.batch, shape.dp
    ) or context_fault(shape.seq, shape.cp)
    if fault is not None:
        raise InvalidValue(*fault)


def _or(value, default):
    """`value`, or `default` where it is None (0 means something: the whole sequence)."""
    return default if value is None else value
