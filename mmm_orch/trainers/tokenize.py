"""Tokenize a text corpus into a dataset the trainers read (runtime/dataset.py): run here as a
command, or submitted as the `tokenize` workload on any number of CPU ranks.

    python -m mmm_orch.trainers.tokenize --input corpus/ --tokenizer tokenizer.json --out data/c4

Document g of the corpus (in file order) is tokenized by rank g mod world, between BOS and EOS,
into that rank's train or validation shard: the validation split is a fixed fraction of the
documents, picked by a hash of g, so it does not depend on the number of ranks. Each rank writes
its shards under a temporary name; rank 0 renames them and writes manifest.json last, so a
directory with a manifest is a complete dataset.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mmm_orch.runtime.dataset import FORMAT, MANIFEST, SPLITS, dtype_for, shard_name
from mmm_orch.runtime.options import parse
from mmm_orch.runtime.text import TextError, documents, input_files, load_tokenizer


PROGRESS_EVERY = 60.0  # seconds between a rank's progress lines (workloads/tokenize.yaml)


@dataclass(frozen=True)
class Config:
    """Tokenize text into a mmm-orch token dataset (shards, manifest, validation split)."""

    input: str = field(default="", metadata={
        "help": "files or directories, comma-separated (.txt/.md: blank-line-separated "
                "documents; .jsonl: one per line; .parquet: one per row)"})
    tokenizer: str = field(default="", metadata={
        "help": "tokenizer.json, a tiktoken BPE file (Llama 3's tokenizer.model) or a "
                "SentencePiece model"})
    out: str = field(default="", metadata={"help": "the dataset directory to write"})
    text_field: str = field(default="text", metadata={"help": "the JSON field or Parquet column"})
    val_fraction: float = field(default=0.01, metadata={"help": "documents held out, 0-0.5"})
    eos_token: str = field(default="", metadata={"help": "a Hugging Face tokenizer's EOS token"})
    bos_token: str = field(default="", metadata={"help": "a Hugging Face tokenizer's BOS token"})
    overwrite: bool = field(default=False, metadata={"help": "replace a dataset already there"})


def is_validation(document: int, fraction: float) -> bool:
    """Whether document `document` is held out: Knuth's multiplicative hash spreads consecutive
    documents evenly over [0, 1)."""
    return (document * 2654435761 % 2**32) / 2**32 < fraction


class ShardWriter:
    """Token ids appended to one file, with their count, documents, largest id and SHA-256."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.code = path, "H" if dtype == "uint16" else "I"
        self.file = open(path, "wb")
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
        self.file.write(data)
        self.digest.update(data)
        self.tokens += len(self.buffer)
        self.buffer = array.array(self.code)

    def close(self) -> dict:
        self._flush()
        self.file.close()
        return {"tokens": self.tokens, "documents": self.documents, "max_id": self.max_id,
                "sha256": self.digest.hexdigest()}


def _refuse(message: str) -> None:
    print(f"[tokenize] error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _checked(cfg: Config):
    """The input files, the tokenizer and the output directory, or exit 2 naming what is wrong
    (before anything is written)."""
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
    out = Path(cfg.out)
    if (out / MANIFEST).exists() and not cfg.overwrite:
        _refuse(f"--out {cfg.out!r} already holds a dataset: pass --overwrite to replace it")
    if out.exists() and not out.is_dir():
        _refuse(f"--out {cfg.out!r} is a file, not a directory")
    return files, tokenizer, out


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv)
    files, tokenizer, out = _checked(cfg)
    import torch.distributed as dist

    from mmm_orch.runtime import dist as runtime_dist

    os.environ.setdefault("MMM_DEVICE", "cpu")  # text work: no accelerator to hold
    rt = runtime_dist.setup()
    started = time.perf_counter()
    dtype = dtype_for(tokenizer.vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    if rt.is_main:
        (out / MANIFEST).unlink(missing_ok=True)  # --overwrite: incomplete until written again
    writers = {split: ShardWriter(out / f".{shard_name(split, rt.rank)}.partial", dtype)
               for split in SPLITS}
    failed = ""  # what stopped this rank, for every rank to stop on (no rank left waiting)
    try:
        _tokenize(files, cfg, tokenizer, writers, rt.rank, rt.world_size)
    except Exception as exc:  # noqa: BLE001 - any document or tokenizer failure, said once
        failed = f"{exc}" if isinstance(exc, (TextError, UnicodeDecodeError)) else \
            f"rank {rt.rank}: {type(exc).__name__}: {exc}"
    mine = {"error": failed, **{split: writer.close() for split, writer in writers.items()}}
    everyone: list[dict] = [{} for _ in range(rt.world_size)]
    dist.all_gather_object(everyone, mine)
    stop = next((r["error"] for r in everyone if r["error"]), "")
    if not stop and not sum(r["train"]["tokens"] for r in everyone):
        stop = f"--input {cfg.input!r}: no documents to train on"
    if stop:  # every rank knows: every rank stops, leaving no shard behind
        for split in SPLITS:
            (out / f".{shard_name(split, rt.rank)}.partial").unlink(missing_ok=True)
        runtime_dist.refuse(rt, "tokenize", stop)
    if rt.is_main:
        _finish(out, cfg, tokenizer, files, dtype, everyone)
        tokens = sum(r[split]["tokens"] for r in everyone for split in SPLITS)
        print(f"[tokenize] {tokens} tokens from {len(files)} file(s) on {rt.world_size} rank(s) "
              f"in {time.perf_counter() - started:.1f}s -> {out}", flush=True)
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


def _finish(out: Path, cfg: Config, tokenizer, files, dtype: str, ranks: list[dict]) -> None:
    """Shards renamed into place (empty ones dropped), stale shards of an earlier dataset
    removed, then the manifest."""
    splits = {}
    for split in SPLITS:
        shards = []
        for rank, stats in enumerate(ranks):
            partial = out / f".{shard_name(split, rank)}.partial"
            if stats[split]["tokens"]:
                partial.replace(out / shard_name(split, rank))
                shards.append({"file": shard_name(split, rank), **stats[split]})
            else:
                partial.unlink()
        splits[split] = {"tokens": sum(s["tokens"] for s in shards),
                         "documents": sum(s["documents"] for s in shards), "shards": shards}
    kept = {s["file"] for split in splits.values() for s in split["shards"]}
    for stale in out.glob("*-*.bin"):
        if stale.name not in kept and stale.name.split("-")[0] in SPLITS:
            stale.unlink()
    manifest = {"format": FORMAT, "tokenizer": tokenizer.describe(), "dtype": dtype,
                "max_token_id": max(r[s]["max_id"] for r in ranks for s in SPLITS),
                "val_fraction": cfg.val_fraction, "ranks": len(ranks),
                "inputs": [str(f) for f in files], "text_field": cfg.text_field,
                "splits": splits}
    temporary = out / f".{MANIFEST}.partial"
    temporary.write_text(json.dumps(manifest, indent=1))
    temporary.replace(out / MANIFEST)


if __name__ == "__main__":
    from mmm_orch.runtime.dist import run_main

    run_main(main)
