"""Llama 3 pre-training, torchtitan-style: the model is built on the meta device, then tensor
parallel, optional compile, activation checkpointing and FSDP2 are applied before its weights
are materialised. AdamW with warmup and cosine decay, gradient clipping, a global batch held by
gradient accumulation, synthetic tokens or a tokenized dataset (shuffled per epoch, validation
loss on its held-out split), DCP checkpoints, tokens/s per device and MFU.

    python -m mmm_orch.trainers.llama3 --config debug --tiny --steps 20
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

if (
    __name__ == "__main__"
):  # before torch loads: a stop during startup waits for step 1, see stop.py
    from mmm_orch.runtime import stop

    stop.catch()

import torch
import torch.distributed as dist

from mmm_orch import models
from mmm_orch.limits import MAX_GLOBAL_BATCH
from mmm_orch.models.layout import (
    DEFAULT_LOSS_CHUNK,
    context_fault,
    pipeline_fault,
    tensor_fault,
)
from mmm_orch.models.llama3.args import LlamaArgs
from mmm_orch.models.llama3.model import Transformer
from mmm_orch.options.run import RunOptions, option
from mmm_orch.pretrained import formats
from mmm_orch.pretrained.read import Reader, load_weights, open_reader
from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.data import GlobalBatch, SyntheticTokens
from mmm_orch.runtime.dataset import DatasetError, SampleLog, TokenDataset
from mmm_orch.runtime.dist import Runtime, refuse
from mmm_orch.runtime.flops import TokenRate, transformer_flops_per_token
from mmm_orch.runtime.loop import (
    StepTimer,
    adamw,
    data_parallel,
    draw_per_rank,
    mean_across,
    mesh,
    param_dtype,
    run_dir,
    warmup_cosine,
)
from mmm_orch.runtime.options import parse
from mmm_orch.runtime.profiling import region
from mmm_orch.trainers import parallelize, pipeline
from mmm_orch.trainers.context import ContextShard, sequence_part
from mmm_orch.trainers.loss import loss_context, token_losses
from mmm_orch.trainers.training import Training
from mmm_orch.trainers.validation import (
    SYNTHETIC_HELD_OUT,
    Offset,
    pipeline_validation_loss,
    validation_loss,
)

MODEL = models.get("llama3")


@dataclass(frozen=True)
class Config(RunOptions):
    """Llama 3 training with TP x FSDP2."""

    config: Literal["debug", "8b", "70b", "405b", "3.1-8b", "3.1-70b", "3.1-405b"] = option(
        "debug", "the model: a preset's shapes (3.1-*: Llama 3.1's, RoPE scaled to 128K)"
    )
    tp: int = option(1, ge=1)
    pp: int = option(
        1, "pipeline stages: the layers split into pp stages (x2 with interleaved_1f1b)", ge=1
    )
    pp_schedule: Literal["1f1b", "interleaved_1f1b", "gpipe"] = option(
        "1f1b", "the pipeline's schedule (a step's micro-batches: --global-batch)"
    )
    cp: int = option(
        1, "context parallel: each sequence split over cp ranks (2 x cp divides seq_len)", ge=1
    )
    steps: int = option(1000, ge=1)
    warmup_steps: int = option(200, ge=0)
    batch_size: int | None = option(None, "per data-parallel rank", ge=1)
    seq_len: int | None = option(None, ge=1)
    n_layers: int | None = option(None, ge=1)
    vocab_size: int | None = option(
        None, "the model's vocabulary (your tokenizer's size; the preset's if unset)", ge=2
    )
    lr: float | None = option(None, gt=0)
    ac: Literal["none", "every_other", "full", "selective"] | None = option(
        None,
        "activation checkpointing: every_other block (torchtitan's layer-wise selective "
        "option 2) or every block (full); the preset's if unset (selective: every_other's "
        "old name, for scripts written before the rename)",
    )
    compile: bool = False
    async_save: bool = option(
        False, "periodic checkpoints written in the background while training goes on"
    )
    loss_chunk: int = option(
        DEFAULT_LOSS_CHUNK,
        "tokens of a sequence whose logits exist at once without TP (0: all)",
        ge=0,
    )
    data_path: str = option(
        "",
        "a tokenized dataset (python -m mmm_orch.trainers.tokenize) or a flat token file; "
        "synthetic tokens if empty",
    )
    token_dtype: Literal["uint16", "uint32"] = option(
        "uint32", "a flat token file's id type (a dataset's manifest says its own)"
    )
    global_batch: int = option(
        0,
        "samples a step on any node count, by gradient accumulation (0: batch_size x dp)",
        ge=0,
        le=MAX_GLOBAL_BATCH,
    )
    max_grad_norm: float = option(1.0, "clip to this norm (0: no clip)", ge=0)
    eval_every: int = option(0, "validation loss every N steps and at the last (0: never)", ge=0)
    eval_samples: int = option(
        64, "held-out samples a validation reads (the same ones each time, on any layout)", ge=1
    )
    log_sample_ids: bool = option(
        False, "write the samples and windows each rank trained on (samples/dp-R.jsonl)"
    )
    init_from: str = option(
        "",
        "start from pretrained weights: a Hugging Face model directory (config.json, "
        "*.safetensors) or Meta's (params.json, consolidated.*.pth); a resumed run goes on "
        "from its checkpoint instead",
    )
    tiny: bool = option(False, "a 2-layer, 64-dim model with the config's RoPE, for smoke tests")


def resolve(cfg: Config) -> tuple[LlamaArgs, int, int, float, str]:
    """(model args, batch size, seq len, lr, ac) from the preset and the overrides."""
    preset, model = MODEL.build(cfg.config, cfg.tiny, cfg.n_layers, cfg.vocab_size, cfg.seq_len)
    seq_len = cfg.seq_len or preset.seq_len
    ac = "every_other" if cfg.ac == "selective" else cfg.ac or preset.ac
    return model, cfg.batch_size or preset.batch_size, seq_len, cfg.lr or preset.lr, ac


@dataclass(frozen=True)
class Forward:
    """How a batch goes through the model on this rank: the model, its pipeline (None without
    one), the context its forward and loss run in (parallelize.fsdp's), its part of each
    sequence under context parallel (None without), the TP degree, the loss's chunk and whether
    the chunks' softmax and gradient run compiled (--compile on CUDA: on the CPU its compilation
    would cost more than it saves)."""

    model: Transformer
    staged: pipeline.Pipeline | None
    precision: Callable[[], AbstractContextManager]
    context: ContextShard | None
    tp: int
    loss_chunk: int
    compile_loss: bool = False

    def place(
        self, inputs: torch.Tensor, labels: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's whole sequences as this rank feeds them: its part of each, on `device`."""
        inputs, labels = sequence_part(self.context, inputs, labels)
        return inputs.to(device), labels.to(device)


def build_model(
    cfg: Config, args, seq_len: int, ac, rt, world
) -> tuple[Transformer, list[Transformer], Forward, tuple[int, int]]:
    """The model parallelized (`parallelized`), then materialized and initialized on this rank's
    device; its stages (the model itself without a pipeline); how a batch goes through it (its
    pipeline still to build); and the parameter counts (all, embedding), taken before
    sharding."""
    model, stages, forward, counts = parallelized(
        cfg, args, seq_len, ac, world, param_dtype(rt, cfg.dtype)
    )
    model.to_empty(device=rt.device.torch)
    model.init_weights(cfg.seed)
    compile_loss = cfg.compile and rt.device.torch.type == "cuda"
    return model, stages, dataclasses.replace(forward, compile_loss=compile_loss), counts


def parallelized(
    cfg: Config, args, seq_len: int, ac, world, dtype: torch.dtype
) -> tuple[Transformer, list[Transformer], Forward, tuple[int, int]]:
    """The model on the meta device, parallelized as the job runs it: TP, context parallel, then
    this rank's pipeline stages, compile, activation checkpointing, FSDP computing in `dtype`;
    nothing allocated (trainers/verify.py checks a layout from here, under fake tensors)."""
    with torch.device("meta"):
        model = Transformer(args, seq_len)
    counts = model.count_params()
    parallelize.tensor_parallel_llama(model, world["tp"])
    context = parallelize.context_parallel(model, world["cp"])
    if cfg.pp > 1:
        model = pipeline.part(model, world["pp"], cfg.pp_schedule)
    if cfg.compile:  # inside the checkpoint wrapper: compiling around it fails with TP (see tests)
        parallelize.compile_blocks(model.layers, whole=context is None)
    parallelize.activation_checkpointing(model.layers, ac)
    stages = pipeline.stages(model, world["pp"], cfg.pp_schedule) if cfg.pp > 1 else [model]
    for stage in stages:
        precision = parallelize.fsdp(stage, stage.layers.values(), data_parallel(world), dtype)
    forward = Forward(model, None, precision, context, world["tp"].size(), cfg.loss_chunk)
    return model, stages, forward, counts


