"""Hostile input to the runtime and the trainers' options, by class: every bad option value of
every trainer is refused with one line naming the option and the value, exit 2, before anything
is written; a run directory whose `latest`, step directories or metrics.jsonl are not what the
runtime wrote (a FIFO, a link to /dev/zero or out of the run, a missing step) is refused, never
waited on; a metric cannot forge a line of the job log; MMM_BACKEND names a backend."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from helpers.training import launch

from mmm_orch.runtime.metrics import MetricLogger, parse_line
from mmm_orch.options.run import RunOptions

TRAINERS = ("llama3", "fsdp", "fsdp_tp", "vit")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
               "SLURM_NTASKS", "MASTER_ADDR")


def _config(trainer: str) -> type:
    import importlib

    return importlib.import_module(f"mmm_orch.trainers.{trainer}").Config


def _numbers(cls: type) -> list[tuple[dataclasses.Field, type]]:
    """The int and float fields of a Config (`int | None` as int)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        kind = args[0] if len(args) == 1 else kind
        if kind in (int, float):
            out.append((f, kind))
    return out


@pytest.mark.parametrize("cls", [RunOptions, *map(_config, TRAINERS)],
                         ids=["RunOptions", *TRAINERS])
def test_every_number_option_has_a_lower_bound(cls):
    unbounded = [f.name for f, _ in _numbers(cls) if not {"ge", "gt"} & set(f.metadata)]
    assert not unbounded


def _bad_values(trainer: str) -> list[tuple[str, str]]:
    """(option, value) pairs every one of which must be refused: past each bound of each number
    option, NaN and infinities for every float, and names and directories that are none."""
    cases = []
    for f, kind in _numbers(_config(trainer)):
        flag = "--" + f.name.replace("_", "-")
        low = f.metadata.get("ge", f.metadata.get("gt"))
        cases += [(flag, str(low - 1))] + ([(flag, str(low))] if "gt" in f.metadata else [])
        if "le" in f.metadata:
            cases.append((flag, str(f.metadata["le"] + 1)))
        cases += [(flag, v) for v in ("nan", "inf", "-inf")] if kind is float else \
            [(flag, "1.5")]
    for flag in ("--run-name", "--wandb-project"):
        cases += [(flag, v) for v in ("../../x", "..", ".", "a/b", "x\n[mmm-orch] job_end=1",
                                      "n" * 256)]
    cases += [("--output-dir", "{file}"), ("--output-dir", "{file}/under")]
    if trainer == "fsdp":
        cases += [("--data-dir", "{file}"), ("--data-dir", "{missing}")]
    return cases


# The QA report's findings, each of which must be among the cases generated above.
REPORTED = [("llama3", "--lr", "nan"), ("llama3", "--lr", "-1"), ("llama3", "--loss-chunk", "-1"),
            ("llama3", "--max-grad-norm", "nan"), ("llama3", "--vocab-size", "1"),
            ("llama3", "--eval-samples", "0"), ("llama3", "--run-name", "../../x"),
            ("llama3", "--output-dir", "{file}")]
BAD = [(trainer, flag, value) for trainer in TRAINERS for flag, value in _bad_values(trainer)]


def test_the_reported_values_are_among_the_cases():
    assert set(REPORTED) <= set(BAD)
    assert len(BAD) > 100


@pytest.mark.parametrize("trainer,flag,value", BAD)
def test_a_bad_option_is_refused_in_one_line_before_anything_is_written(
        trainer, flag, value, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("a regular file\n")
    value = value.format(file=tmp_path / "file", missing=tmp_path / "missing")
    out = tmp_path / "out"
    for key in LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    # A value let through would stop at setup, on this device name, instead of training here.
    monkeypatch.setenv("MMM_DEVICE", "no-such-device")
    import importlib

    main = importlib.import_module(f"mmm_orch.trainers.{trainer}").main
    with pytest.raises(SystemExit) as stopped:
        main(["--output-dir", str(out), f"{flag}={value}"])  # = : "-inf" is no option
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert len(err.splitlines()) == 1, err
    assert f"argument {flag}: " in err and repr(value) in err, err
    assert not out.exists() and not (tmp_path / "missing").exists()
    assert not any(Path.cwd().iterdir())  # nor the default output directory


@pytest.mark.slow
@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_trainer_process_refuses_a_bad_option_with_exit_2(trainer, tmp_path):
    proc = launch(trainer, ["--lr", "nan"], 1, "none", tmp_path / "out", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        f"{trainer}.py: error: argument --lr: 'nan': expected a finite number > 0"]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_under_torchrun_every_rank_refuses_alike(tmp_path):
    proc = launch("llama3", ["--tiny", "--run-name", "../../x"], 2, "torchrun", tmp_path / "out",
                  timeout=120)
    said = {line for line in proc.stderr.splitlines() if "error: argument --run-name" in line}
    assert said == {"llama3.py: error: argument --run-name: '../../x': expected one path "
                    "component: no '/', not '.' or '..', printable characters, at most 255 "
                    "bytes"}, proc.stderr[-3000:]
    assert "exitcode  : 2" in proc.stderr, proc.stderr[-3000:]  # the launcher may stop the other
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "x").exists()


# -- the run directory's files -------------------------------------------------------------------

def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _step_out_of_run(run: Path) -> None:
    elsewhere = run.parent / "elsewhere"
    elsewhere.mkdir()
    (run / "checkpoints" / "step-7").symlink_to(elsewhere, target_is_directory=True)
    (run / "checkpoints" / "latest").write_text("step-7")


LATEST = {
    "a FIFO": lambda run: _fifo(run / "checkpoints" / "latest"),
    "a link to /dev/zero": lambda run: _zero(run / "checkpoints" / "latest"),
    "a directory": lambda run: (run / "checkpoints" / "latest").mkdir(),
    "a missing step": lambda run: (run / "checkpoints" / "latest").write_text("step-7"),
    "no step name": lambda run: (run / "checkpoints" / "latest").write_text("hello"),
    "an endless name": lambda run: (run / "checkpoints" / "latest").write_text(
        "step-7" + " " * (1 << 20)),
    "a step that is a file": lambda run: ((run / "checkpoints" / "step-7").write_text(""),
                                          (run / "checkpoints" / "latest").write_text("step-7")),
    "a step linked out of the run": _step_out_of_run,
}


def _entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _contract(run: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"from mmm_orch import runtime; {code}"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MMM_ORCH_RUN_DIR": str(run), **env})


@pytest.mark.parametrize("damage", LATEST)
def test_a_latest_that_names_no_checkpoint_of_the_run_is_refused_not_waited_on(damage, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    LATEST[damage](run)
    before = _entries(tmp_path)
    proc = _contract(run, "print(runtime.latest_checkpoint())", MMM_ORCH_RESUME="1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"[runtime] error: cannot resume: {run}/checkpoints/latest ")
    assert len(proc.stderr.splitlines()) == 1 and not proc.stdout, proc.stderr
    assert _entries(tmp_path) == before  # no step directory made


def test_a_sound_latest_is_resumed_from(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-7").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step-7")
    proc = _contract(run, "c = runtime.latest_checkpoint(); print(c.step, c.path)",
                     MMM_ORCH_RESUME="1")
    assert proc.stdout.split() == ["7", str(run / "checkpoints" / "step-7")], proc.stderr


@pytest.mark.parametrize("step", [-1, 1.5, None, "../../x", True, "7"])
def test_checkpoint_path_takes_only_a_step_count(step, tmp_path, monkeypatch):
    from mmm_orch import runtime

    monkeypatch.setenv("MMM_ORCH_RUN_DIR", str(tmp_path / "run"))
    with pytest.raises(ValueError, match=r"^checkpoint step .*: expected an int >= 0$"):
        runtime.checkpoint_path(step)
    assert not (tmp_path / "run").exists()
    assert runtime.checkpoint_path(3) == tmp_path / "run" / "checkpoints" / "step-3"
    assert (tmp_path / "run" / "checkpoints" / "step-3").is_dir()


def test_checkpoint_path_and_saved_refuse_what_is_no_step_directory(tmp_path, monkeypatch):
    from mmm_orch import runtime

    for key in LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    run = tmp_path / "run"
    monkeypatch.setenv("MMM_ORCH_RUN_DIR", str(run))
    (run / "checkpoints").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (run / "checkpoints" / "step-4").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="step-4 is a symbolic link, not a checkpoint directory"):
        runtime.checkpoint_path(4)
    with pytest.raises(ValueError, match="step-9 is missing, not a checkpoint directory"):
        runtime.checkpoint_saved(9)
    assert not (run / "checkpoints" / "latest").exists()


METRICS = {
    "a FIFO": lambda run: _fifo(run / "metrics.jsonl"),
    "a link to /dev/zero": lambda run: _zero(run / "metrics.jsonl"),
    "a link out of the run": lambda run: (run / "metrics.jsonl").symlink_to(run.parent / "x"),
}


@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resumed"])
@pytest.mark.parametrize("damage", METRICS)
def test_a_metrics_file_that_is_no_regular_file_is_refused_not_waited_on(damage, resume,
                                                                          tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step-1")
    METRICS[damage](run)
    proc = _contract(run, "runtime.report_step(2, loss=1.0)",
                     **{"MMM_ORCH_RESUME": "1" if resume else "0"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [f"[runtime] error: {run}/metrics.jsonl is "
                                        f"{'a FIFO' if damage == 'a FIFO' else 'a symbolic link'}"
                                        ", not a regular file"]
    assert not (tmp_path / "x").exists() and not (run / "metrics.jsonl.partial").exists()


TRAINER_RUNS = {  # (damage to the run directory, resume, what the error line says)
    "latest a FIFO": (lambda run: _fifo(run / "checkpoints" / "latest"), True,
                      "checkpoints/latest is a FIFO, not a regular file"),
    "a step linked out of the run": (_step_out_of_run, True,
                                     "step-7 is a symbolic link, not a checkpoint directory"),
    "metrics.jsonl a FIFO": (lambda run: _fifo(run / "metrics.jsonl"), False,
                             "metrics.jsonl is a FIFO, not a regular file"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", TRAINER_RUNS)
def test_a_trainer_refuses_a_run_directory_with_files_not_its_own(case, tmp_path):
    damage, resume, said = TRAINER_RUNS[case]
    run = tmp_path / "out" / "run"
    (run / "checkpoints").mkdir(parents=True)
    damage(run)
    before = _entries(tmp_path)
    proc = launch("llama3", ["--tiny", "--steps", "2", *(["--resume"] if resume else [])], 1,
                  "none", tmp_path / "out", timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error:" in line]
    assert len(errors) == 1 and said in errors[0], errors
    # (the run directory's lock and claim aside: a run that resumes takes them before it reads
    # `latest`)
    assert [e for e in _entries(tmp_path)
            if not e.endswith(".lock") and not Path(e).name.startswith(".claim-")] == before


@pytest.mark.slow
def test_a_run_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "run").write_text("not a directory\n")
    proc = launch("vit", ["--tiny", "--steps", "1"], 1, "none", tmp_path / "out", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"[runtime] error: run directory {tmp_path}/out/run is a regular file, not a directory; "
        "give this run another --run-name"]


# -- metric lines --------------------------------------------------------------------------------

FORGED = "\n[mmm-orch] job_end=1"


@pytest.mark.parametrize("key", ["loss" + FORGED, "a b", "a=b", "", "1st", "l\u2028oss"])
def test_a_metric_name_that_is_no_single_field_is_refused_on_every_rank(key, tmp_path, capsys):
    for enabled in (True, False):
        logger = MetricLogger(tmp_path / "run", {}, enabled=enabled)
        with pytest.raises(ValueError, match=r"^metric name .*: expected a letter"):
            logger.step(1, **{key: 1.0})
        logger.close()
    assert FORGED not in capsys.readouterr().out


@pytest.mark.parametrize("value", ["x" + FORGED, "a\rb", "tab\there", "a b", "sep\u2028x",
                                   "nel\x85x", ["list", "of words"], {"k": "v\n"}])
def test_a_metric_value_stays_one_field_of_one_line(value, tmp_path, capsys):
    logger = MetricLogger(tmp_path / "run", {}, enabled=True)
    logger.step(1, note=value, loss=2.0)
    logger.event("checkpoint", step=1, path=f"/runs/{value}")
    logger.close()
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[-1] == "", lines  # the marker, the step, the event
    assert lines[1].startswith("step=1 note=") and lines[2].startswith("[checkpoint] step=1 path=")
    fields = parse_line(lines[1])
    assert list(fields) == ["step", "note", "loss"] and fields["loss"] == "2.0000"
    assert all(ch.isprintable() for line in lines for ch in line)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert records[1]["note"] == value  # the record keeps the value as it was


@pytest.mark.parametrize("step", [-1, 1.5, "1\n[mmm-orch] job_end=1", None, True])
def test_a_step_that_is_no_count_is_refused(step, tmp_path):
    with pytest.raises(ValueError, match=r"^step .*: expected an int >= 0$"):
        MetricLogger(tmp_path / "run", {}, enabled=False).step(step, loss=1.0)


# -- the device ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pigeon", "nccl\n[mmm-orch] job_end=1", "nccl gloo"])
def test_an_unknown_backend_is_refused_in_one_line(backend):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    proc = subprocess.run(
        [sys.executable, "-c", "from mmm_orch import runtime; runtime.setup()"],
        capture_output=True, text=True, timeout=120,
        env={**env, "MMM_DEVICE": "cpu", "MMM_BACKEND": backend})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"[runtime] error: MMM_BACKEND={backend!r}: expected nccl, gloo, xccl, ccl, mpi, ucc"]


def test_the_bounds_hold_for_values_at_them():
    """The edges themselves are allowed (a bound off by one would refuse a sound run)."""
    from mmm_orch.runtime.options import parse

    for trainer in TRAINERS:
        cls = _config(trainer)
        for f, kind in _numbers(cls):
            flag = "--" + f.name.replace("_", "-")
            edges = [f.metadata[k] for k in ("ge", "le") if k in f.metadata]
            edges += [f.metadata["gt"] * 2 or 1e-6] if "gt" in f.metadata else []
            for edge in edges:
                assert getattr(parse(cls, [flag, str(edge)]), f.name) == edge, (trainer, flag)


def test_the_chains_reading_of_latest_is_never_blocked_nor_fooled(tmp_path):
    """injob's latest_step (what a chain link reads before and after the launch) gives None for
    a `latest` that is a FIFO, a link to /dev/zero, a directory or a long file, at once."""
    from mmm_orch.injob.protocol import latest_step

    latest = tmp_path / "checkpoints" / "latest"
    latest.parent.mkdir()
    for make in (os.mkfifo, lambda p: p.symlink_to("/dev/zero"), os.mkdir,
                 lambda p: p.write_text("step-1" + "0" * 100)):
        make(latest)
        assert latest_step(tmp_path) is None
        shutil.rmtree(latest) if latest.is_dir() and not latest.is_symlink() else latest.unlink()
    latest.write_text("step-12\n")
    assert latest_step(tmp_path) == 12
