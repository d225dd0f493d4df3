"""Tokenize a text corpus into a dataset the trainers read (runtime/dataset.py): run here as a
command, or submitted as the `tokenize` workload on any number of CPU ranks.

    python -m mmm_orch.trainers.tokenize --input corpus/ --tokenizer tokenizer.json --out data/c4

Document g of the corpus (in file order) is tokenized by rank g mod world, between BOS and EOS,
into that rank's train or validation shard: the validation split is a fixed fraction of the
documents, picked by a hash of g, so it does not depend on the number of ranks.

The ranks write their shards into a directory beside --out (`.NAME.tokenize-new`); rank 0 adds
manifest.json and only then puts that directory in the place of --out (_replace). So --out holds,
whatever stops the run (bad input, a full disk, a kill), the old dataset or the new one, whole, and
a run that fails leaves nothing behind. One tokenize at a time may write a given --out.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch.distributed as dist

from mmm_orch.injob import launch_env, protocol
from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.dataset import (
    FORMAT,
    MANIFEST,
    SHARD_FILE,
    SPLITS,
    dtype_for,
    replacement_dirs,
    shard_name,
)
from mmm_orch.runtime.options import parse
from mmm_orch.runtime.text import (
    MAX_DOCUMENT_CHARS,
    TextError,
    documents,
    input_files,
    load_tokenizer,
)

PROGRESS_EVERY = 60.0  # seconds between a rank's progress lines (workloads/tokenize.yaml)


@dataclass(frozen=True)
class Config:
    """Tokenize text into a mmm-orch token dataset (shards, manifest, validation split)."""

    input: str = field(
        default="",
        metadata={
            "help": "files or directories, comma-separated (.txt/.md: blank-line-separated "
            "documents; .jsonl: one per line; .parquet: one per row); a document may have "
            f"at most {MAX_DOCUMENT_CHARS} characters"
        },
    )
    tokenizer: str = field(
        default="",
        metadata={
            "help": "tokenizer.json, a tiktoken BPE file (Llama 3's tokenizer.model) or a "
            "SentencePiece model"
        },
    )
    out: str = field(
        default="",
        metadata={
            "help": "the dataset directory to write (built beside it, then renamed into place)"
        },
    )
    text_field: str = field(default="text", metadata={"help": "the JSON field or Parquet column"})
    val_fraction: float = field(default=0.01, metadata={"help": "documents held out, 0-0.5"})
    eos_token: str = field(default="", metadata={"help": "a Hugging Face tokenizer's EOS token"})
    bos_token: str = field(default="", metadata={"help": "a Hugging Face tokenizer's BOS token"})
    overwrite: bool = field(default=False, metadata={"help": "replace a dataset already there"})


def is_validation(document: int, fraction: float) -> bool:
    """Whether document `document` is held out: Knuth's multiplicative hash spreads consecutive
    documents evenly over [0, 1)."""
    return (document * 2654435761 % 2**32) / 2**32 < fraction


class OutputError(Exception):
    """The dataset could not be written (a full disk, a quota, a file-size limit)."""


class ShardWriter:
    """Token ids appended to one file, with their count, documents, largest id and SHA-256."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.code = path, "H" if dtype == "uint16" else "I"
        try:
            self.file = open(path, "xb")  # noqa: SIM115 - closed by close() or abandon()
        except OSError as exc:
            raise OutputError(exc.strerror) from None
        self.digest = hashlib.sha256()
        self.buffer = array.array(self.code)
        self.tokens = self.documents = 0
        self.max_id = -1

    def add(self, ids: list[int]) -> None:
        self.buffer.extend(ids)
        self.documents += 1
        self.max_id = max(self.max_id, max(ids))
        if len(self.buffer) >= 1 << 20:
            self._flush()

    def _flush(self) -> None:
        data = self.buffer.tobytes()  # native byte order, as the reader maps it
        try:
            self.file.write(data)
        except OSError as exc:
            raise OutputError(exc.strerror) from None
        self.digest.update(data)
        self.tokens += len(self.buffer)
        self.buffer = array.array(self.code)

    def close(self) -> dict:
        """The shard's statistics, once it is on disk (synced: the dataset is renamed into place
        next, and must not be one with holes after a crash)."""
        self._flush()
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
        except OSError as exc:
            raise OutputError(exc.strerror) from None
        return {
            "tokens": self.tokens,
            "documents": self.documents,
            "max_id": self.max_id,
            "sha256": self.digest.hexdigest(),
        }

    def abandon(self) -> None:
        with contextlib.suppress(OSError):  # the data still buffered cannot be written: dropped
            self.file.close()


