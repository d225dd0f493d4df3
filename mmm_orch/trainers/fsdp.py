"""MNIST CNN under FSDP2: AdamW + StepLR, per-epoch train loss, test loss and test accuracy.

Synthetic MNIST-shaped data by default (a fixed prototype per digit plus noise: learnable), or
the real IDX files from --data-dir. Each rank trains on its own slice of every global batch and
tests on its own slice of the test set.

    torchrun --nproc-per-node 2 -m mmm_orch.trainers.fsdp --tiny
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

if __name__ == "__main__":  # before torch loads: a stop during startup waits for step 1, see stop.py
    from mmm_orch.runtime import stop
    stop.catch()

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.checkpoint import Checkpointer
from mmm_orch.runtime.data import SyntheticImages, mnist, batch_indices
from mmm_orch.runtime.loop import (StepTimer, adamw, autocast, classifier_step,
                                   draw_per_rank, mean_across, mesh, param_dtype, run_dir)
from mmm_orch.runtime.metrics import MetricLogger
from mmm_orch.runtime.options import RunOptions, option, parse
from mmm_orch.trainers import parallelize
from mmm_orch.trainers.models.cnn import MnistCNN

TEST_OFFSET = 10**9  # synthetic test images are samples nobody trains on
TINY = {"train_samples": 512, "test_batch_size": 128}


@dataclass(frozen=True)
class Config(RunOptions):
    """MNIST CNN with FSDP2."""

    epochs: int = option(10, ge=1)
    batch_size: int = option(64, "per rank", ge=1)
    test_batch_size: int = option(1000, ge=1)
    lr: float = option(1e-3, gt=0)
    gamma: float = option(0.7, "StepLR decay per epoch", gt=0, le=1)
    train_samples: int = option(60000, "synthetic training images", ge=1)
    data_dir: str = option("", "MNIST IDX files; synthetic if empty", directory="existing")
    tiny: bool = option(False, "512 training, 256 test images")


def evaluate(model, test, rt, cfg: Config) -> tuple[float, float]:
    """(mean test loss, accuracy) over the whole test set, each rank scoring its own slice.
    Every rank runs the same number of forwards (FSDP gathers parameters in each one); a rank
    whose slice ran out scores one sample with weight zero."""
    model.eval()
    totals = torch.zeros(3, device=rt.device.torch)  # loss sum, correct, count
    stride = rt.world_size * cfg.test_batch_size
    with torch.no_grad(), autocast(rt, cfg.dtype):
        for start in range(0, len(test), stride):
            lo = min(start + rt.rank * cfg.test_batch_size, len(test))
            hi = min(lo + cfg.test_batch_size, len(test))
            images, labels = test.batch(torch.arange(lo, hi) if hi > lo else torch.zeros(1, dtype=torch.long))
            weight = 1.0 if hi > lo else 0.0
            logits = model(images.to(rt.device.torch)).float()
            labels = labels.to(rt.device.torch)
            totals += weight * torch.stack([
                F.cross_entropy(logits, labels, reduction="sum"),
                (logits.argmax(1) == labels).sum().float(),
                torch.tensor(float(len(labels)), device=rt.device.torch)])
    dist.all_reduce(totals)
    model.train()
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


class _Slice:
    """Synthetic set of a given size: sample i of it is image i (+ offset) of the generator."""

    def __init__(self, images: SyntheticImages, size: int, offset: int = 0):
        self.images, self.size, self.offset = images, size, offset

    def __len__(self) -> int:
        return self.size

    def batch(self, indices: torch.Tensor):
        return self.images.batch(indices % self.size + self.offset)


def open_data(cfg: Config, rt):
    """(training set, test set): MNIST's IDX files from --data-dir, else synthetic images."""
    if cfg.data_dir:
        try:
            return mnist(cfg.data_dir, "train"), mnist(cfg.data_dir, "test")
        except (OSError, ValueError) as exc:  # every rank reads the same files: all stop
            runtime_dist.refuse(rt.is_main, "fsdp", f"--data-dir {cfg.data_dir}: {exc}")
    images = SyntheticImages((1, 28, 28), 10, cfg.seed)
    return (_Slice(images, cfg.train_samples),
            _Slice(images, 256 if cfg.tiny else 10000, TEST_OFFSET))


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, tiny=TINY)
    rt = runtime_dist.setup()
    dp_mesh = mesh(rt)["dp"]
    train, test = open_data(cfg, rt)
    out = run_dir(cfg.output_dir, cfg.run_name, "fsdp", rt)

    torch.manual_seed(cfg.seed)
    model = MnistCNN().to(rt.device.torch)
    parallelize.fsdp(model, [model.conv1, model.conv2, model.fc1, model.fc2], dp_mesh,
                     param_dtype(rt, cfg.dtype))
    draw_per_rank(cfg.seed, rt.rank)
    optimizer = adamw(model.parameters(), rt, lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=cfg.gamma)
    steps_per_epoch = max(1, len(train) // (cfg.batch_size * rt.world_size))
    checkpointer = Checkpointer(out, cfg.checkpoint_every, rt.device.torch, rt.is_main,
                                cfg.keep_checkpoints)
    step = 0
    if state := checkpointer.restore(model, optimizer, cfg.resume, cfg.allow_fresh):
        step = state["step"]
        scheduler.load_state_dict(state["scheduler"])
    logger = MetricLogger(out, {**dataclasses.asdict(cfg), "world_size": rt.world_size,
                                "steps_per_epoch": steps_per_epoch},
                          enabled=rt.is_main, resumed_from=step)
    timer = StepTimer(rt)
    stop = False

    # A run stopped at an epoch's last step resumes in that epoch, to finish its LR step and test.
    for epoch in range(max(1, (step - 1) // steps_per_epoch + 1), cfg.epochs + 1):
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed + epoch))
        epoch_loss = torch.zeros((), device=rt.device.torch)
        first = step - (epoch - 1) * steps_per_epoch  # > 0 only when resuming mid-epoch
        for batch in range(first, steps_per_epoch):
            step += 1
            timer.start()
            picked = order[batch_indices(batch, rt.rank, cfg.batch_size, rt.world_size) % len(train)]
            loss, times = classifier_step(model, optimizer, timer, rt, cfg.dtype, *train.batch(picked))
            epoch_loss += loss.detach()
            logger.step(step, epoch=epoch, loss=mean_across(loss), **times,
                        samples_per_s=cfg.batch_size / times["dt"],
                        mem_gib=rt.device.memory_gib())
            stop = checkpointer.after_step(step, model, optimizer,
                                           {"scheduler": scheduler.state_dict()}, logger)
            if stop:
                break
        if stop:
            break
        scheduler.step()
        dist.all_reduce(epoch_loss)
        test_loss, test_acc = evaluate(model, test, rt, cfg)
        trained = steps_per_epoch - first  # 0 when resumed at the end of this epoch
        logger.event("epoch", epoch=epoch,
                     train_loss=epoch_loss.item() / rt.world_size / trained if trained else None,
                     test_loss=test_loss, test_acc=test_acc)
    logger.close()
    runtime_dist.teardown()
    return checkpointer.exit_code(step, cfg.epochs * steps_per_epoch)


if __name__ == "__main__":
    runtime_dist.run_main(main)
