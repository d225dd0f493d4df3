"""Pipeline parallel for the Llama trainer, as torchtitan composes it: the model split by layers
into stages (the embedding on the first, the final norm and output on the last), each rank of
the pipeline dimension holding one stage (1F1B, GPipe) or V of them looped round the pipeline
(interleaved 1F1B); a step's micro-batches go through torch.distributed.pipelining's schedule.

A rank's stages are parts of one model (mmm_orch/models/llama3/model.py, Transformer.part): its
`part` holds all of them, its parameters named as in the whole model, so the optimizer, gradient
clipping and the DCP checkpoint see one module, and a run saved at one `pp` resumes at
another."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    _ComputationType,
)
from torch.distributed.tensor import DTensor

from mmm_orch.models.layout import PIPELINE_SCHEDULES, stage_layers
from mmm_orch.models.llama3.model import Transformer
from mmm_orch.trainers.loss import loss_context

_SINGLE = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
_LOOPED = {"interleaved_1f1b": ScheduleInterleaved1F1B}
assert {*_SINGLE, *_LOOPED} == set(PIPELINE_SCHEDULES)


@dataclass
class Pipeline:
    """This rank's stages of the pipeline and their schedule."""

    stages: list[PipelineStage]
    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    mesh: DeviceMesh  # the pipeline dimension

    @property
    def first(self) -> bool:
        return any(stage.is_first for stage in self.stages)

    @property
    def last(self) -> bool:
        return any(stage.is_last for stage in self.stages)

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The step's micro-batches forward and backward; the mean of their losses on the rank
        holding the last stage, 0 on the others."""
        losses = self._run(self.schedule.step, inputs, labels)
        if not losses:
            return torch.zeros((), device=inputs.device)
        return torch.stack(losses).mean()

    def evaluate(self, inputs: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """The micro-batches forward only; each one's mean loss over its tokens whose label is
        not IGNORED, on the rank holding the last stage ([] on the others)."""
        return self._run(self.schedule.eval, inputs, labels)

    def _run(self, run, inputs: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        run(*args, target=labels if self.last else None, losses=losses)
        # Under TP each loss is a DTensor, replicated over the TP group.
        plain = [loss.full_tensor() if isinstance(loss, DTensor) else loss for loss in losses]
        return [loss.detach() for loss in plain]

    def train(self, mode: bool) -> None:
        for stage in self.stages:
            stage.submod.train(mode)

    def on_every_stage(self, value: torch.Tensor) -> torch.Tensor:
        """A value the last stage's ranks hold (0 on the others), summed to every stage."""
        value = value.clone()
        dist.all_reduce(value, group=self.mesh.get_group())
        return value


def part(model: Transformer, pp_mesh: DeviceMesh, schedule: str) -> Transformer:
    """This rank's part of `model`: its stage, or for a looped schedule its two, stage r and
    r + pp (the embedding where it holds the first, the norm and output where the last)."""
    mine, layers = _stages_here(model.args.n_layers, pp_mesh, schedule)
    owned = [layer for index in mine for layer in layers[index]]
    return model.part(owned, first=0 in mine, last=len(layers) - 1 in mine)


def stages(part: Transformer, pp_mesh: DeviceMesh, schedule: str) -> list[Transformer]:
    """The stages of this rank's part, in order, each a part of it (its modules shared)."""
    mine, layers = _stages_here(part.args.n_layers, pp_mesh, schedule)
    return [part.part(layers[i], first=i == 0, last=i == len(layers) - 1) for i in mine]


def _stages_here(n_layers: int, pp_mesh: DeviceMesh, schedule: str) -> tuple[list[int], list]:
    pp, rank = pp_mesh.size(), pp_mesh.get_local_rank()
    virtual = PIPELINE_SCHEDULES[schedule]
    return [rank + pp * v for v in range(virtual)], stage_layers(n_layers, pp * virtual)


def build(
    stages: list[Transformer], pp_mesh: DeviceMesh, schedule: str, microbatches: int, device
) -> Pipeline:
    """The pipeline of this rank's `stages` (parallelized and materialized) under `schedule`,
    `microbatches` a step; each micro-batch's loss its mean over its tokens (the schedule
    averages the gradients over the micro-batches: the step's mean, as without a pipeline)."""
    pp, rank = pp_mesh.size(), pp_mesh.get_local_rank()
    total = pp * len(stages)
    built: list[Any] = [  # the schedules' own type for a list of stages is private
        PipelineStage(stage, rank + pp * v, total, device, group=pp_mesh.get_group())
        for v, stage in enumerate(stages)
    ]
    if schedule in _LOOPED:
        chosen: PipelineScheduleSingle | PipelineScheduleMulti = _LOOPED[schedule](
            built, n_microbatches=microbatches, loss_fn=token_loss
        )
    else:
        chosen = _SINGLE[schedule](built[0], n_microbatches=microbatches, loss_fn=token_loss)
    return Pipeline(built, chosen, pp_mesh)


