"""The package list in pyproject.toml names every package, so a non-editable install is whole."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "mmm_orch").rglob("__init__.py")}
    assert found == listed, f"missing from pyproject: {found - listed}; listed but absent: {listed - found}"


def test_the_suite_runs_from_a_clean_virtualenv():
    """CI installs the project into its own virtualenv (scripts/setup.sh) and runs the suite from
    there, never from the machine's own Python, so a dependency the project does not declare (as
    numpy once was) fails here as it would for a user."""
    import sys

    assert sys.prefix != sys.base_prefix, "run the tests with .venv/bin/python (scripts/test.sh)"
    config = (Path(sys.prefix) / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in config
    import numpy  # noqa: F401  (declared in the train extra; torch's collectives need it)
