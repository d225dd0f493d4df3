"""Handing a model on: export."""

from __future__ import annotations

import argparse

from mmm_orch.cli import common
from mmm_orch.errors import MmmError

FORMATS = ("hf",)


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="a run's checkpoint as a Hugging Face model directory (config.json, "
        "safetensors, tokenizer) for transformers, vLLM, lm-eval",
    )
    p.add_argument("target", metavar="JOB|RUN_DIR", help="a job's id or a run directory")
    p.add_argument(
        "--to",
        nargs=2,
        required=True,
        metavar=("FORMAT", "OUT"),
        help="hf OUT: a new (or empty) Hugging Face model directory",
    )
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the latest)")
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        help="the tensors' type (default: as saved, fp32)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="the tokenizer's file or directory (default: the --init-from directory's, or "
        "the one the run's dataset was tokenized with)",
    )
    p.add_argument(
        "--shard-gib",
        type=float,
        default=5.0,
        metavar="GIB",
        help="the largest safetensors shard (default 5)",
    )
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from mmm_orch.usecases import exports

    kind, out = args.to
    if kind not in FORMATS:
        raise MmmError(f"--to {kind}: the formats are: {', '.join(FORMATS)}")
    if not 0 < args.shard_gib <= 1024:
        raise MmmError(f"--shard-gib {args.shard_gib}: more than 0 and at most 1024")
    job_id = args.target.isascii() and args.target.isdigit()  # "²" is no job's id
    db = common.jobs_db(args) if job_id else None
    print(
        exports.export(
            db,
            args.target,
            out,
            step=args.step,
            dtype=args.dtype,
            tokenizer=args.tokenizer,
            shard_bytes=int(args.shard_gib * (1 << 30)),
        )
    )
    return 0
