"""Experiment trackers beside metrics.jsonl: TensorBoard event files and a W&B run, on the main
rank only, each where the run's options ask for it (RunOptions: --tensorboard, --wandb). They get
every step's numbers as metrics.jsonl does; each is an optional extra, imported only here, in
the job.

W&B: `offline` writes <run>/wandb/offline-run-*/ for `wandb sync` from a login node; `online`
needs the compute nodes to reach api.wandb.ai (on ALCF and OLCF machines: `--preset proxy`) and
a login (`wandb login` once, or WANDB_API_KEY in your own environment: never in a profile). A run
resumed from its checkpoint continues the same W&B run (its id comes from the run directory).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal, Protocol

from mmm_orch.injob.protocol import TENSORBOARD_DIR, WANDB_DIR


class Tracker(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class TensorBoard:
    def __init__(self, run_dir: Path, resumed_from: int):
        from torch.utils.tensorboard import SummaryWriter  # the optional tensorboard extra

        # A resumed launch runs the steps after its checkpoint again: their old events go.
        self.writer = SummaryWriter(
            log_dir=str(run_dir / TENSORBOARD_DIR),
            purge_step=resumed_from + 1 if resumed_from else None,
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a job killed at its walltime keeps what it logged

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(
        self,
        run_dir: Path,
        mode: Literal["offline", "online"],
        project: str,
        config: dict[str, Any],
    ):
        import wandb  # the optional wandb extra

        (run_dir / WANDB_DIR).mkdir(exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=run_dir.name,
            id=run_id(run_dir),
            resume="allow",
            dir=str(run_dir),
            mode=mode,
            config=config,
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def run_id(run_dir: Path) -> str:
    """The W&B run id of a run directory: the same for every launch that continues it."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]


def open_trackers(run_dir: Path, config: dict[str, Any], resumed_from: int) -> list[Tracker]:
    """The trackers the run's options (in its config record) ask for. One that cannot start (its
    extra not installed, W&B unreachable) is said and left out: it runs on the main rank only, so
    failing there would leave the other ranks waiting in their next collective, and training
    matters more than its charts."""
    wanted: list[tuple[str, Any]] = []
    if config.get("tensorboard"):
        wanted.append(("tensorboard", lambda: TensorBoard(run_dir, resumed_from)))
    if config.get("wandb", "off") != "off":
        wanted.append(
            (
                "wandb",
                lambda: WandB(
                    run_dir, config["wandb"], config.get("wandb_project", "mmm-orch"), config
                ),
            )
        )
    trackers: list[Tracker] = []
    for name, start in wanted:
        try:
            trackers.append(start())
        except Exception as exc:  # noqa: BLE001 - any failure of an optional tracker
            hint = f" (pip install 'mmm-orch[{name}]')" if isinstance(exc, ImportError) else ""
            print(
                f"[tracking] warning: {name} did not start: {exc}{hint}; training goes on "
                "without it",
                flush=True,
            )
    return trackers


def numbers(fields: dict[str, Any]) -> dict[str, float]:
    """The fields a tracker can plot: numbers, not flags or text."""
    return {
        k: float(v)
        for k, v in fields.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
