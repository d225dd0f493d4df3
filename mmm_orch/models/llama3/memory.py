"""Llama 3's memory rule: the peak memory per device of a step of the llama3 trainer, by which
the planner (planning/memory.py) sizes a plan before it waits hours in a queue.

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
  kernel is the math one, the probabilities of its heads (b a s s / t, in fp32: the kernel
  upcasts bf16), with two such matrices more while the block's backward runs (the
  probabilities' gradient and the scores'); with
  checkpointing a block keeps only its input (s b h, / t under TP), and one block is recomputed at a time,
  after the loss's tensors are freed (the peak holds the larger of the two);
- the loss: the final norm's input and output, and the logits of a chunk of the sequence
  (loss_chunk tokens without TP, the whole sequence under TP, where each rank has V / t of the
  vocabulary) in w, with their log-softmax and its gradient in fp32 (and under TP one fp32
  buffer more at the peak, loss_parallel's; --verify and the CPU peaks at tp 2 hold no more);
  in chunks, the gradients made in forward wait for backward:
  the output layer's (V h w) and the final norm output's (s b h w).
With a pipeline of p stages (pp) the count is the busiest stage's: its L / p blocks' states and
activations, the embedding's or the output's states (the larger, V h), the whole stage's
parameters gathered and their gradients in fp32 ((L B / p + V h) (w + 4) / t: torch's pipeline
schedule keeps FSDP from resharding or reducing until a step's last micro-batch; found by
--verify, which put a 70B plan of 768 ranks, tp 4 x pp 2, at 67.6 GiB a device where this count
said 11.4), and the activations of the micro-batches in flight at once, which the schedule sets: GPipe all M of a step, 1F1B at
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

from mmm_orch.models.llama3.args import LlamaArgs
from mmm_orch.models.spec import Estimate, Shape


def estimate(shape: Shape) -> Estimate:
    """The peak of a step of `shape` (its model a LlamaArgs), by part."""
    m: LlamaArgs = shape.model
    w, t = shape.value_bytes, shape.tp
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
    # The math kernel computes in fp32 whatever the inputs' dtype (ATen's
    # _scaled_dot_product_attention_math upcasts bf16 for accuracy): 4 bytes a score.
    matrix = b * m.n_heads / t * local * s * 4 if shape.attention_matrix else 0
    block += matrix
    # A block's backward under the math kernel holds two matrices more than it saved: the
    # probabilities' gradient and the scores' (found by --verify on 70B plans of
    # a math-kernel profile).
    backward = 2 * matrix
    kept = tokens * h / t * w if t > 1 else tokens * h * w  # a checkpointed block's input
    # every_other checkpoints blocks 0, 2, 4, ... (trainers/parallelize.py)
    checkpointed = {"none": 0, "every_other": (layers + 1) // 2, "full": layers}[shape.ac]
    stored = ((layers - checkpointed) * block + checkpointed * kept) * shape.in_flight
    chunks = shape.loss_chunk and t == 1 and shape.pp == 1
    chunk = min(shape.loss_chunk, local) if chunks else local
    vocab_share = v / t if shape.loss_sharded else v
    # Per logit: its value, the fp32 log-softmax and its gradient; loss_parallel (TP) holds
    # one fp32 buffer more at the peak (its exponentials).
    per_logit = w + (12 if t > 1 and shape.loss_sharded else 8)
    loss = 2 * tokens * h * w + b * chunk * vocab_share * per_logit
    if chunk < local:  # trainers/loss.py's gradients made in forward
        loss += (v * h + tokens * h) * w
    copies: dict[str, float]
    if shape.dp * shape.cp * t * shape.pp == 1:
        copies = {"autocast copies": m.n_layers * m.block_params * w if w < 4 else 0}
    elif shape.pp > 1:
        # torch's schedule holds FSDP's resharding and gradient sync to a step's last
        # micro-batch (PipelineStage.backward_maybe_with_nosync): from the first backward on,
        # the whole stage stays gathered and its gradients whole, in fp32 (found by --verify)
        copies = {"gathered": held * (w + 4) / t}
    else:
        copies = {"gathered": (2 * v * h * w + 2 * m.block_params * (w + 4)) / t}
    return Estimate(
        {
            "parameters": 4 * states,
            "gradients": 4 * states,
            "optimizer": 8 * states,
            **copies,
            "activations": stored,
            # The loss's tensors are gone by the time a checkpointed block is recomputed.
            "loss or recompute": max(loss, (block if checkpointed else 0) + backward),
        }
    )
