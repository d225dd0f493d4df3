"""Checkpoints and pretrained inputs are data: a distributed checkpoint's `.metadata` (a pickle)
that would run code is refused unread on every path that reads one (export, a resume, a rerun
--resume's trainer, --init-from), a damaged checkpoint and every OUT export cannot write are one
line with exit 2 and nothing left, export never removes nor follows a staging name it did not
make, and a config.json / params.json / FIFO in a pretrained directory is one line, not a
traceback or a hang."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from mmm_orch.injob import runfiles
from mmm_orch.injob.runfiles import RunFileError
from mmm_orch import models
from mmm_orch.models.llama3.args import LlamaArgs
from mmm_orch.models.llama3.model import Transformer
from mmm_orch.errors import PretrainedError
from mmm_orch.pretrained import formats
from mmm_orch.pretrained.export import STAGING_MARK
from mmm_orch.pretrained import checkpoint_metadata
from mmm_orch.runtime.checkpoint import Checkpointer
from helpers.training import launch

MODEL = models.get("llama3")
TINY = LlamaArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=64, max_seq_len=16,
                 multiple_of=32)
STEP = 3


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A run directory of the llama3 trainer's layout with one DCP checkpoint of a tiny model."""
    run = tmp_path_factory.mktemp("saved") / "run"
    checkpoint = run / "checkpoints" / f"step-{STEP}"
    with warnings.catch_warnings():  # no process group: none is wanted
        warnings.simplefilter("ignore")
        dcp.save({"model": Transformer(TINY).state_dict()}, checkpoint_id=str(checkpoint),
                 no_dist=True)
    (checkpoint / "train.json").write_text(
        json.dumps({"step": STEP, "model": dataclasses.asdict(TINY)}))
    (run / "checkpoints" / "latest").write_text(f"step-{STEP}")
    (run / "metrics.jsonl").write_text("")
    return run


@pytest.fixture
def run(saved_run, tmp_path) -> Path:
    """A copy of saved_run of this test's own, to damage."""
    return Path(shutil.copytree(saved_run, tmp_path / "run", symlinks=True))


def _checkpoint(run: Path) -> Path:
    return run / "checkpoints" / f"step-{STEP}"


class Payload:
    """What a hostile .metadata holds: unpickled, it runs a command that makes `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _hostile(checkpoint: Path, marker: Path) -> Path:
    metadata = checkpoint / ".metadata"
    metadata.write_bytes(pickle.dumps(Payload(marker)))
    return metadata


def _refused(result, *said: str) -> str:
    """The one line of a refusal with exit 2, holding every piece of `said`."""
    assert result.code == 2, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and all(piece in lines[0] for piece in said), result.err
    return lines[0]


def _nothing_beside(out: Path) -> None:
    """Neither OUT nor export's staging name is there."""
    assert not os.path.lexists(out) and not os.path.lexists(out.parent / f".{out.name}.partial")


# -- no code runs from a checkpoint ---------------------------------------------------------------


def test_export_refuses_a_metadata_that_would_run_code(run, tmp_path, cli, isolated):
    marker = tmp_path / "code-ran"
    metadata = _hostile(_checkpoint(run), marker)
    line = _refused(cli("export", str(run), "--to", "hf", str(tmp_path / "hf")), str(metadata),
                    "it names posix.system", "nothing of it ran")
    assert not marker.exists(), line
    _nothing_beside(tmp_path / "hf")


def test_a_resume_refuses_a_metadata_that_would_run_code_before_torch_reads_it(run, tmp_path):
    """The runtime's resume (Checkpointer.load_latest, which a rerun --resume's trainer runs)
    reads `.metadata` through the checked reader, before any tensor or process group."""
    marker = tmp_path / "code-ran"
    metadata = _hostile(_checkpoint(run), marker)
    checkpointer = object.__new__(Checkpointer)  # its files only: no process group here
    checkpointer.run_dir, checkpointer.root = run, run / "checkpoints"
    with pytest.raises(RunFileError) as refused:
        checkpointer.load_latest(Transformer(TINY), None)  # type: ignore[arg-type]
    assert str(refused.value).startswith(f"{metadata}: not a checkpoint's metadata: it names")
    assert not marker.exists()


@pytest.mark.parametrize("train", ["[" * 100_000 + "]" * 100_000, '{"step": "7"}', "[7]",
                                   '{"step": ' + "9" * 5000 + "}"])
