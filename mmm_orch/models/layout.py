"""How a step lays a model out over the ranks: the trainers' rules (runtime/data.py,
trainers/pipeline.py, trainers/context.py) that the plan checks before the queue
(planning/memory.py). Plain data, no torch, whatever the model."""

from __future__ import annotations

DEFAULT_LOSS_CHUNK = 1024  # tokens of a sequence whose logits exist at once (trainers/loss.py)

# Pipeline schedules (trainers/pipeline.py), and the stages each pipeline rank holds under them:
# a looped schedule puts two on each, stage r and r + pp.
PIPELINE_SCHEDULES = {"1f1b": 1, "gpipe": 1, "interleaved_1f1b": 2}


def micro_batches(global_batch: int, batch_size: int, dp: int) -> int | None:
    """The micro-batches a step accumulates on each data-parallel rank to make `global_batch`
    samples (0: one a rank), or None where batch_size x dp does not divide it: the trainer's
    rule (runtime/data.py), which the plan checks before the queue (planning/memory.py)."""
    per_forward = batch_size * dp
    return None if global_batch % per_forward else global_batch // per_forward or 1


def stage_layers(n_layers: int, stages: int) -> list[list[int]]:
    """The layers of each of `stages` pipeline stages, in order, as many on each; ValueError
    when they do not divide."""
    if n_layers % stages:
        raise ValueError(
            f"{n_layers} layers do not split into {stages} pipeline stages of as many each"
        )
    per = n_layers // stages
    return [list(range(s * per, (s + 1) * per)) for s in range(stages)]


def pipeline_fault(
    n_layers: int, pp: int, schedule: str, microbatches: int, batch: int, dp: int
) -> tuple[str, int, str] | None:
    """What makes a pipeline impossible, as (option, value, what it may be), or None: layers
    that do not split into its stages, fewer micro-batches a step (of `batch` samples on each of
    `dp` ranks) than stages, or for a looped schedule micro-batches not a multiple of pp. The
    trainer's rule (trainers/llama3.py), which the plan checks before the queue."""
    if pp == 1:
        return None
    virtual = PIPELINE_SCHEDULES[schedule]
    if n_layers % (pp * virtual):
        return (
            "pp",
            pp,
            f"a divisor of the model's {n_layers} layers into {pp * virtual} stages of as many "
            f"each ({schedule}: {virtual} a rank)",
        )
    per_forward = batch * dp
    if microbatches < pp:
        return (
            "global_batch",
            microbatches * per_forward,
            f"at least pp {pp} micro-batches of batch_size {batch} on each of {dp} "
            f"data-parallel ranks: {pp * per_forward} or more",
        )
    if virtual > 1 and microbatches % pp:
        return (
            "global_batch",
            microbatches * per_forward,
            f"micro-batches a multiple of pp {pp} ({schedule}): a multiple of {pp * per_forward}",
        )
    return None


def context_fault(seq_len: int, cp: int) -> tuple[str, int, str] | None:
    """What makes a context-parallel split impossible, as pipeline_fault says it: a sequence
    that does not cut into 2 x cp equal chunks (trainers/context.py)."""
    if cp > 1 and seq_len % (2 * cp):
        return (
            "cp",
            cp,
            f"a divisor of half the sequence length {seq_len} (each sequence is cut into 2 x cp "
            "equal chunks)",
        )
    return None


def tensor_fault(tp: int, n_heads: int, n_kv_heads: int) -> tuple[str, int, str] | None:
    """What makes a tensor-parallel split impossible, as pipeline_fault says it: heads or
    key-value heads that do not divide over tp ranks (each rank computes whole heads)."""
    if tp > 1 and (n_heads % tp or n_kv_heads % tp):
        return (
            "tp",
            tp,
            f"a divisor of the model's {n_heads} attention heads and {n_kv_heads} key-value "
            "heads (each rank computes whole heads)",
        )
    return None
