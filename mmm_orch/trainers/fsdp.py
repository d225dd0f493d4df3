"""MNIST CNN under FSDP2: AdamW + StepLR, per-epoch train loss, test loss and test accuracy.

Synthetic MNIST-shaped data by default (a fixed prototype per digit plus noise: learnable), or
the real IDX files from --data-dir. Each rank trains on its own slice of every global batch and
tests on its own slice of the test set.

    torchrun --nproc-per-node 2 -m mmm_orch.trainers.fsdp --tiny
"""

from __future__ import annotations

from dataclasses import dataclass

if (
    __name__ == "__main__"
):  # before torch loads: a stop during startup waits for step 1, see stop.py
    from mmm_orch.runtime import stop

    stop.catch()

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mmm_orch.options.run import RunOptions, option
from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.data import SyntheticImages, batch_indices, mnist
from mmm_orch.runtime.loop import (
    adamw,
    autocast,
    classifier_step,
    draw_per_rank,
    mesh,
    param_dtype,
    run_dir,
)
from mmm_orch.runtime.options import parse
from mmm_orch.runtime.profiling import region
from mmm_orch.trainers import parallelize
from mmm_orch.trainers.models.cnn import MnistCNN
from mmm_orch.trainers.training import Training

TEST_OFFSET = 10**9  # synthetic test images are samples nobody trains on


@dataclass(frozen=True)
class Config(RunOptions):
    """MNIST CNN with FSDP2."""

    epochs: int = option(10, ge=1)
    batch_size: int = option(64, "per rank", ge=1)
    test_batch_size: int = option(1000, ge=1, tiny=128)
    lr: float = option(1e-3, gt=0)
    gamma: float = option(0.7, "StepLR decay per epoch", gt=0, le=1)
    train_samples: int = option(60000, "synthetic training images", ge=1, tiny=512)
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
            images, labels = test.batch(
                torch.arange(lo, hi) if hi > lo else torch.zeros(1, dtype=torch.long)
            )
            weight = 1.0 if hi > lo else 0.0
            logits = model(images.to(rt.device.torch)).float()
            labels = labels.to(rt.device.torch)
            totals += weight * torch.stack(
                [
                    F.cross_entropy(logits, labels, reduction="sum"),
                    (logits.argmax(1) == labels).sum().float(),
                    torch.tensor(float(len(labels)), device=rt.device.torch),
                ]
            )
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
    return (
        _Slice(images, cfg.train_samples),
        _Slice(images, 256 if cfg.tiny else 10000, TEST_OFFSET),
    )


def parallelized(model: MnistCNN, cfg: Config, dp_mesh, rt) -> None:
    """FSDP2 over the data-parallel ranks, each layer its own unit."""
    units = [model.conv1, model.conv2, model.fc1, model.fc2]
    parallelize.fsdp(model, units, dp_mesh, param_dtype(rt, cfg.dtype))


def layout(cfg: Config, rt):
    """This rank as the job builds it, for the layout check (trainers/verify.py): the model on
    the meta device, parallelized as `main` does, and one step's forward and backward."""
    from mmm_orch.trainers.verify import classifier_layout  # the check's alone

    dp_mesh = mesh(rt)["dp"]
    with torch.device("meta"):
        model = MnistCNN()
    parallelized(model, cfg, dp_mesh, rt)
    return classifier_layout(model, rt, dp_mesh.size(), cfg.batch_size, (1, 28, 28), 10, cfg.dtype)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv)
    rt = runtime_dist.setup()
    dp_mesh = mesh(rt)["dp"]
    train, test = open_data(cfg, rt)
    out = run_dir(cfg.output_dir, cfg.run_name, "fsdp", rt)

    torch.manual_seed(cfg.seed)
    model = MnistCNN().to(rt.device.torch)
    parallelized(model, cfg, dp_mesh, rt)
    draw_per_rank(cfg.seed, rt.rank)
    optimizer = adamw(model.parameters(), rt, lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=cfg.gamma)
    steps_per_epoch = max(1, len(train) // (cfg.batch_size * rt.world_size))
    training = Training(
        rt,
        cfg,
        out,
        model,
        optimizer,
        scheduler,
        described={"steps_per_epoch": steps_per_epoch},
        last_step=cfg.epochs * steps_per_epoch,
    )
    epoch = Epoch(cfg, rt, train, steps_per_epoch)

    def train_step(step: int) -> dict:
        training.timer.start()
        with region("data"):
            batch = epoch.batch(step)
        loss, logged = classifier_step(model, optimizer, training.timer, rt, cfg.dtype, *batch)
        epoch.add(loss)
        return {"epoch": epoch.number, **logged}

    def after_step(step: int) -> None:
        """At an epoch's last step: its LR step, its test, and its line in the metrics."""
        if step % steps_per_epoch:
            return
        scheduler.step()
        test_loss, test_acc = evaluate(model, test, rt, cfg)
        training.logger.event(
            "epoch",
            epoch=epoch.number,
            train_loss=epoch.mean_loss(),
            test_loss=test_loss,
            test_acc=test_acc,
        )
        epoch.reset()

    # A run stopped at an epoch's last step resumes in that epoch, to finish its LR step and test.
    if training.step:
        epoch.enter(training.step)
        after_step(training.step)
    return training.run(train_step, after_step=after_step)


class Epoch:
    """Where the run is in its epochs: each epoch's order of the training samples (shuffled
    from the seed and the epoch), and the loss of the steps this process trained in it."""

    def __init__(self, cfg: Config, rt, train, steps_per_epoch: int):
        self.cfg, self.rt, self.train, self.steps_per_epoch = cfg, rt, train, steps_per_epoch
        self.number = 0
        self.order: torch.Tensor | None = None  # the epoch's, drawn on entering it
        self.reset()

    def enter(self, step: int) -> int:
        """Into the epoch step N falls in (its order shuffled once); N's place in it."""
        number, within = divmod(step - 1, self.steps_per_epoch)
        if number + 1 != self.number:
            self.number = number + 1
            self.order = torch.randperm(
                len(self.train),
                generator=torch.Generator().manual_seed(self.cfg.seed + self.number),
            )
        return within

    def batch(self, step: int):
        """Step N's batch of this rank."""
        within = self.enter(step)
        assert self.order is not None  # enter() drew it
        picked = self.order[
            batch_indices(within, self.rt.rank, self.cfg.batch_size, self.rt.world_size)
            % len(self.train)
        ]
        return self.train.batch(picked)

    def add(self, loss: torch.Tensor) -> None:
        self.loss += loss.detach()
        self.trained += 1

    def mean_loss(self) -> float | None:
        """The epoch's mean training loss over every rank (None: resumed at its end, no step
        of it trained here)."""
        dist.all_reduce(self.loss)
        return self.loss.item() / self.rt.world_size / self.trained if self.trained else None

    def reset(self) -> None:
        self.loss = torch.zeros((), device=self.rt.device.torch)
        self.trained = 0


if __name__ == "__main__":
    runtime_dist.run_main(main)