def _refuse(message: str) -> NoReturn:
    """Exit 2 over what every rank found wrong before the process group: the first rank says
    it, once (the job's log holds one line however many ranks the launcher started)."""
    try:
        first = launch_env.locate(os.environ).rank == 0
    except launch_env.LaunchEnvError:  # a launch runtime_dist.setup would refuse: said anyway
        first = True
    if first:
        print(f"[tokenize] error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _options(argv: list[str] | None) -> Config:
    """The options, or exit 2 with argparse's complaint on one line (its usage text, five lines
    before it, would bury it)."""
    complaint = io.StringIO()
    try:
        with contextlib.redirect_stderr(complaint):
            return parse(Config, argv)
    except SystemExit as exc:
        if exc.code == 0:  # --help, printed on stdout
            raise
        said = complaint.getvalue().strip().splitlines()[-1]  # "PROG: error: WHAT"
        _refuse(f"{said.split(': error: ', 1)[-1]} (see --help)")


def _checked(cfg: Config):
    """The input files, the tokenizer and the output directory (absolute), or exit 2 naming what
    is wrong (before anything is written)."""
    for name in ("input", "tokenizer", "out"):
        if not getattr(cfg, name):
            _refuse(f"--{name} is missing")
    if not 0 <= cfg.val_fraction <= 0.5:
        _refuse(f"--val-fraction {cfg.val_fraction} is invalid: a fraction from 0 to 0.5")
    try:
        files = input_files([p for p in cfg.input.split(",") if p])
        tokenizer = load_tokenizer(cfg.tokenizer, cfg.eos_token, cfg.bos_token)
    except (TextError, ImportError) as exc:
        _refuse(str(exc))
    return files, tokenizer, _output_dir(cfg)


def _output_dir(cfg: Config) -> Path:
    """--out, absolute (through symlinks: the directory they lead to is the one replaced), once
    it can take the dataset: a directory (or a path to one) that can be written, holding no
    files but a dataset's, and none of those unless --overwrite."""
    out = Path(os.path.realpath(cfg.out))
    if out == out.parent:
        _refuse(f"--out {cfg.out!r} is the root directory: name a directory in it")
    _restore_interrupted(out, cfg)
    existing = next(p for p in (out, *out.parents) if os.path.lexists(p))
    if not existing.is_dir():
        _refuse(
            f"--out {cfg.out!r} is not a directory"
            if existing == out
            else f"--out {cfg.out!r}: {existing} is a file, not a directory"
        )
    # The parent takes the new directory and the renames; --out itself loses the old files.
    for directory in {existing, out.parent} if existing == out else {existing}:
        if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
            _refuse(f"--out {cfg.out!r}: cannot write in {directory} (read-only, or not yours)")
    if existing == out:
        foreign = sorted(
            name for name in os.listdir(out) if name != MANIFEST and not SHARD_FILE.fullmatch(name)
        )
        if foreign:
            _refuse(
                f"--out {cfg.out!r} holds files that are not a dataset's "
                f"({', '.join(foreign[:3])}): replacing it would delete them; choose another "
                "directory"
            )
        if (out / MANIFEST).exists() and not cfg.overwrite:
            _refuse(f"--out {cfg.out!r} already holds a dataset: pass --overwrite to replace it")
    return out


def _restore_interrupted(out: Path, cfg: Config) -> None:
    """A run killed between the two renames of _replace left --out missing and the old dataset,
    whole, aside: put it back. Every rank may try: the first rename wins, the others find it
    done (the aside gone, or --out there again)."""
    _, aside = replacement_dirs(out)
    if os.path.lexists(out) or not aside.is_dir():
        return
    try:
        os.rename(aside, out)
    except OSError as exc:
        if not os.path.lexists(out):
            _refuse(
                f"--out {cfg.out!r}: a stopped run left its dataset in {aside}, and it "
                f"cannot be put back: {exc.strerror}"
            )


def _prepare(out: Path, cfg: Config, created: list[Path]) -> str:
    """Rank 0: what a killed run left removed (its unfinished directory; the old dataset it had
    replaced), then the empty directory the ranks write into, and the directories above --out
    it needs (listed in `created`). What went wrong, or ""."""
    new, aside = replacement_dirs(out)
    try:
        if os.path.lexists(aside) and os.path.lexists(out):
            shutil.rmtree(aside)
        if os.path.lexists(new):
            shutil.rmtree(new)
        for directory in reversed(out.parents):
            if not os.path.lexists(directory):
                os.mkdir(directory)
                created.append(directory)
        os.mkdir(new)
    except OSError as exc:
        _discard(new, created)
        return f"--out {cfg.out!r}: cannot write {exc.filename}: {exc.strerror}"
    return ""


def _discard(new: Path, created: list[Path]) -> None:
    """A run that stops leaves nothing: its directory, and those it made above --out."""
    shutil.rmtree(new, ignore_errors=True)
    for directory in reversed(created):
        with contextlib.suppress(OSError):  # not empty: someone else's now
            os.rmdir(directory)


def main(argv: list[str] | None = None) -> int:
    cfg = _options(argv)
    files, tokenizer, out = _checked(cfg)
    os.environ.setdefault(protocol.DEVICE_VAR, "cpu")  # text work: no accelerator to hold
    rt = runtime_dist.setup()
    started = time.perf_counter()
    dtype = dtype_for(tokenizer.vocab_size)
    new, _ = replacement_dirs(out)
    created: list[Path] = []  # rank 0's, above --out
    runtime_dist.refuse_if_main_says(
        rt, "tokenize", _prepare(out, cfg, created) if rt.is_main else ""
    )
    writers: dict[str, ShardWriter] = {}
    failed, mine = "", {}  # what stopped this rank, for every rank to stop on (none left waiting)
    try:
        for split in SPLITS:
            writers[split] = ShardWriter(new / shard_name(split, rt.rank), dtype)
        _tokenize(files, cfg, tokenizer, writers, rt.rank, rt.world_size)
        mine = {split: writer.close() for split, writer in writers.items()}
    except Exception as exc:  # noqa: BLE001 - any document, tokenizer or disk failure, said once
        for writer in writers.values():
            writer.abandon()
        if isinstance(exc, OutputError):
            failed = f"--out {cfg.out!r}: cannot write the dataset: {exc}"
        elif isinstance(exc, (TextError, UnicodeDecodeError)):
            failed = str(exc)
        else:
            failed = f"rank {rt.rank}: {type(exc).__name__}: {str(exc).partition(chr(10))[0]}"
    everyone: list[dict] = [{} for _ in range(rt.world_size)]
    dist.all_gather_object(everyone, {"error": failed, **mine})  # every rank's files closed
    stop = next((r["error"] for r in everyone if r["error"]), "")
    if not stop and not sum(r["train"]["tokens"] for r in everyone):
        stop = f"--input {cfg.input!r}: no documents to train on"
    if rt.is_main:
        if stop:
            _discard(new, created)
        else:
            stop = _finish(out, cfg, tokenizer, files, dtype, everyone, created)
    runtime_dist.refuse_if_main_says(rt, "tokenize", stop)
    if rt.is_main:
        tokens = sum(r[split]["tokens"] for r in everyone for split in SPLITS)
        print(
            f"[tokenize] {tokens} tokens from {len(files)} file(s) on {rt.world_size} rank(s) "
            f"in {time.perf_counter() - started:.1f}s -> {cfg.out}",
            flush=True,
        )
    dist.barrier()
    runtime_dist.teardown()
    return 0


def _tokenize(files, cfg: Config, tokenizer, writers: dict, rank: int, world: int) -> None:
    """This rank's documents (every world-th) into its train and validation shards."""
    said = time.monotonic()
    for index, text in enumerate(documents(files, cfg.text_field)):
        if index % world == rank:
            split = "val" if is_validation(index, cfg.val_fraction) else "train"
            writers[split].add(tokenizer.document(text))
            if time.monotonic() - said > PROGRESS_EVERY:  # the watchdog's sign of life
                said = time.monotonic()
                print(f"[tokenize] rank {rank}: {index + 1} documents read", flush=True)


def _finish(
    out: Path, cfg: Config, tokenizer, files, dtype: str, ranks: list[dict], created: list[Path]
) -> str:
    """Rank 0: the manifest beside the shards (empty ones dropped), then the dataset put in the
    place of --out. What went wrong (nothing left behind then), or ""."""
    new, aside = replacement_dirs(out)
    splits = {}
    try:
        for split in SPLITS:
            shards = []
            for rank, stats in enumerate(ranks):
                if stats[split]["tokens"]:
                    shards.append({"file": shard_name(split, rank), **stats[split]})
                else:
                    (new / shard_name(split, rank)).unlink()
            splits[split] = {
                "tokens": sum(s["tokens"] for s in shards),
                "documents": sum(s["documents"] for s in shards),
                "shards": shards,
            }
        manifest = {
            "format": FORMAT,
            "tokenizer": tokenizer.describe(),
            "dtype": dtype,
            "max_token_id": max(r[s]["max_id"] for r in ranks for s in SPLITS),
            "val_fraction": cfg.val_fraction,
            "ranks": len(ranks),
            "inputs": [str(f) for f in files],
            "text_field": cfg.text_field,
            "splits": splits,
        }
        with open(new / MANIFEST, "xb") as handle:
            handle.write(json.dumps(manifest, indent=1).encode())
            handle.flush()
            os.fsync(handle.fileno())
        _sync(new)
        _replace(out, new, aside)
    except OSError as exc:
        _discard(new, created)
        return f"--out {cfg.out!r}: cannot write the dataset: {exc.strerror}"
    try:  # the new dataset is in place: what is left is tidying, which the next run redoes
        _sync(out.parent)
        if os.path.lexists(aside):
            shutil.rmtree(aside)
    except OSError as exc:
        print(
            f"[tokenize] warning: the replaced dataset is left in {aside} ({exc.strerror}): "
            "the next tokenize removes it",
            file=sys.stderr,
            flush=True,
        )
    return ""


def _replace(out: Path, new: Path, aside: Path) -> None:
    """The complete dataset in `new` put at `out` by two renames, each atomic: `out` aside, then
    `new` in (a directory cannot be renamed over a full one). A run killed before the first
    leaves the old dataset at `out` (and `new`, which the next run removes); between the two, no
    `out` but the old dataset whole in `aside`, which the next run puts back
    (_restore_interrupted; the reader's message says so meanwhile); after the second, the new
    dataset at `out` (and `aside`, which the next run removes)."""
    replacing = os.path.lexists(out)
    if replacing:
        os.rename(out, aside)
    try:
        os.rename(new, out)
    except OSError:
        if replacing:
            os.rename(aside, out)
        raise


def _sync(directory: Path) -> None:
    """A directory's entries on disk (the renames and new files in it survive a crash)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


if __name__ == "__main__":
    runtime_dist.run_main(main)
