"""A non-editable install is whole: every folder of mmm_orch that holds Python is a package that
pyproject.toml's package search finds."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_of_python_is_a_package_the_install_finds():
    """A folder of .py files without an __init__.py would be left out of the wheel, silently."""
    from setuptools import find_packages

    search = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    shipped = set(find_packages(str(ROOT), include=search["find"]["include"]))
    holding_python = {".".join(p.parent.relative_to(ROOT).parts)
                      for p in (ROOT / "mmm_orch").rglob("*.py") if "__pycache__" not in p.parts}
    assert holding_python == shipped, (
        f"not shipped: {holding_python - shipped}; shipped without Python: {shipped - holding_python}")


def test_the_suite_runs_from_a_clean_virtualenv():
    """CI installs the project into its own virtualenv (scripts/setup.sh) and runs the suite from
    there, never from the machine's own Python, so a dependency the project does not declare (as
    numpy once was) fails here as it would for a user."""
    import sys

    assert sys.prefix != sys.base_prefix, "run the tests with .venv/bin/python (scripts/test.sh)"
    config = (Path(sys.prefix) / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in config
    import numpy  # noqa: F401  (declared in the train extra; torch's collectives need it)