def rehearse(
    built: Pipeline, microbatches: int, tp: int, shape: tuple[int, int, int], dtype: torch.dtype
) -> None:
    """This rank's part of one step of `built`'s schedule with no neighbour to send or receive
    (trainers/verify.py, under fake tensors): its actions in order (`actions`), each stage's
    forward or backward, FSDP's gradient sync held to the last as the schedule holds it. What
    the neighbours would send arrives in receive buffers, one per micro-batch for activations
    (a stage after the first) and for gradients (a stage before the last), held for the
    pipeline's life as PipelineStage holds them; `shape` is a micro-batch's (batch, this rank's
    part of the sequence, model width), the activations between stages split over the sequence
    under TP; the first stage's tokens are zeros."""
    batch, seq, dim = shape
    by_index = {stage.stage_index: stage for stage in built.stages}
    tokens = torch.zeros(batch, seq, dtype=torch.long)
    hidden = (batch, seq // tp if tp > 1 else seq, dim)

    def buffers(wanted: bool) -> list[torch.Tensor]:
        return [torch.empty(hidden, dtype=dtype) for _ in range(microbatches if wanted else 0)]

    received = {i: buffers(not s.is_first) for i, s in by_index.items()}
    gradients = {i: buffers(not s.is_last) for i, s in by_index.items()}
    kept: dict[tuple[int, int], tuple] = {}
    backwards: dict[int, int] = defaultdict(int)
    for index, kind, micro in actions(built, built.mesh.get_local_rank(), microbatches):
        stage = by_index[index]
        if kind == _ComputationType.FORWARD:
            inputs = (
                tokens if stage.is_first else received[index][micro].detach().requires_grad_(True)
            )
            with loss_context(tp):
                out = stage.submod(inputs)
                if stage.is_last:
                    out = token_loss(out, tokens)
            kept[(index, micro)] = (inputs, out)
        elif kind == _ComputationType.FULL_BACKWARD:
            inputs, out = kept.pop((index, micro))
            backwards[index] += 1
            with loss_context(tp):
                stage.backward_maybe_with_nosync(
                    "full",
                    {
                        "stage_output": out if stage.is_last else (out,),
                        "output_grads": None if stage.is_last else (gradients[index][micro],),
                        "input_values": () if stage.is_first else (inputs,),
                    },
                    last_backward=backwards[index] == microbatches,
                )
        elif kind == _ComputationType.REDUCE_GRAD:
            stage.perform_reduce_grad(microbatches)


def actions(built: Pipeline, pp_rank: int, microbatches: int) -> list[tuple]:
    """(stage index, F/B/REDUCE_GRAD, micro-batch) in the order this pipeline rank runs them:
    a looped schedule's own `pipeline_order`; for one stage a rank, the order its
    `_step_microbatches` runs (whose `pipeline_order`, drawn for display, is not it: torch 2.13
    numbers the last stage's micro-batches from 1 there): GPipe every forward then every
    backward, 1F1B min(M, stages - stage) forwards, then a backward and a forward in turn."""
    schedule = built.schedule
    F_, B = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
    if isinstance(schedule, PipelineScheduleMulti):
        return [
            (a.stage_index, a.computation_type, a.microbatch_index)
            for a in schedule.pipeline_order[pp_rank]
            if a is not None
        ]
    stage = built.stages[0].stage_index
    if isinstance(schedule, ScheduleGPipe):
        order = [(F_, m) for m in range(microbatches)] + [(B, m) for m in range(microbatches)]
    else:
        warmup = min(microbatches, built.stages[0].num_stages - stage)
        order = [(F_, m) for m in range(warmup)]
        for m in range(microbatches):
            order.append((B, m))
            if warmup + m < microbatches:
                order.append((F_, warmup + m))
    return [(stage, kind, m) for kind, m in order] + [(stage, _ComputationType.REDUCE_GRAD, None)]


IGNORED = -100  # a label the loss leaves out (a validation slot past the held-out samples)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A micro-batch's mean cross-entropy over its tokens (under TP, inside loss_parallel, the
    logits sharded over the vocabulary), those labelled IGNORED left out."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORED)


def clip_grad_norm(
    parameters: list[torch.nn.Parameter], max_norm: float, pp_mesh: DeviceMesh
) -> torch.Tensor:
    """Clip to the norm of every stage's gradients together (each rank holds some stages'); the
    norm."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):  # sharded gradients: the norm over the dp and tp ranks
        norm = norm.full_tensor()
    squared = norm.float() ** 2
    dist.all_reduce(squared, group=pp_mesh.get_group())
    norm = squared.sqrt()
    if max_norm:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm
