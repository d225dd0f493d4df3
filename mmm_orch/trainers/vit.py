"""Vision Transformer on synthetic images (a fixed prototype per class plus noise), FSDP2 with
bf16 autocast and optional torch.compile; reports samples/s.

    torchrun --nproc-per-node 2 -m mmm_orch.trainers.vit --tiny
"""

from __future__ import annotations

from dataclasses import dataclass

if (
    __name__ == "__main__"
):  # before torch loads: a stop during startup waits for step 1, see stop.py
    from mmm_orch.runtime import stop

    stop.catch()

import torch

from mmm_orch.options.run import RunOptions, option
from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.data import SyntheticImages, batch_indices
from mmm_orch.runtime.loop import (
    adamw,
    classifier_step,
    draw_per_rank,
    mesh,
    param_dtype,
    run_dir,
)
from mmm_orch.runtime.options import model_args, parse
from mmm_orch.runtime.profiling import region
from mmm_orch.trainers import parallelize
from mmm_orch.trainers.models.vit import VisionTransformer, VitArgs
from mmm_orch.trainers.training import Training


@dataclass(frozen=True)
class Config(RunOptions):
    """Vision Transformer with FSDP2."""

    img_size: int = option(224, ge=1, tiny=32)
    patch_size: int = option(16, ge=1, tiny=8)
    depth: int = option(24, ge=1, tiny=2)
    heads: int = option(16, ge=1, tiny=2)
    head_dim: int = option(64, ge=1, tiny=16)
    num_classes: int = option(1000, ge=2, tiny=10)
    batch_size: int = option(128, "per rank", ge=1, tiny=8)
    steps: int = option(100, ge=1)
    lr: float = option(3e-4, gt=0)
    compile: bool = False
    tiny: bool = option(False, "32 px, depth 2: for smoke tests")


def parallelized(model: VisionTransformer, cfg: Config, dp_mesh, rt) -> None:
    """`model`'s blocks compiled where asked, then FSDP2 over the data-parallel ranks."""
    if cfg.compile:
        model.blocks = torch.nn.ModuleList(parallelize.compiled(b) for b in model.blocks)
    parallelize.fsdp(model, model.blocks, dp_mesh, param_dtype(rt, cfg.dtype))


def layout(cfg: Config, rt):
    """This rank as the job builds it, for the layout check (trainers/verify.py): the model on
    the meta device, parallelized as `main` does, and one step's forward and backward."""
    from mmm_orch.trainers.verify import classifier_layout  # the check's alone

    dp_mesh = mesh(rt)["dp"]
    args = model_args(VitArgs, cfg)
    with torch.device("meta"):
        model = VisionTransformer(args)
    parallelized(model, cfg, dp_mesh, rt)
    image = (3, args.img_size, args.img_size)
    return classifier_layout(
        model, rt, dp_mesh.size(), cfg.batch_size, image, args.num_classes, cfg.dtype
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv)
    rt = runtime_dist.setup()
    dp_mesh = mesh(rt)["dp"]
    out = run_dir(cfg.output_dir, cfg.run_name, "vit", rt)
    args = model_args(VitArgs, cfg)

    torch.manual_seed(cfg.seed)
    model = VisionTransformer(args).to(rt.device.torch)
    parallelized(model, cfg, dp_mesh, rt)
    draw_per_rank(cfg.seed, rt.rank)
    optimizer = adamw(model.parameters(), rt, lr=cfg.lr, weight_decay=0.05)
    training = Training(rt, cfg, out, model, optimizer, last_step=cfg.steps)
    data = SyntheticImages((3, args.img_size, args.img_size), args.num_classes, cfg.seed)

    def train_step(step: int) -> dict:
        training.timer.start()
        with region("data"):
            batch = data.batch(batch_indices(step - 1, rt.rank, cfg.batch_size, rt.world_size))
        _, logged = classifier_step(model, optimizer, training.timer, rt, cfg.dtype, *batch)
        return logged

    return training.run(train_step)


if __name__ == "__main__":
    runtime_dist.run_main(main)
