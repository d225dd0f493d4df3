"""A Llama-style transformer on a 2-D (dp, tp) mesh: tensor parallel (parallelize_module,
column/row-wise with sequence-parallel norms) inside a TP group, FSDP2 across data-parallel ranks.

The full model is initialised from the seed on every rank before it is parallelised, so a run on
any mesh starts from the same weights as a single-process run (tests compare the two).

    torchrun --nproc-per-node 4 -m mmm_orch.trainers.fsdp_tp --tp 2 --tiny
"""

from __future__ import annotations

from dataclasses import dataclass

if (
    __name__ == "__main__"
):  # before torch loads: a stop during startup waits for step 1, see stop.py
    from mmm_orch.runtime import stop

    stop.catch()

import torch

from mmm_orch.models.llama3.args import TINY, LlamaArgs  # --tiny: llama3's tiny shape
from mmm_orch.models.llama3.model import Transformer
from mmm_orch.options.run import RunOptions, option
from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.data import SyntheticTokens, batch_indices
from mmm_orch.runtime.loop import adamw, draw_per_rank, mean_across, mesh, param_dtype, run_dir
from mmm_orch.runtime.options import model_args, parse
from mmm_orch.runtime.profiling import region
from mmm_orch.trainers import parallelize
from mmm_orch.trainers.loss import loss_context, token_losses
from mmm_orch.trainers.training import Training


@dataclass(frozen=True)
class Config(RunOptions):
    """Llama-style transformer with TP x FSDP2 on synthetic tokens."""

    tp: int = option(2, ge=1)
    dim: int = option(256, ge=1, tiny=TINY.model.dim)
    n_layers: int = option(32, ge=1, tiny=TINY.model.n_layers)
    n_heads: int = option(32, ge=1, tiny=TINY.model.n_heads)
    n_kv_heads: int = option(4, ge=1, tiny=TINY.model.n_kv_heads)
    vocab_size: int = option(32000, ge=2, tiny=TINY.model.vocab_size)
    seq_len: int = option(2048, ge=1, tiny=TINY.seq_len)
    batch_size: int = option(24, "per data-parallel rank", ge=1, tiny=TINY.batch_size)
    steps: int = option(50, ge=1)
    lr: float = option(3e-3, gt=0)
    tiny: bool = option(False, "a 2-layer, 64-dim model for smoke tests")


def parallelized(model: Transformer, cfg: Config, world, rt):
    """Tensor parallel inside the TP group, then FSDP2 over the data-parallel ranks; the context
    a forward and its loss run in (parallelize.fsdp's)."""
    parallelize.tensor_parallel_llama(model, world["tp"])
    return parallelize.fsdp(model, model.layers.values(), world["dp"], param_dtype(rt, cfg.dtype))


def placed(
    inputs: torch.Tensor, labels: torch.Tensor, rt: runtime_dist.Runtime
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch on this rank's device."""
    return inputs.to(rt.device.torch), labels.to(rt.device.torch)


def layout(cfg: Config, rt):
    """This rank as the job builds it, for the layout check (trainers/verify.py): the model on
    the meta device, parallelized as `main` does, and one step's forward and backward."""
    from mmm_orch.trainers.verify import Layout  # the check's alone

    world = mesh(rt, cfg.tp)
    dp, tp = world["dp"], world["tp"].size()
    with torch.device("meta"):
        model = Transformer(model_args(LlamaArgs, cfg, max_seq_len=cfg.seq_len, multiple_of=32))
    precision = parallelized(model, cfg, world, rt)
    data = SyntheticTokens(cfg.vocab_size, cfg.seq_len, cfg.seed)

    def step() -> None:
        inputs, labels = data.batch(
            batch_indices(0, dp.get_local_rank(), cfg.batch_size, dp.size())
        )
        with loss_context(tp):
            with precision():
                loss = token_losses(model, *placed(inputs, labels, rt), 0, tp)
            loss.backward()

    return Layout(model, step, tp=tp, dp=dp.size())


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv)
    rt = runtime_dist.setup()
    world = mesh(rt, cfg.tp)
    dp_mesh, tp_mesh = world["dp"], world["tp"]
    out = run_dir(cfg.output_dir, cfg.run_name, "fsdp_tp", rt)

    args = model_args(LlamaArgs, cfg, max_seq_len=cfg.seq_len, multiple_of=32)
    model = Transformer(args)
    model.init_weights(cfg.seed)
    model.to(rt.device.torch)
    precision = parallelized(model, cfg, world, rt)
    draw_per_rank(cfg.seed, rt.rank)

    optimizer = adamw(model.parameters(), rt, lr=cfg.lr)
    mesh_sizes = {"dp": dp_mesh.size(), "tp": tp_mesh.size()}
    training = Training(
        rt, cfg, out, model, optimizer, described={"mesh": mesh_sizes}, last_step=cfg.steps
    )
    data = SyntheticTokens(cfg.vocab_size, cfg.seq_len, cfg.seed)
    timer = training.timer

    def train_step(step: int) -> dict:
        timer.start()
        with region("data"):
            inputs, labels = data.batch(
                batch_indices(step - 1, dp_mesh.get_local_rank(), cfg.batch_size, dp_mesh.size())
            )
        with loss_context(tp_mesh.size()):  # logits sharded over the vocabulary under TP
            with region("forward"), precision():
                loss = token_losses(model, *placed(inputs, labels, rt), 0, tp_mesh.size())
            timer.forward_done()
            with region("backward"):
                loss.backward()
        with region("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)  # the original never cleared its gradients
        times = timer.stop()
        tokens_per_s = cfg.batch_size * cfg.seq_len * dp_mesh.size() / times["dt"] / rt.world_size
        return {
            "loss": mean_across(loss, dp_mesh.get_group()),
            **times,
            "tokens_per_s": tokens_per_s,
            "mem_gib": rt.device.memory_gib(),
        }

    return training.run(train_step)


if __name__ == "__main__":
    runtime_dist.run_main(main)
