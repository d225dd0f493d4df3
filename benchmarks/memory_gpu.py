"""The plan's memory estimate (Llama 3's rule, mmm_orch/models/llama3/memory.py) against the
peak the llama3 trainer reaches on a GPU, bf16, one rank, the 8B model's layer shape with few
layers.

    python benchmarks/memory_gpu.py measure      # on the GPU machine: results/memory_gpu.json
    python benchmarks/memory_gpu.py table        # here: the estimates beside, as a table

`measure` needs only torch (the in-job code of mmm-orch); `table` needs mmm-orch installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "memory_gpu.json"
# (preset, activation checkpointing, loss chunk) at 4 layers of the preset's shape, one
# 8192-token sequence; 3.1-8b is llama3_8b_finetune's (RoPE scaled, the same sizes).
CASES = [("8b", "none", 1024), ("8b", "none", 0), ("8b", "every_other", 1024),
         ("8b", "full", 1024), ("8b", "full", 0), ("3.1-8b", "every_other", 1024)]
SHAPE = {"n_layers": 4, "seq_len": 8192, "batch_size": 1}

ONE = r"""
import json, sys, torch
from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.data import GlobalBatch, SyntheticTokens
from mmm_orch.runtime.loop import StepTimer, adamw, mesh
from mmm_orch.runtime.options import parse
from mmm_orch.trainers.llama3 import Config, build_model, resolve, train_step
cfg = parse(Config, sys.argv[1:])
args, batch_size, seq_len, _, ac = resolve(cfg)
rt = runtime_dist.setup()
world = mesh(rt, 1)
batches = GlobalBatch.of(0, batch_size, 1, 0)
data = SyntheticTokens(args.vocab_size, seq_len, 1)
model, _, forward, _ = build_model(cfg, args, seq_len, ac, rt, world)
optimizer = adamw(model.parameters(), rt, lr=1e-4)
timer = StepTimer(rt)
torch.cuda.reset_peak_memory_stats()
for step in range(3):
    train_step(forward, data, batches, step * batches.size, timer, rt.device.torch,
               step + 1, None)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print(json.dumps({"peak_bytes": torch.cuda.max_memory_allocated(),
                  "device": torch.cuda.get_device_name(), "torch": torch.__version__}))
runtime_dist.teardown()
"""


def measure() -> None:
    rows = []
    for config, ac, chunk in CASES:
        argv = [f"--{k.replace('_', '-')}={v}" for k, v in SHAPE.items()]
        argv += ["--config", config, "--ac", ac, "--loss-chunk", str(chunk), "--dtype", "bf16"]
        proc = subprocess.run([sys.executable, "-c", ONE, *argv], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "MMM_DEVICE": "cuda"},
                              cwd=ROOT, timeout=300)
        row = {"config": config, "ac": ac, "loss_chunk": chunk}
        if proc.returncode != 0:  # said, and the other cases still measured
            row["error"] = proc.stderr[-3000:]
        else:
            row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(row, flush=True)
        rows.append(row)
        out = Path(os.environ.get("OUT", RESULTS.parent)) / RESULTS.name
        out.write_text(json.dumps({"shape": SHAPE, "rows": rows}, indent=2))


def table() -> None:
    import dataclasses

    from mmm_orch.models.llama3.args import PRESETS
    from mmm_orch.models.llama3.memory import estimate
    from mmm_orch.models.spec import GIB, Shape

    measured = json.loads(RESULTS.read_text())
    print(f"{measured['rows'][0]['device']}, torch {measured['rows'][0]['torch']}\n")
    print("| preset | ac | loss chunk | measured peak GiB | estimate GiB | estimate / measured |")
    print("|---|---|---|---|---|---|")
    for row in (row for row in measured["rows"] if "peak_bytes" in row):
        config = row.get("config", "8b")
        model = dataclasses.replace(PRESETS[config].model, n_layers=SHAPE["n_layers"])
        found = estimate(Shape(model, batch=1, seq=SHAPE["seq_len"], dp=1, tp=1, ac=row["ac"],
                               value_bytes=2, loss_chunk=row["loss_chunk"])).total
        print(f"| {config} | {row['ac']} | {row['loss_chunk'] or 'whole'} | {row['peak_bytes'] / GIB:.1f} "
              f"| {found / GIB:.1f} | {found / row['peak_bytes']:.2f} |")


if __name__ == "__main__":
    {"measure": measure, "table": table}[sys.argv[1]]()
