"""CUDA correctness, on a GPU machine (needs only torch and this checkout):

1. the four trainers run their learning configurations on CUDA under torchrun, one rank, NCCL,
   side by side, and each one's loss falls by what tests/test_trainers.py asks on CPU;
2. the llama3 trainer's model from the same weights (drawn on the CPU, copied to the GPU),
   fp32, on one batch: the loss (whole and in chunks) and the gradients on CPU and CUDA;
3. the chunked loss on CUDA in bf16 (FSDP's parameter dtype) against one cross-entropy over the
   whole vocabulary's logits;
3b. the chunked loss's compiled softmax and gradient (the trainer's --compile on CUDA) against
   its eager path, on the 8B shape's output layer in bf16 autocast: loss, gradients, time, memory;
4. `mmm-orch submit ... --profile torch` of the llama3 trainer on this GPU (a machine profile of
   one GPU extending `local`, NCCL), then `mmm-orch profile JOB`: the kernels and the NCCL
   collective it names.

    python benchmarks/cuda_checks.py      # results: $OUT/cuda_checks.json, else benchmarks/results/
    python benchmarks/cuda_checks.py compiled_loss_bf16    # only the checks named
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LEARNING = {  # tests/test_trainers.py's learning runs, on one rank
    "fsdp": ["--tiny", "--epochs", "2"],
    "fsdp_tp": ["--tiny", "--steps", "40", "--tp", "1"],
    "vit": ["--tiny", "--steps", "30"],
    "llama3": ["--tiny", "--steps", "40", "--warmup-steps", "5"],
}


def trainers_learn(work: Path) -> dict:
    procs = {}
    for port, (trainer, args) in enumerate(LEARNING.items(), start=29610):
        out = work / trainer
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
               f"--master-port={port}", "-m", f"mmm_orch.trainers.{trainer}", *args,
               "--output-dir", str(out), "--run-name", "run"]
        procs[trainer] = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True,
                                          env={**os.environ, "MMM_DEVICE": "cuda",
                                               "PYTHONPATH": os.pathsep.join(
                                                   [str(ROOT), os.environ.get("PYTHONPATH", "")])})
    results = {}
    for trainer, proc in procs.items():
        log = proc.communicate(timeout=300)[0]
        row = {"exit": proc.returncode}
        metrics = work / trainer / "run" / "metrics.jsonl"
        if metrics.exists():
            records = [json.loads(line) for line in metrics.read_text().splitlines()]
            losses = [r["loss"] for r in records if r["event"] == "step"]
            first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
            row.update(steps=len(losses), first5=first, last5=last, falls=last < first - 0.3,
                       mem_gib=max((r.get("mem_gib") or 0) for r in records
                                   if r["event"] == "step"))
        if proc.returncode:
            row["log_tail"] = log[-3000:]
        results[trainer] = row
    return results


def same_batch_cpu_and_cuda() -> dict:
    import torch

    from mmm_orch.trainers.llama3 import Config, resolve
    from mmm_orch.trainers.loss import token_losses
    from mmm_orch.models.llama3.model import Transformer

    args, batch, seq, _, _ = resolve(Config(config="debug", seq_len=256, batch_size=4))
    cpu = Transformer(args)
    cpu.init_weights(seed=1)
    gpu = Transformer(args).cuda()
    gpu.load_state_dict(cpu.state_dict())
    tokens = torch.randint(args.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    result = {"model": f"debug ({args.n_layers} layers, dim {args.dim}, vocab {args.vocab_size}), "
                       f"batch {batch} x {seq} tokens, fp32",
              "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    for chunk in (0, 64):
        losses, grads = {}, {}
        for name, model, device in (("cpu", cpu, "cpu"), ("cuda", gpu, "cuda")):
            model.zero_grad()
            loss = token_losses(model, inputs.to(device), labels.to(device), chunk, tp=1)
            loss.backward()
            losses[name] = loss.item()
            grads[name] = {k: p.grad.detach().cpu() for k, p in model.named_parameters()}
        worst = max(((grads["cuda"][k] - g).norm() / g.norm()).item()
                    for k, g in grads["cpu"].items())
        result[f"chunk_{chunk}"] = {"loss_cpu": losses["cpu"], "loss_cuda": losses["cuda"],
                                    "abs_diff": abs(losses["cpu"] - losses["cuda"]),
                                    "worst_grad_rel_diff": worst,
                                    "within_1e-4": abs(losses["cpu"] - losses["cuda"]) <= 1e-4}
    return result


def chunked_loss_bf16_on_cuda() -> dict:
    import torch
    import torch.nn.functional as F

    from mmm_orch.trainers.loss import token_losses

    torch.manual_seed(0)
    vocab, dim, seq = 128256, 1024, 2048

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = torch.nn.Parameter(torch.randn(1, seq, dim, device="cuda",
                                                         dtype=torch.bfloat16))
            self.output = torch.nn.Linear(dim, vocab, bias=False, device="cuda",
                                          dtype=torch.bfloat16)

        def forward(self, tokens, hidden_only=False):
            return self.hidden if hidden_only else self.output(self.hidden)

    head = Head()
    labels = torch.randint(vocab, (1, seq), device="cuda")
    tokens = torch.zeros_like(labels)
    out = {}
    for chunk in (0, 512):
        head.zero_grad()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = token_losses(head, tokens, labels, chunk, tp=1)
        loss.backward()
        torch.cuda.synchronize()
        out[chunk] = (loss.item(), head.hidden.grad.float(), head.output.weight.grad.float(),
                      (torch.cuda.max_memory_allocated() - base) / 2**30)
    whole, chunked = out[0], out[512]
    reference = F.cross_entropy((head.hidden.double() @ head.output.weight.double().T)[0],
                                labels[0]).item()
    return {"shape": f"vocab {vocab}, dim {dim}, {seq} tokens, bf16",
            "loss_whole": whole[0], "loss_chunked": chunked[0], "loss_fp64": reference,
            "grad_hidden_rel_diff": ((chunked[1] - whole[1]).norm() / whole[1].norm()).item(),
            "grad_weight_rel_diff": ((chunked[2] - whole[2]).norm() / whole[2].norm()).item(),
            "peak_gib_whole": whole[3], "peak_gib_chunked": chunked[3]}


def compiled_loss_bf16_on_cuda() -> dict:
    """The trainer's loss as --compile runs it on one GPU (fp32 output weight, bf16 autocast,
    8192 tokens of the 8B shape in chunks of 1024), compiled chunks against eager ones: the
    loss, both gradients, the median time of loss and backward over 5 repeats, the peak."""
    import statistics

    import torch

    from mmm_orch.trainers.loss import token_losses

    torch.manual_seed(0)
    vocab, dim, seq, chunk = 128256, 4096, 8192, 1024

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = torch.nn.Parameter(torch.randn(1, seq, dim, device="cuda"))
            self.output = torch.nn.Linear(dim, vocab, bias=False, device="cuda")

        def forward(self, tokens, hidden_only=False):
            return self.hidden.to(torch.bfloat16) if hidden_only else self.output(self.hidden)

    head = Head()
    labels = torch.randint(vocab, (1, seq), device="cuda")
    tokens = torch.zeros_like(labels)
    out: dict = {}
    for compiled in (False, True):
        times = []
        for _ in range(6):  # the first: compilation and warm-up, left out
            head.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            started = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = token_losses(head, tokens, labels, chunk, tp=1, compiled=compiled)
            loss.backward()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        out[compiled] = {"loss": loss.item(), "grad_hidden": head.hidden.grad.clone(),
                         "grad_weight": head.output.weight.grad.clone(),
                         "ms": round(1000 * statistics.median(times[1:]), 2),
                         "first_ms": round(1000 * times[0], 1),
                         "peak_gib": (torch.cuda.max_memory_allocated() - base) / 2**30}
    eager, fused = out[False], out[True]

    def rel(name):
        return ((fused[name] - eager[name]).norm() / eager[name].norm()).item()

    return {"shape": f"vocab {vocab}, dim {dim}, {seq} tokens, chunks of {chunk}, "
                     "fp32 weight, bf16 autocast",
            "loss_eager": eager["loss"], "loss_compiled": fused["loss"],
            "grad_hidden_rel_diff": rel("grad_hidden"), "grad_weight_rel_diff": rel("grad_weight"),
            "ms_eager": eager["ms"], "ms_compiled": fused["ms"],
            "first_call_ms_eager": eager["first_ms"], "first_call_ms_compiled": fused["first_ms"],
            "peak_gib_eager": eager["peak_gib"], "peak_gib_compiled": fused["peak_gib"]}


ONE_GPU = """\
extends: local
name: one-gpu
description: this machine's one GPU, NCCL (benchmarks/cuda_checks.py)
node: {cores: 16, gpus: 1, device: DEVICE}
ranks_per_node: 1
backend: BACKEND
"""


def profile_through_the_cli(work: Path, device: str = "cuda") -> dict:
    """The user's path: submit with --profile torch on the local executor, wait, read the
    profile. `device` cpu (gloo) runs the same steps on a machine without a GPU."""
    (work / "machines").mkdir(parents=True)
    backend = "nccl" if device == "cuda" else "gloo"
    (work / "machines" / "one-gpu.yaml").write_text(
        ONE_GPU.replace("DEVICE", device).replace("BACKEND", backend))
    env = {**os.environ, "MMM_ORCH_PATH": str(work), "MMM_ORCH_DB": str(work / "jobs.db"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cli = [sys.executable, "-m", "mmm_orch"]
    submitted = subprocess.run(
        [*cli, "submit", "one-gpu", "llama3_debug", "--profile", "torch", "--follow", "--set",
         "steps=8", "--set", f"tiny={device == 'cpu'}", "--set", f"output_dir={work / 'runs'}"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    result: dict = {"submit_exit": submitted.returncode, "submit_tail": submitted.stdout[-1500:]
                    + submitted.stderr[-1500:]}
    shown = subprocess.run([*cli, "profile", "1"], cwd=work, env=env, capture_output=True,
                           text=True, timeout=120)
    as_json = subprocess.run([*cli, "profile", "1", "--json"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=120)
    result.update(profile_exit=shown.returncode, profile=shown.stdout[-6000:] + shown.stderr[-800:])
    if as_json.returncode == 0:
        text = as_json.stdout
        result["names_nccl"] = "nccl" in text.lower()
        result["names_kernels"] = any(word in text for word in ("gemm", "nvjet", "cutlass",
                                                                 "flash", "cudnn", "triton"))
    return result


def main() -> None:
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results") / "cuda_checks.json"
    report: dict = {}
    only = sys.argv[1:]
    for name, check in (("same_batch_cpu_and_cuda", same_batch_cpu_and_cuda),
                        ("chunked_loss_bf16", chunked_loss_bf16_on_cuda),
                        ("compiled_loss_bf16", compiled_loss_bf16_on_cuda),
                        ("trainers_learn", lambda: trainers_learn(Path(tempfile.mkdtemp()))),
                        ("profile_through_the_cli",
                         lambda: profile_through_the_cli(Path(tempfile.mkdtemp()) / "cli"))):
        if only and name not in only:
            continue
        started = time.monotonic()
        try:
            report[name] = check()
        except Exception as exc:  # one broken check must not hide the others' results
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        report[name + "_s"] = round(time.monotonic() - started, 1)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(name, json.dumps(report[name], default=str)[:1500], flush=True)


if __name__ == "__main__":
    main()
