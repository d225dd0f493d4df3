"""The runtime: what a program run by mmm-orch uses to take part in its jobs.

For your own code, the names below are the stable API (runtime/contract.py; docs/runtime.md):
`from mmm_orch import runtime; rt = runtime.setup()`. Importing this needs no torch.

The in-repo trainers use the modules under it: who am I (injob.launch_env), which device (device),
process group (dist), metrics (metrics), stop signals (stop), checkpoints (checkpoint) and profiling (profiling).
Only device, dist, checkpoint and profiling (once a window opens) import torch."""

from mmm_orch.runtime.contract import (
    EXIT_CHECKPOINTED,
    Checkpoint,
    checkpoint_path,
    checkpoint_saved,
    finish,
    latest_checkpoint,
    profile_window,
    profiled_step,
    rank,
    region,
    report_step,
    run_dir,
    setup,
    should_resume,
    stop_requested,
)

__all__ = [
    "EXIT_CHECKPOINTED",
    "Checkpoint",
    "checkpoint_path",
    "checkpoint_saved",
    "finish",
    "latest_checkpoint",
    "profile_window",
    "profiled_step",
    "rank",
    "region",
    "report_step",
    "run_dir",
    "setup",
    "should_resume",
    "stop_requested",
]
