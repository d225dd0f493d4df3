"""--async-save: periodic checkpoints written in the background while training goes on, each
renamed into place only once every rank wrote its part, the stop signal's save waited for, and a
run resumed from one continuing the very loss curve."""

from __future__ import annotations

import json

import pytest

from helpers.training import launch, sigterm_llama3_after, steps

pytestmark = pytest.mark.slow  # trainings, real jobs or processes for seconds


def _saves(out) -> list[dict]:
    return [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()
            if '"event": "checkpoint"' in line]


def test_async_saves_complete_prune_and_resume_on_the_same_curve(tmp_path):
    common = ["--tiny", "--dtype", "fp32", "--warmup-steps", "2", "--checkpoint-every", "2"]
    reference = launch("llama3", [*common, "--steps", "6"], 2, "torchrun", tmp_path / "sync")
    assert reference.returncode == 0, reference.stderr[-3000:]
    out = tmp_path / "async"
    first = launch("llama3", [*common, "--steps", "6", "--async-save", "--keep-checkpoints",
                              "2"], 2, "torchrun", out)
    assert first.returncode == 0, first.stderr[-3000:]
    saves = _saves(out)
    assert [s["step"] for s in saves] == [2, 4, 6]
    assert all(0 < s["blocking_s"] <= s["save_s"] for s in saves)
    assert sorted(p.name for p in (out / "run" / "checkpoints").iterdir()) == \
        ["latest", "step-4", "step-6"]
    assert [r["loss"] for r in steps(out)] == [r["loss"] for r in steps(tmp_path / "sync")]

    (out / "run" / "checkpoints" / "latest").write_text("step-4")  # back to an async save
    resumed = launch("llama3", [*common, "--steps", "6", "--async-save", "--resume"], 2,
                     "torchrun", out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = {r["step"]: r["loss"] for r in steps(out)}
    reference_curve = {r["step"]: r["loss"] for r in steps(tmp_path / "sync")}
    for step in (5, 6):
        assert abs(again[step] - reference_curve[step]) < 1e-5, step


def test_the_stop_signal_waits_for_its_save_with_async_saves(tmp_path):
    out = tmp_path / "out"
    proc = sigterm_llama3_after(out, "checkpoint", 2, ["--checkpoint-every", "2", "--async-save"])
    assert proc.returncode == 75, proc.stderr[-3000:]
    last = _saves(out)[-1]
    assert last["reason"] == "signal"
    assert (out / "run" / "checkpoints" / "latest").read_text() == f"step-{last['step']}"
    assert not list((out / "run" / "checkpoints").glob(".*partial"))
