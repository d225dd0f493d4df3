"""The package list in pyproject.toml names every package, so a non-editable install is whole."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mmm_orch").rglob("__init__.py")}
    assert found == listed, f"missing from pyproject: {found - listed}; listed but absent: {listed - found}"