def test_a_resume_refuses_a_train_state_that_is_not_the_trainers(train, run):
    (_checkpoint(run) / "train.json").write_text(train)
    checkpointer = object.__new__(Checkpointer)
    checkpointer.run_dir, checkpointer.root = run, run / "checkpoints"
    with pytest.raises(RunFileError, match="train.json is not the train state the trainer"):
        checkpointer.load_latest(Transformer(TINY), None)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_trainer_resuming_from_a_hostile_checkpoint_says_one_line_and_runs_nothing(
        run, tmp_path):
    marker = tmp_path / "code-ran"
    out = tmp_path / "out"
    out.mkdir()
    shutil.move(run, out / "run")
    metadata = _hostile(_checkpoint(out / "run"), marker)
    proc = launch("llama3", ["--tiny", "--steps", "4", "--resume"], 1, "none", out, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(
        f"[runtime] error: --resume: {metadata}: not a checkpoint's metadata: it names"), errors
    assert not marker.exists()


def test_init_from_a_runs_checkpoint_refuses_it_unread(run, tmp_path):
    """--init-from reads Hugging Face and Meta checkpoints, never a DCP one: its .metadata is
    not opened."""
    marker = tmp_path / "code-ran"
    _hostile(_checkpoint(run), marker)
    with pytest.raises(PretrainedError, match="neither config.json .* nor params.json"):
        formats.open_source(_checkpoint(run), MODEL)
    assert not marker.exists()


def test_the_checked_reader_admits_what_dcp_writes(saved_run):
    """The restricted unpickler reads a real checkpoint's index as torch's own reader does."""
    checked = checkpoint_metadata.read(_checkpoint(saved_run))
    own = dcp.FileSystemReader(str(_checkpoint(saved_run))).read_metadata()
    assert checked.state_dict_metadata == own.state_dict_metadata
    assert checked.storage_data == own.storage_data


# -- a damaged checkpoint: one line, exit 2, nothing written --------------------------------------


def _truncate(file: Path, keep: float) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def _flip_bytes(file: Path) -> None:
    """The shard's size kept, its first bytes (the first tensor's record) no longer torch's."""
    data = bytearray(file.read_bytes())
    data[:64] = b"\xff" * 64
    file.write_bytes(bytes(data))


DAMAGE = {
    ".metadata truncated": (lambda c: _truncate(c / ".metadata", 0.5),
                            ".metadata: not a checkpoint's metadata, or a truncated one"),
    "a shard truncated": (lambda c: _truncate(c / "__0_0.distcp", 0.9), "(truncated?)"),
    "a shard overwritten": (lambda c: _flip_bytes(c / "__0_0.distcp"),
                            "cannot be read from its shard, damaged (its bytes are not torch"),
    "a shard a FIFO": (lambda c: ((c / "__0_0.distcp").unlink(), os.mkfifo(c / "__0_0.distcp")),
                       "__0_0.distcp: a shard of the checkpoint is a FIFO"),
    "latest of step-²": (lambda c: (c.parent / "latest").write_text("step-²"),
                         "not the name of a checkpoint (step-N)"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_refused_in_one_line(damage, run, tmp_path, cli, isolated):
    spoil, said = DAMAGE[damage]
    spoil(_checkpoint(run))
    _refused(cli("export", str(run), "--to", "hf", str(tmp_path / "hf")), said)
    _nothing_beside(tmp_path / "hf")


def test_a_superscript_two_is_no_number_where_names_are_read(run, tmp_path, cli, isolated):
    """"²" is a digit to str.isdigit and not to int: the runtime's and export's `latest`
    (runfiles.latest_step), export's JOB|RUN_DIR, MASTER_PORT, a login host's port."""
    from mmm_orch.hosts import ssh
    from mmm_orch.injob import launch_env

    (run / "checkpoints" / "latest").write_text("step-²")
    with pytest.raises(RunFileError, match="not the name of a checkpoint"):
        runfiles.latest_step(run)
    _refused(cli("export", "²", "--to", "hf", str(tmp_path / "hf")),
             "run directory ²: no such directory")
    with pytest.raises(launch_env.LaunchEnvError, match="MASTER_PORT='²' is not a port number"):
        launch_env.detect({"MASTER_PORT": "²"})
    for refuse in (ssh.check_target, ssh.resolve):
        with pytest.raises(ssh.SshError):
            refuse("login.example.org:²")


# -- export's OUT: what it cannot write, one line and nothing left -------------------------------


def test_an_out_under_a_file_is_refused(run, tmp_path, cli, isolated):
    (tmp_path / "file").write_text("mine\n")
    _refused(cli("export", str(run), "--to", "hf", str(tmp_path / "file" / "hf")),
             "Not a directory")
    assert (tmp_path / "file").read_text() == "mine\n"


def test_an_out_with_a_name_too_long_is_refused(run, tmp_path, cli, isolated):
    for length in (300, 250):  # OUT's own name too long; its staging name's (9 more)
        _refused(cli("export", str(run), "--to", "hf", str(tmp_path / ("n" * length))),
                 "File name too long")
    _refused(cli("export", str(tmp_path / ("r" * 300)), "--to", "hf", str(tmp_path / "hf")),
             "File name too long")  # the run's name
    _refused(cli("export", str(run), "--step", "9" * 300, "--to", "hf", str(tmp_path / "hf")),
             "--step (an integer of 300 digits): a checkpoint's step, from 1 to")
    _nothing_beside(tmp_path / "hf")


def test_a_read_only_out_is_refused(run, cli, isolated, tmpfs):
    ro = tmpfs("ro", "ro,size=64k")
    _refused(cli("export", str(run), "--to", "hf", str(ro / "hf")),
             "not exported, nothing left there", "Read-only file system")
    assert not list(ro.iterdir())


def test_a_full_disk_leaves_nothing(run, cli, isolated, tmpfs):
    full = tmpfs("full", "size=64k")  # the model's shard is 70 kB
    _refused(cli("export", str(run), "--to", "hf", str(full / "deep" / "hf")),
             "not exported, nothing left there", "No space left on device")
    assert not list(full.iterdir())  # nor OUT's parent that export made


# -- export's staging name: its own or refused ----------------------------------------------------


def test_a_staging_directory_export_did_not_make_is_refused_and_kept(run, tmp_path, cli, isolated):
    staging = tmp_path / ".hf.partial"
    staging.mkdir()
    (staging / "thesis.tex").write_text("years of work\n")
    _refused(cli("export", str(run), "--to", "hf", str(tmp_path / "hf")),
             f"{staging}, export's staging name, is a directory that export did not make")
    assert (staging / "thesis.tex").read_text() == "years of work\n"
    assert not (tmp_path / "hf").exists()


def test_a_staging_link_is_refused_never_followed(run, tmp_path, cli, isolated):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes").write_text("kept\n")
    (tmp_path / ".hf.partial").symlink_to(mine)
    _refused(cli("export", str(run), "--to", "hf", str(tmp_path / "hf")),
             "is a symbolic link that export did not make")
    assert [p.name for p in mine.iterdir()] == ["notes"]
    assert (tmp_path / ".hf.partial").is_symlink()


def test_an_interrupted_exports_leftover_is_cleaned_and_a_running_ones_kept(
        run, tmp_path, cli, isolated):
    staging = tmp_path / ".hf.partial"
    staging.mkdir()
    (staging / STAGING_MARK).write_text("")
    (staging / "model-00001-of-00001.safetensors").write_bytes(b"half")
    with open(staging / STAGING_MARK) as held:  # an export still writing holds its mark locked
        fcntl.flock(held, fcntl.LOCK_EX)
        _refused(cli("export", str(run), "--to", "hf", str(tmp_path / "hf")),
                 "another export is writing it now")
        assert (staging / "model-00001-of-00001.safetensors").exists()
    result = cli("export", str(run), "--to", "hf", str(tmp_path / "hf"))  # now a leftover
    assert result.code == 0, result.err
    assert not staging.exists()
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]


# -- --init-from: what config.json and params.json say is data ------------------------------------

HF = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2,
      "num_hidden_layers": 1, "vocab_size": 64, "intermediate_size": 96}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
HOSTILE_CONFIGS = {
    "rope_parameters a list": ({**HF, "rope_parameters": [1, 2]}, "rope_parameters is [1, 2]"),
    "rope_scaling a string": ({**HF, "rope_scaling": "llama3"}, "rope_scaling is 'llama3'"),
    "an Infinity original context": (
        {**HF, "rope_scaling": {**LLAMA3, "original_max_position_embeddings": float("inf")}},
        "original_max_position_embeddings is inf"),
    "deep nesting": ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
    "a 5,000-digit number": (json.dumps(HF)[:-1] + ', "vocab_size": ' + "9" * 5000 + "}",
                             "not JSON (Exceeds the limit"),
    "an escape in a value": ({**HF, "model_type": "\x1b[31mllama\nFORGED"}, "\\x1b[31mllama\\n"),
}
META = {"dim": 32, "n_layers": 1, "n_heads": 2, "vocab_size": 64, "multiple_of": 32}
HOSTILE_PARAMS = {
    "ffn_dim_multiplier a string": ("1.3", "ffn_dim_multiplier is '1.3'"),
    "ffn_dim_multiplier 1e308": (1e308, "ffn_dim_multiplier is 1e+308"),
    "ffn_dim_multiplier a list": ([1.3], "ffn_dim_multiplier is [1.3]"),
}


def _config_dir(where: Path, name: str, content) -> Path:
    where.mkdir()
    (where / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return where


@pytest.mark.parametrize("case", HOSTILE_CONFIGS)
def test_a_hostile_config_json_is_one_line(case, tmp_path):
    content, said = HOSTILE_CONFIGS[case]
    where = _config_dir(tmp_path / "hf", "config.json", content)
    with pytest.raises(PretrainedError) as refused:
        formats.open_source(where, MODEL)
    assert said in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


@pytest.mark.parametrize("case", HOSTILE_PARAMS)
def test_a_hostile_params_json_is_one_line(case, tmp_path):
    value, said = HOSTILE_PARAMS[case]
    where = _config_dir(tmp_path / "meta", "params.json", {**META, "ffn_dim_multiplier": value})
    (where / "consolidated.00.pth").write_bytes(b"")
    with pytest.raises(PretrainedError, match=said.replace("[", r"\[").replace("+", r"\+")):
        formats.open_source(where, MODEL)


def test_a_hostile_config_is_refused_before_the_queue(tmp_path, cli, isolated):
    where = _config_dir(tmp_path / "hf", "config.json", {**HF, "rope_scaling": [8.0]})
    _refused(cli("submit", "local", "llama3_debug", "--set", "tiny=true", "--init-from",
                 str(where)), "config.json: rope_scaling is [8.0], not a JSON object")
    assert not (isolated.parent / "state" / "mmm-orch" / "jobs.db").exists()


def test_the_trainer_refuses_a_hostile_config_in_one_line(tmp_path):
    """The trainer's own reading (llama3.pretrained), whose PretrainedError (a ValueError) the
    trainer turns into its one error line and exit 2."""
    from mmm_orch.runtime.options import parse
    from mmm_orch.trainers.llama3 import Config, pretrained, resolve

    where = _config_dir(tmp_path / "meta", "params.json", {**META, "ffn_dim_multiplier": "x"})
    (where / "consolidated.00.pth").write_bytes(b"")
    cfg = parse(Config, ["--tiny", "--steps", "2", "--init-from", str(where)])
    with pytest.raises(PretrainedError, match="ffn_dim_multiplier is 'x'"):
        pretrained(cfg, resolve(cfg)[0])


# -- FIFOs in a pretrained directory: refused, never waited on -----------------------------------


@pytest.mark.timeout(30)
def test_a_safetensors_fifo_is_refused_not_waited_on(tmp_path):
    where = _config_dir(tmp_path / "hf", "config.json", HF)
    os.mkfifo(where / "model.safetensors")
    with pytest.raises(PretrainedError, match="model.safetensors is a FIFO"):
        formats.open_source(where, MODEL)


@pytest.mark.timeout(30)
def test_a_pth_fifo_is_refused_not_waited_on(tmp_path):
    from mmm_orch.pretrained.read import _load_pth

    where = _config_dir(tmp_path / "meta", "params.json", META)
    os.mkfifo(where / "consolidated.00.pth")
    with pytest.raises(PretrainedError, match="consolidated.00.pth is a FIFO"):
        formats.open_source(where, MODEL)  # the review before the queue, and the trainer's first look
    with pytest.raises(PretrainedError, match="consolidated.00.pth is a FIFO"):
        _load_pth(where / "consolidated.00.pth")  # the trainer's reading of the weights
