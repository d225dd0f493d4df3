"""TensorBoard and W&B beside metrics.jsonl: the files each writes, read back here with their own
formats, hold the losses metrics.jsonl holds; a resumed run continues the same W&B run; where
they write is in the job's record (`show`)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from helpers.training import launch, steps


def wandb_history(run_file: Path) -> dict[int, dict]:
    """The history rows of a W&B run file (.wandb): after its 7-byte header (":W&B", magic,
    version), LevelDB's log format (32 KiB blocks of records with a 7-byte header: CRC, length,
    type FULL/FIRST/MIDDLE/LAST), each record a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    rows: dict[int, dict] = {}
    position, block, pending = 7, 32768, b""
    while position + 7 <= len(data):
        left = block - position % block
        length, kind = struct.unpack("<HB", data[position + 4:position + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's zero-filled tail
            position += left
            continue
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                       for item in record.history.item}
                rows[row["_step"]] = row
    return rows


def tensorboard_scalars(directory: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {event.step: event.value for event in events.Scalars(tag)}


@pytest.mark.slow
def test_tensorboard_and_wandb_hold_the_losses_of_metrics_jsonl(tmp_path):
    out = tmp_path / "out"
    common = ["--tiny", "--dtype", "fp32", "--warmup-steps", "2", "--eval-every", "3",
              "--tensorboard", "--wandb", "offline", "--checkpoint-every", "3"]
    first = launch("llama3", [*common, "--steps", "3"], 2, "torchrun", out,
                   env={"WANDB_SILENT": "true"})
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = launch("llama3", [*common, "--steps", "6", "--resume"], 2, "torchrun", out,
                     env={"WANDB_SILENT": "true"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    recorded = {r["step"]: r for r in steps(out)}
    assert sorted(recorded) == [1, 2, 3, 4, 5, 6]

    board = out / "run" / "tensorboard"
    assert tensorboard_scalars(board, "loss") == pytest.approx(
        {s: r["loss"] for s, r in recorded.items()}, rel=1e-6)  # float32 there
    assert tensorboard_scalars(board, "val_loss") == pytest.approx(
        {s: r["val_loss"] for s, r in recorded.items() if "val_loss" in r}, rel=1e-6)

    runs = sorted((out / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and len({r.name for r in runs}) == 1  # two launches, one W&B run id
    history = {step: row for run in runs for step, row in wandb_history(run).items()}
    assert {s: row["loss"] for s, row in history.items()} == \
        {s: r["loss"] for s, r in recorded.items()}
    assert {s: row["val_loss"] for s, row in history.items() if "val_loss" in row} == \
        {s: r["val_loss"] for s, r in recorded.items() if "val_loss" in r} == \
        {3: recorded[3]["val_loss"], 6: recorded[6]["val_loss"]}


def test_where_the_trackers_write_is_in_the_job_record(cli, isolated):
    result = cli("submit", "local", "llama3_debug", "--set", "tiny=true", "--set", "steps=2",
                 "--set", "tensorboard=true", "--set", "wandb=offline", "--json")
    assert result.code == 0, result.err
    record = json.loads(cli("show", str(json.loads(result.out)["id"]), "--json").out)
    run_dir = record["plan"]["run_dir"]
    assert record["plan"]["tracking"] == {"tensorboard": f"{run_dir}/tensorboard",
                                          "wandb": f"offline, {run_dir}/wandb"}
    shown = cli("show", str(record["id"])).out
    assert f"tensorboard: {run_dir}/tensorboard" in shown
    assert f"wandb:       offline, {run_dir}/wandb" in shown
    cli("cancel", str(record["id"]))
