"""The Llama trainer's parallel layouts on CPU, shared by test_pipeline and test_context_parallel:
the tiny model's options, the pipeline layouts, each layout's run made once on a worker, the
comparison with one process's losses, and a layout refused before the queue."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers.training import assert_ran, launch, steps

TINY = ["--tiny", "--n-layers", "8", "--dtype", "fp32", "--global-batch", "8", "--batch-size", "1",
        "--seq-len", "32", "--log-sample-ids"]


# A layout's run (test_pipeline's and test_context_parallel's). Four steps show each check: losses
# after optimizer steps, a validation amid the run and one at its end, and a resume from step 2
# whose step 3 needs the saved weights and step 4 the optimizer's state too. 13 held-out
# samples: the last micro-batches of a validation are partly slots.
ARGS = [*TINY, "--steps", "4", "--eval-every", "2", "--eval-samples", "13",
        "--checkpoint-every", "2"]

PIPELINE_LAYOUTS = {
    "dp2 x pp2": ["--pp", "2"],
    # 4 micro-batches of 2 (8 of 1 paid tensor parallel's collectives twice as often)
    "tp2 x pp2": ["--tp", "2", "--pp", "2", "--batch-size", "2"],
    "pp4 interleaved": ["--pp", "4", "--pp-schedule", "interleaved_1f1b"],
    "dp2 x pp2 gpipe": ["--pp", "2", "--pp-schedule", "gpipe"],
}


def losses(out: Path, key: str = "loss") -> dict[int, float]:
    """A run's `key` (the loss, or the validation loss) at each step it was logged."""
    return {r["step"]: r[key] for r in steps(out) if key in r}


def trained(out: Path) -> list[int]:
    """Every sample the run's data-parallel ranks logged, over all its steps."""
    return sorted(sample for path in (out / "run" / "samples").glob("dp-*.jsonl")
                  for line in path.read_text().splitlines()
                  for sample in json.loads(line)["samples"])


def curves(out: Path) -> dict[int, float]:
    """A run's loss at each step, and its validation loss at -step."""
    return {**losses(out), **{-s: v for s, v in losses(out, "val_loss").items()}}


# The layouts' tests of both modules share their runs (the reference, the pp2 x cp2 run that is
# resumed), so they run on one worker, one after the other: each layout its own test (its own
# failure), each run made once.
LAYOUT_RUNS = pytest.mark.xdist_group("llama3-layouts")
_MADE: dict[tuple[int, tuple[str, ...]], Path] = {}  # the runs by their ranks and options


def layout_run(tmp_path_factory, options: list[str], ranks: int = 4) -> Path:
    """The run of a layout (its options after ARGS) on `ranks` ranks (1: one process, no
    launcher), made the first time a test asks for it."""
    key = (ranks, tuple(options))
    if key not in _MADE:
        out = tmp_path_factory.mktemp("layout") / "out"
        # (a hang guard: tp2 x cp2 took over 240 s on 2 loaded cores)
        proc = launch("llama3", [*ARGS, *options], ranks, "torchrun" if ranks > 1 else "none",
                      out, timeout=600)
        assert_ran(proc, out, ranks)
        _MADE[key] = out
    return _MADE[key]


def assert_gives_one_process_s_losses(tmp_path_factory, options: list[str]) -> None:
    """The layout's loss at every step and its validation losses are those of one process (the
    global batch in micro-batches of one, no FSDP); each of the two runs trained on every sample
    once (4 steps x 8 samples)."""
    reference = layout_run(tmp_path_factory, [], ranks=1)
    layout = layout_run(tmp_path_factory, options)
    expected, found = curves(reference), curves(layout)
    assert sorted(expected) == [-4, -2, 1, 2, 3, 4]  # val_loss at steps 2 and 4
    assert sorted(found) == sorted(expected)
    for step, loss in expected.items():
        assert found[step] == pytest.approx(loss, rel=1e-4), step
    assert trained(reference) == trained(layout) == list(range(32))


def assert_refused_before_the_queue(cli, sets: list[str], said: str) -> None:
    """`submit slurm-local llama3_debug -N 2 --set ...` refused: exit 2, one line saying
    `said`, before anything is written (no job database, no record)."""
    args = [item for s in sets for item in ("--set", s)]
    result = cli("submit", "slurm-local", "llama3_debug", "-N", "2", *args)
    assert result.code == 2 and said in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "mmm-orch").exists()
