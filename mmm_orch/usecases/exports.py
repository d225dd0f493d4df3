"""Handing a model on: a run's checkpoint exported as a Hugging Face model directory
(pretrained/export.py), the run named by its job or its directory."""

from __future__ import annotations

from typing import Any

from mmm_orch.errors import MmmError
from mmm_orch.records.db import JobDB
from mmm_orch.usecases.following import run_dir


def export(db: JobDB | None, target: str, out: str, **options: Any) -> str:
    """Export the run `target` names to `out`; what was written, in a line. Options: those of
    pretrained.export.export (step, dtype, tokenizer, shard_bytes)."""
    where = run_dir(db, target)
    from mmm_orch.errors import PretrainedError
    from mmm_orch.pretrained import export as exporting  # torch: only this command

    try:
        return exporting.describe(exporting.export(where, out, **options))
    except (exporting.ExportError, PretrainedError) as exc:
        raise MmmError(str(exc)) from None
