"""Peak memory of exporting a checkpoint: `mmm-orch export` (tensor by tensor into safetensors)
against torch's own recipe for one file out of a distributed checkpoint
(torch.distributed.checkpoint.format_utils.dcp_to_torch_save, which loads the whole state).

    python benchmarks/export_memory.py [--layers 8,16,32] [--dir /tmp/export-bench]

For each model size: a Llama-shaped model (dim 1024, vocabulary 32000, LAYERS blocks) saved as
the trainer saves it (DCP, model state, train.json with its shape), then each tool in its own
new process; the peak resident set (ru_maxrss of the child) and the wall time. A Python that
imports torch and does nothing is the floor.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SIZES = dict(dim=1024, n_heads=16, n_kv_heads=8, vocab_size=32000, max_seq_len=2048)


def make_checkpoint(root: Path, layers: int) -> Path:
    import torch
    import torch.distributed.checkpoint as dcp

    from mmm_orch.models.llama3.args import LlamaArgs
    from mmm_orch.models.llama3.model import Transformer

    args = LlamaArgs(n_layers=layers, **SIZES)
    run = root / f"run-{layers}"
    step = run / "checkpoints" / "step-1"
    step.mkdir(parents=True)
    torch.manual_seed(0)
    model = Transformer(args)
    model.init_weights(0)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(step), no_dist=True)
    (step / "train.json").write_text(json.dumps({"step": 1, "model": dataclasses.asdict(args)}))
    (run / "checkpoints" / "latest").write_text("step-1")
    return run


def measured(command: list[str]) -> tuple[float, float]:
    """(peak resident MiB, wall s) of `command` run in a new process (its own rusage)."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if child.returncode:
        raise SystemExit(f"{command[:4]} failed: exit {child.returncode}")
    return usage.ru_maxrss / 1024, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="8,16,32")
    parser.add_argument("--dir", default="/tmp/export-bench")
    parser.add_argument("--make", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    root = Path(options.dir)
    if options.make:
        make_checkpoint(root, options.make)
        return
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    python = sys.executable
    floor, _ = measured([python, "-c", "import torch"])
    print(f"python + import torch: {floor:.0f} MiB")
    print("| layers | checkpoint MiB | tool | peak RSS MiB | wall s |")
    print("|---|---|---|---|---|")
    for layers in sorted(int(n) for n in options.layers.split(",")):
        # Made by a child: a child forked from a parent holding the model starts with its pages.
        subprocess.run([python, __file__, "--make", str(layers), "--dir", str(root)], check=True)
        run = root / f"run-{layers}"
        size = sum(f.stat().st_size for f in run.rglob("*.distcp")) / (1 << 20)
        ours = measured([python, "-m", "mmm_orch", "export", str(run), "--to", "hf",
                         str(root / f"hf-{layers}")])  # fmt: skip
        peer = measured([python, "-c", "import sys; from torch.distributed.checkpoint.format_utils "
                         "import dcp_to_torch_save as c; c(sys.argv[1], sys.argv[2])",
                         str(run / "checkpoints" / "step-1"), str(root / f"torch-{layers}.pt")])  # fmt: skip
        print(f"| {layers} | {size:.0f} | mmm-orch export | {ours[0]:.0f} | {ours[1]:.1f} |")
        print(f"| {layers} | {size:.0f} | dcp_to_torch_save | {peer[0]:.0f} | {peer[1]:.1f} |")
        shutil.rmtree(run)
        shutil.rmtree(root / f"hf-{layers}")
        (root / f"torch-{layers}.pt").unlink()


if __name__ == "__main__":
    main()
