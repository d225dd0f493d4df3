"""Failure signatures: a machine profile's own and the common ones (machines/common/failures.yaml),
and the JSON the in-job failover reads them from without pydantic (failures.json beside a
submitted job; `python -m mmm_orch.config.failures MACHINE` for a script from `mmm-orch render`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from mmm_orch.config.machine import FailureCatalog, FailureSignature
from mmm_orch.config.registry import load_machine
from mmm_orch.config.yamlio import load_yaml, validate
from mmm_orch.paths import search_dirs


def common_failures() -> list[FailureSignature]:
    path = next(
        d / "common" / "failures.yaml"
        for d in search_dirs("machines")
        if (d / "common" / "failures.yaml").is_file()
    )
    return validate(FailureCatalog, load_yaml(Path(path))).failures


def machine_failures(machine: str) -> list[FailureSignature]:
    """The machine's signatures first (the most specific), then the common ones."""
    return load_machine(machine).failures + common_failures()


def signatures_json(machine: str) -> str:
    return json.dumps([dataclasses.asdict(s) for s in machine_failures(machine)])


if __name__ == "__main__":
    print(signatures_json(sys.argv[1]))