def layout(cfg: Config, rt: Runtime):
    """This rank as the job builds it, for the layout check (trainers/verify.py, a fake process
    group joined): the model from `parallelized`, and one step over the job's micro-batches,
    through a pipeline its part of the schedule's (pipeline.rehearse)."""
    from mmm_orch.trainers.verify import Layout  # the check's alone

    args, batch_size, seq_len, _, ac = resolve(cfg)
    world = mesh(rt, cfg.tp, cfg.pp, cfg.cp)
    dp = world["dp"]
    batches = GlobalBatch.of(cfg.global_batch, batch_size, dp.size(), dp.get_local_rank())
    dtype = param_dtype(rt, cfg.dtype)
    model, stages, forward, _ = parallelized(cfg, args, seq_len, ac, world, dtype)
    if forward.context is not None:
        forward.context.masks(seq_len // cfg.cp)  # made once a run, before any step
    data = SyntheticTokens(args.vocab_size, seq_len, cfg.seed)

    def step() -> None:
        if cfg.pp == 1:
            train_step(forward, data, batches, 0, StepTimer(rt), rt.device.torch, 1, None)
            return
        micro = batches.accumulation
        built = pipeline.build(stages, world["pp"], cfg.pp_schedule, micro, rt.device.torch)
        shape = (batches.batch_size, seq_len // cfg.cp, args.dim)
        pipeline.rehearse(built, micro, cfg.tp, shape, dtype)

    return Layout(model, step, tp=cfg.tp, dp=dp.size() * world["cp"].size())


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv)
    args, batch_size, seq_len, lr, ac = resolve(cfg)
    rt = runtime_dist.setup()
    world = mesh(rt, cfg.tp, cfg.pp, cfg.cp)
    dp_mesh = world["dp"]
    try:
        batches = GlobalBatch.of(
            cfg.global_batch, batch_size, dp_mesh.size(), dp_mesh.get_local_rank()
        )
        check_layout(cfg, args, batches, seq_len)
        train, val = open_data(cfg, args.vocab_size, seq_len)
        reader = None if cfg.resume else pretrained(cfg, args)  # a resume may not need it
    except ValueError as exc:  # every rank finds the same: the main one says it, all stop
        refuse(rt.is_main, "llama3", str(exc))
    out = run_dir(cfg.output_dir, cfg.run_name, "llama3", rt)

    model, stages, forward, (params, embedding_params) = build_model(
        cfg, args, seq_len, ac, rt, world
    )
    if cfg.pp > 1:
        staged = pipeline.build(
            stages, world["pp"], cfg.pp_schedule, batches.accumulation, rt.device.torch
        )
        forward = dataclasses.replace(forward, staged=staged)
    draw_per_rank(cfg.seed, rt.rank)
    optimizer = adamw(model.parameters(), rt, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = warmup_cosine(optimizer, min(cfg.warmup_steps, cfg.steps // 5 or 1), cfg.steps)
    described = {"model": dataclasses.asdict(args), "params": params, **batches.describe()}
    training = Training(
        rt, cfg, out, model, optimizer, scheduler, cfg.async_save, described, last_step=cfg.steps
    )
    start_from_weights(cfg, args, model, training, reader, rt)
    reader = None  # its maps of the files: not held through training
    step = training.step
    consumed = training.restored.get("samples", step * batches.size)  # the next sample's index
    samples = SampleLog.where(
        cfg.log_sample_ids and all(world[dim].get_local_rank() == 0 for dim in ("tp", "cp", "pp")),
        out,
        batches,
        step,
    )
    rate = TokenRate(
        transformer_flops_per_token(
            params, embedding_params, args.n_layers, args.n_heads, args.head_dim, seq_len
        ),
        rt.device.name(),
        rt.world_size,
    )
    timer, device = training.timer, rt.device.torch
    averaged = data_parallel(world).get_group()  # the ranks whose losses make the step's
    if step:
        training.logger.event(
            "resume", step=step, samples=consumed, checkpoint=str(training.checkpointer.root)
        )

    def step_of_training(step: int) -> dict:
        nonlocal consumed
        loss = train_step(forward, train, batches, consumed, timer, device, step, samples)
        with region("optimizer"):
            consumed += batches.size
            grad_norm = clip_gradients(
                model, cfg.max_grad_norm, world["pp"] if forward.staged else None
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        times = timer.stop()
        validated = validate(cfg, step, forward, val, batches, dp_mesh, averaged, device)
        return {
            "loss": mean_across(loss, averaged),
            "grad_norm": _full(grad_norm),
            "lr": scheduler.get_last_lr()[0],
            **times,
            **rate(batches.size * seq_len, times["dt"]),
            "mem_gib": rt.device.memory_gib(),
            **validated,
        }

    # The model and its shape beside each checkpoint: `mmm-orch export` reads them there.
    saved = {"model_name": MODEL.name, "model": dataclasses.asdict(args)}
    return training.run(step_of_training, lambda: {"samples": consumed, **saved})


def start_from_weights(
    cfg: Config,
    args: LlamaArgs,
    model: torch.nn.Module,
    training: Training,
    reader: Reader | None,
    rt: Runtime,
) -> None:
    """--init-from's weights into each rank's shards, on a fresh run only (a resumed one goes on
    from its own checkpoint); `reader` was opened before the run directory, or is opened now
    where a resume found no checkpoint to go on from."""
    if not cfg.init_from or training.restored:
        return
    try:
        reader = reader or pretrained(cfg, args)
    except ValueError as exc:
        refuse(rt.is_main, "llama3", str(exc))
    assert reader is not None
    read = load_weights(model, reader)
    training.logger.event("init_from", path=cfg.init_from, values_read=read)


def pretrained(cfg: Config, args: LlamaArgs) -> Reader | None:
    """A reader of --init-from's checkpoint, its configuration and shapes checked against the
    run's model (PretrainedError, a ValueError, when they differ); None without --init-from."""
    if not cfg.init_from:
        return None
    source = formats.open_source(cfg.init_from, MODEL)
    formats.check_model(source, args)
    return open_reader(source, args)


def clip_gradients(model: torch.nn.Module, max_norm: float, pp_mesh) -> torch.Tensor:
    """Clip to `max_norm` (0: no clip) the norm of all the model's gradients: with a pipeline,
    every stage's together; the norm."""
    if pp_mesh is None:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)
    return pipeline.clip_grad_norm(list(model.parameters()), max_norm, pp_mesh)


def check_layout(cfg: Config, args: LlamaArgs, batches: GlobalBatch, seq_len: int) -> None:
    """ValueError for a pipeline, a context or a tensor-parallel split the run cannot make
    (models/layout.py's pipeline_fault, context_fault and tensor_fault)."""
    fault = (
        pipeline_fault(
            args.n_layers,
            cfg.pp,
            cfg.pp_schedule,
            batches.accumulation,
            batches.batch_size,
            batches.dp,
        )
        or context_fault(seq_len, cfg.cp)
        or tensor_fault(cfg.tp, args.n_heads, args.n_kv_heads)
    )
    if fault is not None:
        name, value, allowed = fault
        raise ValueError(f"--{name.replace('_', '-')} {value}: expected {allowed}")


def validate(
    cfg: Config,
    step: int,
    forward: Forward,
    val,
    batches: GlobalBatch,
    dp_mesh,
    summed: dist.ProcessGroup,
    device: torch.device,
) -> dict[str, float]:
    """{"val_loss": ...} at the steps --eval-every names and at the last; {} at the others."""
    if not cfg.eval_every or (step % cfg.eval_every and step != cfg.steps):
        return {}
    tp, context = forward.tp, forward.context
    if forward.staged is not None:
        found = pipeline_validation_loss(
            forward.staged, val, cfg.eval_samples, batches, summed, tp, device, context
        )
        return {"val_loss": found}
    with forward.precision():
        found = validation_loss(
            forward.model,
            val,
            cfg.eval_samples,
            batches.batch_size,
            dp_mesh,
            summed,
            tp,
            forward.loss_chunk,
            device,
            context,
        )
    return {"val_loss": found}


def train_step(
    forward: Forward,
    data,
    batches: GlobalBatch,
    consumed: int,
    timer: StepTimer,
    device: torch.device,
    step: int,
    samples: SampleLog | None,
) -> torch.Tensor:
    """Forward and backward over the step's micro-batches; this rank's mean loss over its
    tokens. The timer's forward mark is at the last micro-batch's loss. Through a pipeline, the
    same samples (micro-batch m is batches.micro(consumed, m)) and the mean loss over the
    step's tokens on every stage; the forward mark at the schedule's end. Under context
    parallel each rank's loss is over its part of the tokens, as many as the others'."""
    timer.start()
    tp, staged = forward.tp, forward.staged
    if staged is not None:
        each = [batches.micro(consumed, m) for m in range(batches.accumulation)]
        inputs, labels = forward.place(*read_batch(data, torch.cat(each)), device)
        # Forwards and backwards interleave in it; a pipeline is never one rank (no autocast).
        with loss_context(tp), region("forward"):
            piped = staged.step(inputs, labels)
        timer.forward_done()
        if samples is not None:
            for indices in each:
                samples.add(step, indices, data)
        return staged.on_every_stage(piped)
    total = torch.zeros((), device=device)
    for micro in range(batches.accumulation):
        indices = batches.micro(consumed, micro)
        inputs, labels = forward.place(*read_batch(data, indices), device)
        with loss_context(tp):
            # Every sample has seq_len labels, so the micro-batches' mean losses over their
            # number is the mean over the step's tokens (FSDP averages it over the dp ranks;
            # each micro-batch's gradients are reduced to their shards at once, which keeps the
            # gradients sharded between micro-batches).
            with region("forward"), forward.precision():
                loss = (
                    token_losses(
                        forward.model,
                        inputs,
                        labels,
                        forward.loss_chunk,
                        tp,
                        compiled=forward.compile_loss,
                    )
                    / batches.accumulation
                )
            if micro == batches.accumulation - 1:
                timer.forward_done()
            with region("backward"):
                loss.backward()
        total += loss.detach()
        if samples is not None:
            samples.add(step, indices, data)
    return total


def read_batch(data, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples `indices` name (inputs, labels); a damaged dataset ends the rank with exit
    2 (found by the ranks that read it: the launcher ends the rest)."""
    try:
        with region("data"):
            return data.batch(indices)
    except DatasetError as exc:
        print(f"[llama3] error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def open_data(cfg: Config, vocab_size: int, seq_len: int):
    """(training data, validation data): a tokenized dataset's splits, a flat file (no held-out
    part: --eval-every needs a dataset), or synthetic tokens (validated on samples far past any
    a run trains on)."""
    if not cfg.data_path:
        data = SyntheticTokens(vocab_size, seq_len, cfg.seed)
        return data, Offset(data, SYNTHETIC_HELD_OUT)
    train = TokenDataset(cfg.data_path, seq_len, vocab_size, seed=cfg.seed, dtype=cfg.token_dtype)
    if not cfg.eval_every:
        return train, None
    if not Path(cfg.data_path).is_dir():
        raise ValueError(
            f"--eval-every {cfg.eval_every}: {cfg.data_path} is a flat token file "
            "with no validation split; tokenize the text into a dataset"
        )
    return train, TokenDataset(cfg.data_path, seq_len, vocab_size, split="val", shuffle=False)


def _full(value: torch.Tensor) -> float:
    """A scalar that may be a DTensor (sharded parameters give a sharded grad norm)."""
    return (value.full_tensor() if hasattr(value, "full_tensor") else value).item()


if __name__ == "__main__":
    runtime_dist.run_main(main)
