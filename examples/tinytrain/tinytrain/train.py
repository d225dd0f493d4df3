"""Train a small regression model with DistributedDataParallel, on any machine mmm-orch knows,
keeping mmm-orch's runtime contract: report each step, save and exit 75 when asked to stop,
go on from the latest checkpoint when told to resume.

    python -m tinytrain.train --steps 200 --checkpoint-every 20
"""

from __future__ import annotations

import argparse
import time

from mmm_orch import runtime


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tinytrain.train", allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="extra seconds per step (stands in for a bigger model)")
    return parser.parse_args()


def batch(step: int, rank: int, device):
    """The same data for a step whatever happened before it: a resumed run sees what an
    uninterrupted one would."""
    import torch

    generator = torch.Generator().manual_seed(1000 * step + rank)
    inputs = torch.randn(64, 16, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True).sin()
    return inputs.to(device), targets.to(device)


def save(step: int, model, optimizer) -> None:
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    if runtime.rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   runtime.checkpoint_path(step) / "state.pt")
    dist.barrier()  # every rank past the save before it is named the latest
    runtime.checkpoint_saved(step, save_s=time.perf_counter() - started)


def main() -> None:
    args = parse_args()
    rt = runtime.setup()  # first: the stop signals are caught from here on

    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    model = DistributedDataParallel(model.to(rt.device.torch))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    start = 0
    if (checkpoint := runtime.latest_checkpoint()) is not None:
        state = torch.load(checkpoint.path / "state.pt", map_location=rt.device.torch)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = checkpoint.step
        if rt.is_main:
            print(f"[resume] step={start} path={checkpoint.path}", flush=True)

    for step in range(start + 1, args.steps + 1):
        began = time.perf_counter()
        inputs, targets = batch(step, rt.rank, rt.device.torch)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        runtime.report_step(step, loss=loss.item(), dt=time.perf_counter() - began)
        stopping = runtime.stop_requested()  # every rank, every step: one tiny all-reduce
        if stopping or (args.checkpoint_every and step % args.checkpoint_every == 0):
            save(step, model, optimizer)
        if stopping and step < args.steps:
            runtime.finish(runtime.EXIT_CHECKPOINTED)
    runtime.finish(0)


if __name__ == "__main__":
    main()
