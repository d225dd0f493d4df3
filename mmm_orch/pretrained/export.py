"""A run's checkpoint handed on as a Hugging Face model directory: config.json, safetensors
shards with their index, and the tokenizer's files where the run knows them, so that
`transformers.AutoModelForCausalLM.from_pretrained(OUT)` (and vLLM, lm-eval) read the
trainer's model.

It reads the distributed checkpoint of any mesh (FSDP, TP) offline, with no process group or
GPU, one tensor at a time: each is read whole, put in Hugging Face's layout and written at its
place in a shard whose header was written first, so memory holds one tensor, not the model.
The directory appears whole or not at all.

    mmm-orch export JOB|RUN_DIR --to hf OUT [--step N] [--dtype bf16]
    python -m mmm_orch export RUN_DIR --to hf OUT      (inside a job: the same command)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import shutil
import stat
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from mmm_orch import models, paths
from mmm_orch.errors import PretrainedError, UnknownName, shown
from mmm_orch.injob import protocol, runfiles
from mmm_orch.injob.runfiles import RunFileError
from mmm_orch.models.spec import CheckpointMap
from mmm_orch.pretrained import formats
from mmm_orch.pretrained.dcp_reader import CheckedReader
from mmm_orch.pretrained.formats import HF_CONFIG, HF_INDEX

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
HF_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
DEFAULT_SHARD_BYTES = 5 << 30  # Hugging Face's usual shard size
MODEL_PREFIX = "model."  # the checkpoint's model state (runtime/checkpoint.py: {"model", "optim"})
# In export's staging directory, written by export alone and locked while it writes there.
STAGING_MARK = ".mmm-orch-export"
MAX_MANIFEST_BYTES = 16 << 20
MAX_STEP = (1 << 63) - 1  # a step the trainers count to; a longer one is no directory's name


class ExportError(ValueError):
    """Nothing to export, or nowhere to put it: one line."""


@dataclass(frozen=True)
class Exported:
    out: Path
    step: int
    files: tuple[str, ...]  # the safetensors shards
    bytes: int  # of tensors written
    tokenizer: tuple[str, ...]  # the tokenizer files copied


@dataclass(frozen=True)
class _Tensor:
    name: str  # the trainer's
    hf_name: str
    shape: tuple[int, ...]
    saved: TensorStorageMetadata

    def nbytes(self, dtype: torch.dtype) -> int:
        return int(torch.Size(self.shape).numel()) * dtype.itemsize


def export(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    dtype: str | None = None,
    tokenizer: str | Path | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Exported:
    """Step `step`'s checkpoint (the latest if None) of the run in `run_dir` as a Hugging Face
    model directory `out`, its tensors in `dtype` (fp32, bf16, fp16; None: as saved); the
    tokenizer's files from `tokenizer` (a file or directory), else from the run's --init-from
    or its dataset's manifest. ExportError for a run without that checkpoint, an `out` that
    is not empty."""
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype}: one of {', '.join(DTYPES)}")
    if step is not None and not 1 <= step <= MAX_STEP:
        raise ExportError(f"--step {shown(step)}: a checkpoint's step, from 1 to {MAX_STEP}")
    run, target = Path(run_dir), Path(out)
    _check_target(target)
    try:
        checkpoint, step = _checkpoint(run, step)
        mapped, args = saved_model(checkpoint, run)
        reader = CheckedReader(checkpoint)  # its .metadata unpickled only as checkpoint data
        tensors = _tensors(mapped, args, reader.read_metadata(), checkpoint)
    except RunFileError as exc:
        raise ExportError(str(exc)) from None
    wanted = DTYPES[dtype] if dtype else tensors[0].saved.properties.dtype
    if wanted not in SAFETENSORS_DTYPES:
        raise ExportError(f"{checkpoint}: saved in {wanted}; --dtype fp32, bf16 or fp16")
    with _Staging(target) as staging:
        shards = _shards(tensors, wanted, shard_bytes)
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        weight_map: dict[str, str] = {}
        for name, shard in zip(names, shards, strict=True):
            write_safetensors(
                staging.path / name, shard, wanted, _converted(shard, reader, mapped, args, wanted)
            )
            weight_map.update({tensor.hf_name: name for tensor in shard})
        total = sum(tensor.nbytes(wanted) for tensor in tensors)
        _write_json(
            staging.path / HF_INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map}
        )
        run_config = _run_config(run)
        copied = _copy_tokenizer(staging.path, tokenizer, run_config)
        config = {
            **mapped.hf_config(args),
            "torch_dtype": HF_DTYPE_NAMES[wanted],
            **_token_ids(run_config),
        }
        _write_json(staging.path / HF_CONFIG, config)
        staging.publish()
    return Exported(target, step, tuple(names), total, tuple(copied))


def _checkpoint(run: Path, step: int | None) -> tuple[Path, int]:
    try:
        is_dir = run.is_dir()
    except OSError as exc:  # a name too long
        raise ExportError(f"run directory {run}: {exc.strerror}") from None
    if not is_dir:
        raise ExportError(f"run directory {run}: no such directory")
    try:
        found = runfiles.latest_step(run) if step is None else step
        if found is None:
            raise ExportError(
                f"{run} saved no checkpoint (--checkpoint-every N saves them, and a stop "
                "signal or the walltime one): nothing to export"
            )
        return runfiles.existing_step_dir(run, found), found
    except RunFileError as exc:
        raise ExportError(str(exc)) from None


# The model of a checkpoint saved before the trainer kept its model's name beside it: the
# llama3 trainer's, then the only one that saved a model's shape.
UNNAMED_MODEL = "llama3"


def saved_model(checkpoint: Path, run: Path) -> tuple[CheckpointMap, Any]:
    """The model's checkpoint map (the model named beside the checkpoint, train.json's
    model_name) and its shape: beside the checkpoint (train.json's model), or in the run's
    metrics header for checkpoints saved before it was kept there."""
    train_file = checkpoint / "train.json"
    train = runfiles.read_small(train_file, 1 << 20)
    try:
        saved = json.loads(train) if train else None
    except (ValueError, RecursionError):
        raise ExportError(f"{train_file}: not the JSON the trainer writes there") from None
    saved = saved if isinstance(saved, dict) else {}
    shape = saved.get("model")
    if shape is None:
        shape = _run_config(run).get("model")
    if not isinstance(shape, dict):
        raise ExportError(
            f"{checkpoint}: no model shape beside it or in {run / protocol.METRICS_FILE}: "
            "not a checkpoint of a trainer of the registry's models"
        )
    try:
        model = models.get(saved.get("model_name", UNNAMED_MODEL), f"{train_file}: model_name")
    except UnknownName as exc:
        raise ExportError(str(exc)) from None
    if model.checkpoint is None:
        raise ExportError(f"{checkpoint}: the {model.name} model has no Hugging Face format")
    try:
        return model.checkpoint, model.checkpoint.saved_args(shape, train_file)
    except PretrainedError as exc:
        raise ExportError(str(exc)) from None


def _run_config(run: Path) -> dict[str, Any]:
    """The options the run was started with (its metrics file's first line), or {}; the paths
    among them (--init-from, --data-path) as seen from here: a relative one is the job's
    working directory's, the directory above --output-dir."""
    try:
        with runfiles.open_read(run / protocol.METRICS_FILE) as handle:
            first = json.loads(handle.readline(1 << 20) or b"{}")
    except (OSError, ValueError, RecursionError):  # (RunFileError is a ValueError)
        return {}
    config = first.get("config") if isinstance(first, dict) else None
    if not isinstance(config, dict):
        return {}
    output_dir = Path(str(config.get("output_dir") or "."))
    depth = 0 if output_dir.is_absolute() else len(output_dir.parts)
    workdir = run.resolve().parents[depth] if depth < len(run.resolve().parents) else Path("/")
    for name in ("init_from", "data_path"):
        if config.get(name):
            config[name] = str(workdir / config[name])  # an absolute path stays itself
    return config


def _tensors(
    mapped: CheckpointMap, args: Any, metadata: Metadata, checkpoint: Path
) -> list[_Tensor]:
    found = []
    for name, shape in mapped.shapes(args).items():
        saved = metadata.state_dict_metadata.get(MODEL_PREFIX + name)
        if not isinstance(saved, TensorStorageMetadata):
            raise ExportError(f"{checkpoint}: no tensor {name} in the checkpoint")
        if tuple(saved.size) != shape:
            raise ExportError(
                f"{checkpoint}: {name} has shape {list(saved.size)}, the model {list(shape)}"
            )
        found.append(_Tensor(name, mapped.hf_name(name), shape, saved))
    return found


def _shards(tensors: list[_Tensor], dtype: torch.dtype, limit: int) -> list[list[_Tensor]]:
    """Tensors in order, a new shard begun where the next would pass `limit` bytes."""
    shards: list[list[_Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes(dtype) > limit:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes(dtype)
    return shards


def _converted(
    shard: list[_Tensor],
    reader: CheckedReader,
    mapped: CheckpointMap,
    args: Any,
    dtype: torch.dtype,
) -> Iterator[torch.Tensor]:
    """The shard's tensors one at a time, read whole from the checkpoint (wherever its pieces
    were saved) and put in Hugging Face's layout and `dtype`."""
    for tensor in shard:
        whole = torch.empty(tensor.shape, dtype=tensor.saved.properties.dtype)
        try:
            with warnings.catch_warnings():  # that no process group is there: none is wanted
                warnings.filterwarnings("ignore", "torch.distributed is disabled")
                dcp.load({MODEL_PREFIX + tensor.name: whole}, storage_reader=reader, no_dist=True)
        except (CheckpointException, RuntimeError, ValueError, EOFError) as exc:
            # a shard whose bytes are not the tensor's (the sizes were checked with .metadata)
            raise ExportError(
                f"{reader.checked_dir}: {tensor.name} cannot be read from its shard, damaged "
                f"({_cause(exc)})"
            ) from None
        heads = mapped.rotated_heads(tensor.name, args)
        if heads:  # each head's rows from pair order into rotate-half order
            rows, cols = whole.shape
            whole = (
                whole.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
            )
        yield whole.to(dtype).contiguous()


def _cause(exc: BaseException) -> str:
    """What went wrong reading, in a few words: DCP's CheckpointException wraps each rank's."""
    if isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]  # (the exception, its traceback)
    if isinstance(exc, pickle.UnpicklingError):  # torch's words on it advise weights_only=False
        return "its bytes are not torch's serialization of a tensor"
    first = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def write_safetensors(
    path: Path, tensors: list[_Tensor], dtype: torch.dtype, values: Iterator[torch.Tensor]
) -> None:
    """A safetensors file of `tensors` (their Hugging Face names and shapes, in `dtype`), the
    header first (every size is known from the checkpoint), then each value as it comes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        size = tensor.nbytes(dtype)
        header[tensor.hf_name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for tensor, value in zip(tensors, values, strict=True):
            assert tuple(value.shape) == tensor.shape and value.dtype == dtype
            handle.write(value.view(torch.uint8).numpy().data)
        handle.flush()
        os.fsync(handle.fileno())


def _token_ids(run_config: dict[str, Any]) -> dict[str, Any]:
    """bos/eos ids: the --init-from model's config.json's, else the dataset's tokenizer's."""
    start = run_config.get("init_from")
    config_file = Path(start) / HF_CONFIG if start else None
    if config_file is not None and config_file.is_file():
        try:
            config = formats.read_json(config_file)
        except PretrainedError:
            config = {}
        return {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    described = _dataset_tokenizer(run_config)
    return {
        f"{end}_token_id": described[f"{end}_id"]
        for end in ("bos", "eos")
        if described.get(f"{end}_id") is not None
    }


def _dataset_tokenizer(run_config: dict[str, Any]) -> dict[str, Any]:
    data = run_config.get("data_path")
    if not data or not Path(data).is_dir():
        return {}
    try:
        manifest = json.loads(paths.read_regular(Path(data) / "manifest.json", MAX_MANIFEST_BYTES))
    except (OSError, ValueError, RecursionError):  # (paths.NotReadable is a ValueError)
        return {}
    described = manifest.get("tokenizer") if isinstance(manifest, dict) else None
    return described if isinstance(described, dict) else {}


def _copy_tokenizer(
    staging: Path, given: str | Path | None, run_config: dict[str, Any]
) -> list[str]:
    """The tokenizer's files: `given` (a file or a directory), else the --init-from
    directory's, else the file the run's dataset was tokenized with (if it is still there)."""
    files: list[Path] = []
    if given is not None:
        where = Path(given)
        if where.is_dir():
            files = [where / n for n in formats.TOKENIZER_FILES if (where / n).is_file()]
        elif where.is_file():
            files = [where]
        if not files:
            raise ExportError(f"--tokenizer {given}: no tokenizer files there")
    elif run_config.get("init_from") and Path(run_config["init_from"]).is_dir():
        where = Path(run_config["init_from"])
        files = [where / n for n in formats.TOKENIZER_FILES if (where / n).is_file()]
    else:
        described = _dataset_tokenizer(run_config)
        path = described.get("path")
        if isinstance(path, str) and Path(path).is_file():
            name = _tokenizer_name(Path(path))
            _copy_regular(Path(path), staging / name)
            return [name]
    for file in files:
        name = file.name if file.name in formats.TOKENIZER_FILES else _tokenizer_name(file)
        _copy_regular(file, staging / name)
    return [file.name for file in files]


def _copy_regular(source: Path, to: Path) -> None:
    """A tokenizer's file copied, read only where it is a regular file (a FIFO would block)."""
    try:
        fd = paths.open_regular(source)
    except paths.NotReadable as exc:
        raise ExportError(f"tokenizer {exc}") from None
    with os.fdopen(fd, "rb") as reading, open(to, "xb") as writing:
        shutil.copyfileobj(reading, writing)


def _tokenizer_name(file: Path) -> str:
    """What Hugging Face calls a tokenizer file given under another name."""
    return "tokenizer.json" if file.suffix == ".json" else "tokenizer.model"


def _check_target(target: Path) -> None:
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return  # the rename makes it
    except OSError as exc:  # a path under a file, a name too long, ...
        raise ExportError(f"--to {target}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ExportError(f"--to {target}: exists and is {runfiles.kind(target)}, not a directory")
    if any(target.iterdir()):
        raise ExportError(f"--to {target}: not empty; name a new directory")


class _Staging:
    """`.OUT.partial` beside OUT, where export writes the model before renaming it to OUT.
    Provably export's own: this export makes it (mkdir, which fails where the name is taken),
    writes STAGING_MARK in it and holds that file locked while it writes. A name there that
    export did not make (a link, a file, a directory without the mark, or not this user's) is
    refused, never removed nor followed; a leftover of an interrupted export (this user's
    directory with the mark, which no running export holds locked) is removed first. Any
    failure inside removes what this export made, and says one line."""

    def __init__(self, target: Path):
        self.target = target
        self.path = target.parent / f".{target.name}.partial"
        self.made: list[Path] = []  # directories this export made, outermost first
        self.mark: int | None = None

    def __enter__(self) -> _Staging:
        try:
            self._remove_leftover()
            missing = [self.path, *takewhile(_absent, self.path.parents)]
            for directory in reversed(missing):  # OUT's parents too, where they are not there
                directory.mkdir()
                self.made.append(directory)
            self.mark = os.open(
                self.path / STAGING_MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            )
        except OSError as exc:
            self._remove()
            raise self._refusal(exc) from None
        except BaseException:
            self._remove()
            raise
        with contextlib.suppress(OSError):  # no file locks here: a leftover is then refused
            _lock(self.mark)
        return self

    def publish(self) -> None:
        assert self.mark is not None
        os.unlink(self.path / STAGING_MARK)
        self.path.rename(self.target)  # over an empty OUT (_check_target): Linux allows it
        self.made.remove(self.path)
        os.close(self.mark)
        self.mark = None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            return  # published
        self._remove()
        if isinstance(exc, OSError):  # a full disk, a read-only one, ...
            raise self._refusal(exc) from None

    def _refusal(self, exc: OSError) -> ExportError:
        where = f"{exc.filename}: " if exc.filename else ""
        return ExportError(
            f"--to {self.target}: not exported, nothing left there ({where}{exc.strerror or exc})"
        )

    def _remove(self) -> None:
        if self.mark is not None:
            os.close(self.mark)
            self.mark = None
        if self.made and self.made[-1] == self.path:
            shutil.rmtree(self.path, ignore_errors=True)
            self.made.pop()
        for directory in reversed(self.made):
            try:
                directory.rmdir()
            except OSError:
                break  # something else was put there meanwhile: not this export's to remove
        self.made = []

    def _remove_leftover(self) -> None:
        found = runfiles.kind(self.path)
        if found == "missing":
            return
        mark = self.path / STAGING_MARK
        owned = found == "a directory" and os.lstat(self.path).st_uid == os.getuid()
        if not owned or runfiles.kind(mark) != "a regular file":
            raise ExportError(
                f"--to {self.target}: {self.path}, export's staging name, is {found} that "
                f"export did not make (no {STAGING_MARK} of its own in it): remove or rename "
                "it, or choose another OUT"
            )
        fd = os.open(mark, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            _lock(fd)
        except BlockingIOError:
            os.close(fd)
            raise ExportError(f"--to {self.target}: another export is writing it now") from None
        except OSError as exc:
            os.close(fd)
            raise ExportError(
                f"--to {self.target}: {self.path} is an export's leftover, or one still "
                f"writing: no file locks here to tell ({exc.strerror}); remove it if none is"
            ) from None
        try:
            shutil.rmtree(self.path)  # an interrupted export's, and no export holds it
        finally:
            os.close(fd)


def _absent(path: Path) -> bool:
    return not os.path.lexists(path)


def _lock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def describe(done: Exported) -> str:
    return (
        f"exported step {done.step} to {done.out}: {len(done.files)} safetensors shard(s), "
        f"{done.bytes / (1 << 20):.1f} MiB"
        + (f", tokenizer {', '.join(done.tokenizer)}" if done.tokenizer else ", no tokenizer")
    )
